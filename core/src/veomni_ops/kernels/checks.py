"""Input checks for kernel authors: the core's kernels and every backend's adapters use them.

Public API (backend authors: import these in your HEAVY ``kernels`` modules, never in
``specs.py``, since this module imports torch). They look at shapes, dtypes and devices
only, never at values, so they cost no device-to-host synchronisation and trace under
``torch.compile`` -- except :func:`check_index_range` and :func:`value_range`, which say so.

Every error names the op and, where given, the backend, so one message tells the user
which kernel refused what: ``op`` is the contract's op name (e.g. ``"moe_experts"``) and
``backend`` a short tag shown after it (``backend="liger"`` -> ``"moe_experts (liger): ..."``;
``None``, the core's own kernels -> ``"moe_experts: ..."``). Each message says what is
wrong and how to fix it.

* :func:`check_tensor` -- a ``torch.Tensor`` at all;
* :func:`check_float` -- a float dtype among ``dtypes`` (default: float32/bfloat16/float16/float64);
* :func:`check_kernel_dtype` -- a dtype the backend's kernels take (default: no float64),
  pointing float64 users to the ``eager`` kernel;
* :func:`check_integer` -- an integer tensor (indices, labels);
* :func:`check_same_device`, :func:`check_same_dtype` -- several tensors agree;
* :func:`check_ndim` -- the number of dimensions, naming the expected layout;
* :func:`check_index_range` -- every index in ``[lower, upper)`` (synchronises with the host).

Value checks (indices, labels) read device memory on the host. The policy every kernel
follows, so that a bad index is an error without costing a hot-path synchronisation:

* a kernel whose work synchronises anyway (the eager MoE loop, Liger's and Quack's
  adapters) checks always, with :func:`check_index_range` (one reduction, one sync);
* any other kernel asks :func:`can_read_values`: true for CPU tensors (nothing to wait for)
  and, on accelerators, only when value checks are switched on -- environment variable
  ``VEOMNI_OPS_CHECK_VALUES=1`` (read at import) or :func:`set_value_checks` /
  :func:`value_checks` -- the debugging mode: one reduction and one host synchronisation
  per call. Never while ``torch.compile`` traces (a data-dependent branch breaks the graph).

What a kernel does when it cannot read the values is its op contract's business
(:mod:`veomni_ops.hookspecs`): e.g. ``moe_experts`` kernels assert on the device
(:func:`device_assert`), cross-entropy kernels leave it to PyTorch's own device-side asserts.

Op-level contract checks, built from these; each takes ``backend`` and a narrower
``float_check`` (and ``integer_check``) for a backend's own dtypes or device:

* :func:`check_rms_norm_inputs` -- ``rms_norm``: hidden states ``[..., H]``, weight ``[H]``, ``eps``;
* :func:`check_labels`, :func:`check_label_values` -- ``cross_entropy`` labels ``[N]`` and their range;
* :func:`check_linear_cross_entropy_inputs` -- the ``fused_linear`` variant of ``cross_entropy``;
* :func:`check_swiglu_inputs` -- ``swiglu``: ``gate`` and ``up`` of one shape, dtype and device;
* :func:`check_eps` -- a non-negative Python float;
* next to their reference kernels: :func:`veomni_ops.kernels.rotary.check_rotary_inputs`,
  :func:`veomni_ops.kernels.moe.check_moe_inputs`, :func:`veomni_ops.kernels.moe.check_expert_index`.

A backend binds them once, in its ``kernels/_common.py``, to its tag, the dtypes its kernels
take and the device types they run on (:class:`BackendChecks`), and its adapters call
``CHECKS.check_float(x, "x", op)``, ``CHECKS.check_rms_norm_inputs(...)``, ...: the messages
are the core's, ``"op (backend): ..."``, the same in every backend.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

__all__ = [
    "FLOAT_DTYPES",
    "BackendChecks",
    "KERNEL_DTYPES",
    "VALUE_CHECKS_ENV",
    "can_read_values",
    "check_eps",
    "check_float",
    "check_index_range",
    "check_integer",
    "check_kernel_dtype",
    "check_label_values",
    "check_labels",
    "check_linear_cross_entropy_inputs",
    "check_ndim",
    "check_rms_norm_inputs",
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

#: Float dtypes the contracts allow (the core's eager reference takes all of them).
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
#: What most fused kernels (Triton, vendor libraries) take: no float64.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def where(op: str, backend: str | None = None) -> str:
    """The prefix of every message: ``"op"`` or ``"op (backend)"``."""
    return f"{op} ({backend})" if backend else op


def _dtype_names(dtypes: tuple[torch.dtype, ...], last: str) -> str:
    names = [str(d).removeprefix("torch.") for d in dtypes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])}{last}{names[-1]}"


def check_tensor(x: object, name: str, op: str, *, backend: str | None = None) -> torch.Tensor:
    """``x`` is a ``torch.Tensor`` (returned, for typing)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where(op, backend)}: {name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(
    x: torch.Tensor,
    name: str,
    op: str,
    *,
    backend: str | None = None,
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
) -> None:
    """``x`` is a tensor whose dtype is one of ``dtypes``."""
    check_tensor(x, name, op, backend=backend)
    if x.dtype not in dtypes:
        raise TypeError(
            f"{where(op, backend)}: {name} has dtype {x.dtype}; it must be one of {_dtype_names(dtypes, ', ')} "
            f"(cast it, e.g. {name}.to(torch.bfloat16))"
        )


def check_kernel_dtype(
    x: torch.Tensor,
    name: str,
    op: str,
    *,
    backend: str | None,
    kernels: str,
    dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES,
) -> None:
    """``x`` is a tensor of a dtype that ``kernels`` (e.g. ``"Liger's kernels"``) take.

    Unlike :func:`check_float` the message names whose kernels refuse and, where float64
    is not among ``dtypes``, points to the ``eager`` kernel, which takes it.
    """
    check_tensor(x, name, op, backend=backend)
    if x.dtype not in dtypes:
        eager = ", or use the 'eager' kernel for float64" if torch.float64 not in dtypes else ""
        raise TypeError(
            f"{where(op, backend)}: {name} has dtype {x.dtype}; {kernels} take {_dtype_names(dtypes, ' or ')} "
            f"(cast it, e.g. {name}.to(torch.bfloat16){eager})"
        )


def check_integer(x: torch.Tensor, name: str, op: str, *, backend: str | None = None) -> None:
    """``x`` is a tensor of an integer dtype (not bool)."""
    check_tensor(x, name, op, backend=backend)
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(
            f"{where(op, backend)}: {name} has dtype {x.dtype}; it must be an integer tensor (use {name}.long())"
        )


def check_same_device(op: str, *, backend: str | None = None, **tensors: torch.Tensor | None) -> None:
    """All given tensors (``None`` skipped) are on one device. Pass them by name."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"{where(op, backend)}: inputs are on different devices ({listing}); move them to one device")


def check_same_dtype(op: str, *, backend: str | None = None, **tensors: torch.Tensor | None) -> None:
    """All given tensors (``None`` skipped) have one dtype. Pass them by name."""
    dtypes = {name: t.dtype for name, t in tensors.items() if t is not None}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{n} {d}" for n, d in dtypes.items())
        raise TypeError(f"{where(op, backend)}: inputs have different dtypes ({listing}); cast them to one dtype")


def check_ndim(x: torch.Tensor, ndim: int, name: str, op: str, layout: str, *, backend: str | None = None) -> None:
    """``x`` has ``ndim`` dimensions; ``layout`` (e.g. ``"[T, H]"``) says which."""
    if x.dim() != ndim:
        raise ValueError(f"{where(op, backend)}: {name} must be {ndim}-D {layout}, got shape {tuple(x.shape)}")


#: ``1`` (or true/yes/on): kernels that promise no host synchronisation check index and label
#: values on accelerators too, at one reduction and one synchronisation a call (debugging).
VALUE_CHECKS_ENV = "VEOMNI_OPS_CHECK_VALUES"

_value_checks = os.environ.get(VALUE_CHECKS_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def value_checks_on() -> bool:
    """Whether value checks are switched on for accelerators (``VEOMNI_OPS_CHECK_VALUES``)."""
    return _value_checks


def set_value_checks(enabled: bool) -> bool:
    """Switch value checks on accelerators on or off; returns the previous setting."""
    global _value_checks
    before, _value_checks = _value_checks, bool(enabled)
    return before


@contextlib.contextmanager
def value_checks(enabled: bool = True) -> Iterator[None]:
    """``with value_checks():`` -- value checks on accelerators on (or off) inside the block."""
    before = set_value_checks(enabled)
    try:
        yield
    finally:
        set_value_checks(before)


def can_read_values(x: torch.Tensor) -> bool:
    """Whether a kernel that promises no host synchronisation may read ``x``'s values now.

    Never while ``torch.compile`` traces; always for CPU tensors (there is no device to wait
    for); on an accelerator only when value checks are on (:func:`value_checks_on`).
    """
    if torch.compiler.is_compiling():
        return False
    return x.device.type == "cpu" or _value_checks


def value_range(x: torch.Tensor, *, ignore: int | None = None, fill: int = 0) -> tuple[int, int] | None:
    """``(min, max)`` of ``x`` as Python ints, entries equal to ``ignore`` counted as ``fill``;
    ``None`` when ``x`` is empty. One reduction (``aminmax``) and one host synchronisation."""
    if x.numel() == 0:
        return None
    if ignore is not None:
        x = torch.where(x == ignore, torch.full((), fill, dtype=x.dtype, device=x.device), x)
    lo, hi = torch.aminmax(x)
    return int(lo), int(hi)


def device_assert(ok: torch.Tensor, message: str) -> None:
    """Assert the boolean scalar ``ok`` on the device, without a host synchronisation.

    ``torch._assert_async``: on CUDA a failure is a device-side assertion (the process must
    be restarted; CUDA's message does not carry ours, rerun with ``VEOMNI_OPS_CHECK_VALUES=1``
    for it); on the CPU it raises ``RuntimeError(message)`` at once. Traces under
    ``torch.compile``.
    """
    torch._assert_async(ok, message)


def check_index_range(
    x: torch.Tensor,
    upper: int,
    name: str,
    op: str,
    what: str,
    *,
    ignore: int | None = None,
    lower: int = 0,
    backend: str | None = None,
    consequence: str = "the kernel would read out of bounds",
) -> None:
    """Every entry of ``x`` (except ``ignore``) lies in ``[lower, upper)``; ``what`` says what ``upper`` is.

    The message names the op, the tensor and an offending value (the smallest one below the
    range, else the largest above it). One reduction and one host synchronisation
    (:func:`value_range`): it does not suit a kernel that promises none -- such a kernel
    calls it only when :func:`can_read_values` says so.
    """
    got = value_range(x, ignore=ignore, fill=lower)
    if got is None:
        return
    lo, hi = got
    if lo >= lower and hi < upper:
        return
    first = lo if lo < lower else hi
    extra = f" other than ignore_index={ignore}" if ignore is not None else ""
    raise ValueError(
        f"{where(op, backend)}: {name} holds {first}, outside [{lower}, {upper}) ({what}); every entry{extra} must be "
        f"in range -- {consequence}"
    )


#: A dtype (or device) check as the op-level checks call it: ``(x, name, op)``.
TensorCheck = Callable[[torch.Tensor, str, str], None]


def check_eps(eps: object, op: str, *, backend: str | None = None) -> float:
    """``eps`` is a non-negative Python number (not a tensor, not a bool); returned as a float."""
    if isinstance(eps, (torch.Tensor, bool)) or not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"{where(op, backend)}: eps must be a non-negative Python float, got {eps!r}")
    return float(eps)


def check_rms_norm_inputs(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    backend: str | None = None,
    float_check: TensorCheck | None = None,
) -> float:
    """Check the ``rms_norm`` contract's inputs: ``hidden_states [..., H]``, ``weight [H]``, ``eps``.

    Dtypes by ``float_check`` (default :func:`check_float`), one device, the shapes, then
    ``eps`` (:func:`check_eps`, whose float is returned). Shapes only: no host synchronisation.
    """
    op = "rms_norm"
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    float_check(hidden_states, "hidden_states", op)
    float_check(weight, "weight", op)
    check_same_device(op, backend=backend, hidden_states=hidden_states, weight=weight)
    if hidden_states.dim() < 1:
        raise ValueError(f"{where(op, backend)}: hidden_states must have at least one dimension [..., H], got a scalar")
    h = hidden_states.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != h:
        raise ValueError(
            f"{where(op, backend)}: weight must have shape [H] = [{h}] (the last dimension of hidden_states "
            f"{tuple(hidden_states.shape)}), got {tuple(weight.shape)}"
        )
    return check_eps(eps, op, backend=backend)


def check_swiglu_inputs(
    gate: torch.Tensor, up: torch.Tensor, *, backend: str | None = None, float_check: TensorCheck | None = None
) -> None:
    """Check the ``swiglu`` contract's inputs: ``gate`` and ``up`` ``[..., I]`` of one shape, dtype and device."""
    op = "swiglu"
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    float_check(gate, "gate", op)
    float_check(up, "up", op)
    check_same_device(op, backend=backend, gate=gate, up=up)
    check_same_dtype(op, backend=backend, gate=gate, up=up)
    if gate.shape != up.shape:
        raise ValueError(
            f"{where(op, backend)}: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have the same shape [..., I]"
        )


def check_labels(
    labels: torch.Tensor,
    n: int,
    ignore_index: int,
    *,
    backend: str | None = None,
    integer_check: TensorCheck | None = None,
) -> None:
    """``cross_entropy`` labels: an integer tensor ``[N]`` with ``N = n`` tokens, and a Python int ``ignore_index``.

    Shapes only; the range of the values is :func:`check_label_values`.
    """
    op = "cross_entropy"
    if integer_check is None:
        integer_check = partial(check_integer, backend=backend)
    integer_check(labels, "labels", op)
    check_ndim(labels, 1, "labels", op, "[N] (flatten it and shift it first)", backend=backend)
    if labels.shape[0] != n:
        raise ValueError(
            f"{where(op, backend)}: labels has {labels.shape[0]} entries but there are {n} tokens; they must match"
        )
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"{where(op, backend)}: ignore_index must be a Python int, got {ignore_index!r}")


