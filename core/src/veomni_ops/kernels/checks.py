"""Input checks for kernel authors: the core's kernels and every backend's adapters use them.

This module is their public face: it re-exports the op-agnostic checks and the value-check
policy (defined in :mod:`veomni_ops.kernels.tensor_checks`) and every op's own checks (defined
in its folder, ``veomni_ops/ops/<op>/checks.py``), and defines :class:`BackendChecks`, which
binds them all to one backend. Import them from here (backend authors: in your HEAVY
``kernels`` modules, never in ``specs.py``, since this module imports torch). They look at
shapes, dtypes and devices only, never at values, so they cost no device-to-host
synchronisation and trace under ``torch.compile`` -- except :func:`check_index_range` and
:func:`value_range`, which say so.

Every error names the op and, where given, the backend, so one message tells the user
which kernel refused what: ``op`` is the contract's op name (e.g. ``"moe_experts"``) and
``backend`` a short tag shown after it (``backend="liger"`` -> ``"moe_experts (liger): ..."``;
``None``, the core's own kernels -> ``"moe_experts: ..."``). Each message says what is
wrong and how to fix it.

Op-agnostic (:mod:`.tensor_checks`, which also states the value-check policy:
:func:`can_read_values`, ``VEOMNI_OPS_CHECK_VALUES``, :func:`value_checks`, :func:`device_assert`):
:func:`check_tensor`, :func:`check_float`, :func:`check_kernel_dtype`, :func:`check_integer`,
:func:`check_same_device`, :func:`check_same_dtype`, :func:`check_ndim`, :func:`check_eps`,
:func:`check_index_range`. Switch value checks with :func:`set_value_checks` or
:func:`value_checks` (the one switch, in :mod:`.tensor_checks`): the names here are re-exports,
so replacing one in this module (a test's ``monkeypatch``) changes nothing for the op checks,
which call their own module's names.

Op-level contract checks, built from these; each takes ``backend`` and a narrower
``float_check`` (and ``integer_check``) for a backend's own dtypes or device:

* :func:`check_rms_norm_inputs` -- ``rms_norm`` (``ops/rms_norm/checks.py``): hidden states ``[..., H]``,
  weight ``[H]``, ``eps``;
* :func:`check_labels`, :func:`check_label_values`, :func:`check_chunk_size`,
  :func:`check_linear_cross_entropy_inputs` -- ``cross_entropy`` (``ops/cross_entropy/checks.py``):
  labels ``[N]`` and their range, a chunk size, the ``fused_linear`` variant;
* :func:`check_swiglu_inputs` -- ``swiglu`` (``ops/swiglu/checks.py``): ``gate`` and ``up`` of one shape,
  dtype and device;
* :func:`check_rotary_inputs` -- ``rotary`` (``ops/rotary/checks.py``): ``q``, ``k`` ``[B, H, S, D]``,
  ``cos``/``sin`` ``[B, S, R]``;
* :func:`check_moe_inputs`, :func:`check_expert_index` -- ``moe_experts`` (``ops/moe_experts/checks.py``):
  the shapes, and the expert-index rule (``-1``, :data:`NO_EXPERT`, and ``E`` route nowhere);
* :func:`check_moe_router_inputs` -- ``moe_router`` (``ops/moe_router/checks.py``): logits ``[T, E]``,
  ``top_k`` in ``[1, E]`` and a kernel's own limits, ``normalize``. The
  rotary and MoE reference kernels' modules re-export them (``veomni_ops.kernels.rotary.check_rotary_inputs``,
  ``veomni_ops.kernels.moe.check_moe_inputs``, ...). No op's checks import a kernel module.

A backend binds them once, in its ``kernels/_common.py``, to its tag, the dtypes its kernels
take and the device types they run on (:class:`BackendChecks`), and its adapters call
``CHECKS.check_float(x, "x", op)``, ``CHECKS.check_rms_norm_inputs(...)``, ...: the messages
are the core's, ``"op (backend): ..."``, the same in every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..ops.cross_entropy.checks import (
    check_chunk_size,
    check_label_values,
    check_labels,
    check_linear_cross_entropy_inputs,
)
from ..ops.moe_experts.checks import NO_EXPERT, check_expert_index, check_moe_inputs
from ..ops.moe_router.checks import check_moe_router_inputs
from ..ops.residual_rms_norm.checks import check_residual_rms_norm_inputs
from ..ops.rms_norm.checks import check_rms_norm_inputs
from ..ops.rotary.checks import check_rotary_inputs
from ..ops.swiglu.checks import check_swiglu_inputs
from .tensor_checks import (
    FLOAT_DTYPES,
    KERNEL_DTYPES,
    VALUE_CHECKS_ENV,
    TensorCheck,
    can_read_values,
    check_eps,
    check_float,
    check_index_range,
    check_integer,
    check_kernel_dtype,
    check_ndim,
    check_same_device,
    check_same_dtype,
    check_tensor,
    device_assert,
    set_value_checks,
    value_checks,
    value_checks_on,
    value_range,
    where,
)

__all__ = [
    "FLOAT_DTYPES",
    "BackendChecks",
    "KERNEL_DTYPES",
    "NO_EXPERT",
    "TensorCheck",
    "VALUE_CHECKS_ENV",
    "can_read_values",
    "check_chunk_size",
    "check_eps",
    "check_expert_index",
    "check_float",
    "check_index_range",
    "check_integer",
    "check_kernel_dtype",
    "check_label_values",
    "check_labels",
    "check_linear_cross_entropy_inputs",
    "check_moe_inputs",
    "check_moe_router_inputs",
    "check_ndim",
    "check_residual_rms_norm_inputs",
    "check_rms_norm_inputs",
    "check_rotary_inputs",
    "check_swiglu_inputs",
    "check_same_device",
    "check_same_dtype",
    "check_tensor",
    "device_assert",
    "set_value_checks",
    "value_checks",
    "value_checks_on",
    "value_range",
    "where",
]


@dataclass
class BackendChecks:
    """The checks above, bound once to a backend: its tag, its kernels' dtypes and devices.

    A backend makes one in its ``kernels/_common.py`` and its adapters call its methods, which
    are the module's functions without the ``backend`` argument::

        CHECKS = BackendChecks("liger", kernels="Liger's kernels")
        CHECKS.check_float(x, "x", "swiglu")        # "swiglu (liger): x has dtype torch.float64; Liger's ..."

    Fields: ``backend``, the tag in every message; ``kernels``, whose kernels refuse a dtype
    (:func:`check_kernel_dtype`); ``dtypes``, what they take (default :data:`KERNEL_DTYPES`:
    no float64); ``device_types``, when set, the device types every tensor must be on, and
    ``runs_on``, what the message says they are (e.g. ``"a CUDA GPU (sm 9.0+)"``); ``consequence``,
    what an out-of-range index would do (:func:`check_index_range`). Not frozen, so that a test
    can widen ``device_types`` to run the adapters on the CPU.
    """

    backend: str
    kernels: str
    dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES
    device_types: tuple[str, ...] | None = None
    runs_on: str = ""
    consequence: str = "the kernel would read out of bounds"

    def check_tensor(self, x: object, name: str, op: str) -> torch.Tensor:
        """:func:`check_tensor`, and on one of ``device_types`` when those are set."""
        t = check_tensor(x, name, op, backend=self.backend)
        if self.device_types is not None and t.device.type not in self.device_types:
            raise ValueError(
                f"{where(op, self.backend)}: {name} is on {t.device}, but {self.kernels} take tensors on "
                f"{self.runs_on or '/'.join(self.device_types)} only (move the model and inputs there, e.g. "
                f".to({self.device_types[0]!r})), or choose a kernel for {t.device.type}"
            )
        return t

    def check_float(self, x: torch.Tensor, name: str, op: str) -> None:
        """A tensor of a dtype the kernels take (:func:`check_kernel_dtype`)."""
        self.check_tensor(x, name, op)
        check_kernel_dtype(x, name, op, backend=self.backend, kernels=self.kernels, dtypes=self.dtypes)

    def check_integer(self, x: torch.Tensor, name: str, op: str) -> None:
        self.check_tensor(x, name, op)
        check_integer(x, name, op, backend=self.backend)

    def check_same_device(self, op: str, **tensors: torch.Tensor | None) -> None:
        check_same_device(op, backend=self.backend, **tensors)

    def check_same_dtype(self, op: str, **tensors: torch.Tensor | None) -> None:
        check_same_dtype(op, backend=self.backend, **tensors)

    def check_ndim(self, x: torch.Tensor, ndim: int, name: str, op: str, layout: str) -> None:
        check_ndim(x, ndim, name, op, layout, backend=self.backend)

    def check_index_range(self, x: torch.Tensor, upper: int, name: str, op: str, what: str, **kw: Any) -> None:
        """:func:`check_index_range`, always (one synchronisation), with this backend's ``consequence``."""
        kw.setdefault("consequence", self.consequence)
        check_index_range(x, upper, name, op, what, backend=self.backend, **kw)

    def check_eps(self, eps: object, op: str) -> float:
        return check_eps(eps, op, backend=self.backend)

    def check_rms_norm_inputs(self, hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> float:
        return check_rms_norm_inputs(hidden_states, weight, eps, backend=self.backend, float_check=self.check_float)

    def check_residual_rms_norm_inputs(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                       eps: float) -> float:
        return check_residual_rms_norm_inputs(x, residual, weight, eps, backend=self.backend,
                                              float_check=self.check_float)

    def check_swiglu_inputs(self, gate: torch.Tensor, up: torch.Tensor) -> None:
        check_swiglu_inputs(gate, up, backend=self.backend, float_check=self.check_float)

    def check_labels(self, labels: torch.Tensor, n: int, ignore_index: int) -> None:
        check_labels(labels, n, ignore_index, backend=self.backend, integer_check=self.check_integer)

    def check_label_values(self, labels: torch.Tensor, vocab_size: int, ignore_index: int) -> None:
        """:func:`check_label_values`, always (for kernels that synchronise anyway)."""
        check_label_values(labels, vocab_size, ignore_index, backend=self.backend, always=True,
                           consequence=self.consequence)

    def check_linear_cross_entropy_inputs(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        bias: torch.Tensor | None,
        ignore_index: int,
        *,
        always: bool = True,
    ) -> None:
        check_linear_cross_entropy_inputs(
            hidden, weight, labels, bias, ignore_index, backend=self.backend, float_check=self.check_float,
            integer_check=self.check_integer, always=always, consequence=self.consequence,
        )

    def check_rotary_inputs(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> int:
        """:func:`check_rotary_inputs` with this backend's dtypes; returns R."""
        return check_rotary_inputs(q, k, cos, sin, backend=self.backend, float_check=self.check_float)

    def check_moe_router_inputs(self, logits: torch.Tensor, top_k: int, normalize: bool, *,
                                max_experts: int | None = None, max_top_k: int | None = None) -> tuple[int, int]:
        """:func:`check_moe_router_inputs` with this backend's dtypes and its kernel's limits; returns ``(T, E)``."""
        return check_moe_router_inputs(logits, top_k, normalize, backend=self.backend, float_check=self.check_float,
                                       max_experts=max_experts, max_top_k=max_top_k)

    def check_moe_inputs(
        self,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        gate_up_proj: torch.Tensor,
        down_proj: torch.Tensor,
    ) -> tuple[int, int, int, int, int]:
        """:func:`check_moe_inputs` with this backend's dtypes; returns ``(T, H, E, I, K)``."""
        return check_moe_inputs(
            hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj,
            backend=self.backend, float_check=self.check_float, integer_check=self.check_integer,
        )

    def check_expert_index(self, top_k_index: torch.Tensor, num_experts: int, *, always: bool = False) -> None:
        """:func:`check_expert_index`, tagged with this backend."""
        check_expert_index(top_k_index, num_experts, backend=self.backend, always=always)