def check_label_values(
    labels: torch.Tensor,
    vocab_size: int,
    ignore_index: int,
    *,
    backend: str | None = None,
    always: bool = False,
    consequence: str = "the loss would index outside the logits",
) -> None:
    """Every label in ``[0, V)`` or equal to ``ignore_index``, else ``ValueError`` naming the op and the label.

    One reduction (``aminmax``) and one host synchronisation. Runs when ``always`` (a kernel
    that synchronises anyway) or when :func:`can_read_values` allows (CPU tensors;
    ``VEOMNI_OPS_CHECK_VALUES=1``); otherwise returns without reading anything.
    """
    if always or can_read_values(labels):
        check_index_range(labels, vocab_size, "labels", "cross_entropy", f"the vocabulary size V = {vocab_size}",
                          ignore=ignore_index, backend=backend, consequence=consequence)


def check_chunk_size(chunk_size: object, *, backend: str | None = None) -> None:
    """A chunked ``cross_entropy`` kernel's ``chunk_size`` (tokens per chunk): a positive int."""
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"{where('cross_entropy', backend)}: chunk_size must be a positive int, got {chunk_size!r}")


def check_linear_cross_entropy_inputs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    *,
    backend: str | None = None,
    float_check: TensorCheck | None = None,
    integer_check: TensorCheck | None = None,
    always: bool = False,
    consequence: str = "the loss would index outside the logits",
) -> None:
    """Check the ``fused_linear`` variant of ``cross_entropy``: ``hidden [N, H]``, ``weight [V, H]``,
    ``bias [V]`` or ``None``, ``labels [N]`` (:func:`check_labels`), one dtype, one device, and the
    label values (:func:`check_label_values`, with ``always`` and ``consequence``)."""
    op = "cross_entropy"
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    float_check(hidden, "hidden", op)
    float_check(weight, "weight", op)
    check_ndim(hidden, 2, "hidden", op, "[N, H] (flatten leading dimensions with .view(-1, H))", backend=backend)
    check_ndim(weight, 2, "weight", op, "[V, H] (the lm_head weight)", backend=backend)
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"{where(op, backend)}: weight {tuple(weight.shape)} must be [V, H] with H = hidden.shape[1] = "
            f"{hidden.shape[1]}"
        )
    if bias is not None:
        float_check(bias, "bias", op)
        if bias.dim() != 1 or bias.shape[0] != weight.shape[0]:
            raise ValueError(
                f"{where(op, backend)}: bias must have shape [V] = [{weight.shape[0]}], got {tuple(bias.shape)}"
            )
    check_same_dtype(op, backend=backend, hidden=hidden, weight=weight, bias=bias)
    check_labels(labels, hidden.shape[0], ignore_index, backend=backend, integer_check=integer_check)
    check_same_device(op, backend=backend, hidden=hidden, weight=weight, labels=labels, bias=bias)
    check_label_values(labels, weight.shape[0], ignore_index, backend=backend, always=always, consequence=consequence)


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
        """:func:`veomni_ops.kernels.rotary.check_rotary_inputs` with this backend's dtypes; returns R."""
        from .rotary import check_rotary_inputs

        return check_rotary_inputs(q, k, cos, sin, backend=self.backend, float_check=self.check_float)

    def check_moe_inputs(
        self,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        gate_up_proj: torch.Tensor,
        down_proj: torch.Tensor,
    ) -> tuple[int, int, int, int, int]:
        """:func:`veomni_ops.kernels.moe.check_moe_inputs` with this backend's dtypes; returns ``(T, H, E, I, K)``."""
        from .moe import check_moe_inputs

        return check_moe_inputs(
            hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj,
            backend=self.backend, float_check=self.check_float, integer_check=self.check_integer,
        )

    def check_expert_index(self, top_k_index: torch.Tensor, num_experts: int, *, always: bool = False) -> None:
        """:func:`veomni_ops.kernels.moe.check_expert_index`, tagged with this backend."""
        from .moe import check_expert_index

        check_expert_index(top_k_index, num_experts, backend=self.backend, always=always)
