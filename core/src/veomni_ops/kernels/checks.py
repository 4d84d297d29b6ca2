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
* :func:`check_rotary_inputs` -- ``rotary``: ``q``, ``k`` ``[B, H, S, D]``, ``cos``/``sin`` ``[B, S, R]``;
* :func:`check_moe_inputs`, :func:`check_expert_index` -- ``moe_experts``: the shapes, and the
  expert-index rule (``-1``, :data:`NO_EXPERT`, and ``E`` route nowhere). The rotary and MoE
  reference kernels' modules re-export them (``veomni_ops.kernels.rotary.check_rotary_inputs``,
  ``veomni_ops.kernels.moe.check_moe_inputs``, ...); they are defined here so that this module
  imports no kernel module.

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


_ROTARY = "rotary"
_MOE = "moe_experts"


def check_rotary_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    backend: str | None = None,
    float_check: TensorCheck | None = None,
) -> int:
    """Check the ``rotary`` contract's inputs; return the rotary dim R.

    Public, for backend authors: call it first in an adapter, then check only what the
    backend adds. ``float_check`` (default :func:`check_float`,
    called as ``(x, name, op)``) narrows the dtypes or requires a device type; ``backend``
    tags every message (``"rotary (liger): ..."``). Shapes only: no host synchronisation.
    """
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    op = where(_ROTARY, backend)
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        float_check(t, name, _ROTARY)
    check_same_device(_ROTARY, backend=backend, q=q, k=k, cos=cos, sin=sin)
    check_ndim(q, 4, "q", _ROTARY, "[B, Hq, S, D]", backend=backend)
    check_ndim(k, 4, "k", _ROTARY, "[B, Hk, S, D]", backend=backend)
    check_ndim(cos, 3, "cos", _ROTARY, "[B, S, R] (as the model's rotary embedding returns it)", backend=backend)
    if cos.shape != sin.shape:
        raise ValueError(f"{op}: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have the same shape")
    b, _, s, d = q.shape
    if k.shape[0] != b or k.shape[2] != s or k.shape[3] != d:
        raise ValueError(
            f"{op}: k {tuple(k.shape)} must match q {tuple(q.shape)} in batch, sequence and head dim "
            "(layout [B, H, S, D]; transpose(1, 2) a [B, S, H, D] tensor first)"
        )
    r = cos.shape[-1]
    if r % 2 or r == 0 or r > d:
        raise ValueError(
            f"{op}: the rotary dim R = cos.shape[-1] = {r} must be even, positive and at most the head dim {d}; "
            "pass the cos/sin the model's rotary embedding returns (cat(freqs, freqs))"
        )
    if cos.shape[0] not in (1, b) or cos.shape[1] != s:
        raise ValueError(
            f"{op}: cos/sin {tuple(cos.shape)} do not fit q {tuple(q.shape)}: expected [{b} or 1, {s}, R]"
        )
    return r


#: The expert index that, like ``E``, means "this route goes to no expert here" (what an
#: expert-parallel dispatcher writes for a route whose expert lives on another rank).
NO_EXPERT = -1


def _index_message(op: str, value: int | None, num_experts: int) -> str:
    held = f"holds {value}" if value is not None else "holds an index"
    return (
        f"{op}: top_k_index {held}, outside [0, {num_experts}) for E = {num_experts} experts; only -1 and "
        f"E = {num_experts} may stand for 'no expert here' (the expert-parallel sentinel: the route contributes "
        "zero), any other index is a routing bug"
    )


def check_expert_index(
    top_k_index: torch.Tensor, num_experts: int, *, backend: str | None = None, always: bool = False
) -> None:
    """The contract's rule for expert indices: each in ``[0, E)``, or ``-1`` / ``E`` (routes nowhere).

    Anything else raises ``ValueError`` naming the op (and ``backend``), the offending index
    and E. Reading the indices costs one reduction and one host synchronisation, so:

    * ``always=True`` -- for kernels that synchronise anyway (the eager loop, Liger);
    * otherwise the values are read when :func:`can_read_values`
      allows it (CPU tensors; accelerators with ``VEOMNI_OPS_CHECK_VALUES=1``); on CUDA, and
      while ``torch.compile`` traces, the rule is asserted on the device instead
      (:func:`device_assert`: no synchronisation; a failure stops
      the process with CUDA's device-side assertion); on other accelerators it is not
      checked and such an index routes nowhere, as the sentinels do (never out of bounds).
    """
    op = where(_MOE, backend)
    if always or can_read_values(top_k_index):
        got = value_range(top_k_index)
        if got is None:
            return
        lo, hi = got
        if lo < NO_EXPERT:
            raise ValueError(_index_message(op, lo, num_experts))
        if hi > num_experts:
            raise ValueError(_index_message(op, hi, num_experts))
    elif top_k_index.device.type in ("cuda", "cpu") and top_k_index.numel():
        device_assert(
            ((top_k_index >= NO_EXPERT) & (top_k_index <= num_experts)).all(), _index_message(op, None, num_experts)
        )


def check_moe_inputs(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    *,
    backend: str | None = None,
    float_check: TensorCheck | None = None,
    integer_check: TensorCheck | None = None,
) -> tuple[int, int, int, int, int]:
    """Check the ``moe_experts`` contract's inputs; return ``(T, H, E, I, K)``.

    Public, for backend authors: call it first in an adapter, then check only what the
    backend adds (expert-count limits, index ranges). Checks, in this order: dtypes
    (``float_check`` on the four float tensors, ``integer_check`` on ``top_k_index``;
    by default :func:`check_float` and
    :func:`check_integer`, each called as ``(x, name, op)``:
    pass your own to narrow the dtypes or to require a device type), ranks, one device,
    one dtype for the hidden states and both weights, and the shapes ``[T, H]``,
    ``[T, K]`` twice, ``[E, 2I, H]`` and ``[E, H, I]``. ``backend`` tags every message
    (``"moe_experts (liger): ..."``). Shapes only: no host synchronisation.
    """
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    if integer_check is None:
        integer_check = partial(check_integer, backend=backend)
    op = where(_MOE, backend)
    float_check(hidden_states, "hidden_states", _MOE)
    integer_check(top_k_index, "top_k_index", _MOE)
    float_check(top_k_weights, "top_k_weights", _MOE)
    float_check(gate_up_proj, "gate_up_proj", _MOE)
    float_check(down_proj, "down_proj", _MOE)
    check_ndim(hidden_states, 2, "hidden_states", _MOE, "[T, H] (flatten batch and sequence first)", backend=backend)
    check_ndim(top_k_index, 2, "top_k_index", _MOE, "[T, K]", backend=backend)
    check_ndim(top_k_weights, 2, "top_k_weights", _MOE, "[T, K]", backend=backend)
    check_ndim(gate_up_proj, 3, "gate_up_proj", _MOE, "[E, 2I, H]", backend=backend)
    check_ndim(down_proj, 3, "down_proj", _MOE, "[E, H, I]", backend=backend)
    check_same_device(
        _MOE,
        backend=backend,
        hidden_states=hidden_states,
        top_k_index=top_k_index,
        top_k_weights=top_k_weights,
        gate_up_proj=gate_up_proj,
        down_proj=down_proj,
    )
    check_same_dtype(_MOE, backend=backend, hidden_states=hidden_states, gate_up_proj=gate_up_proj, down_proj=down_proj)
    t, h = hidden_states.shape
    if top_k_index.shape != top_k_weights.shape or top_k_index.shape[0] != t:
        raise ValueError(
            f"{op}: top_k_index {tuple(top_k_index.shape)} and top_k_weights {tuple(top_k_weights.shape)} "
            f"must both be [T, K] with T = {t} tokens"
        )
    e, two_i, h_in = gate_up_proj.shape
    if h_in != h or two_i % 2:
        raise ValueError(
            f"{op}: gate_up_proj {tuple(gate_up_proj.shape)} must be [E, 2I, H] with H = {h} "
            "(transformers v5 layout: gate rows first, then up rows)"
        )
    if tuple(down_proj.shape) != (e, h, two_i // 2):
        raise ValueError(
            f"{op}: down_proj {tuple(down_proj.shape)} must be [E, H, I] = [{e}, {h}, {two_i // 2}] "
            f"to match gate_up_proj {tuple(gate_up_proj.shape)}"
        )
    return t, h, e, two_i // 2, top_k_index.shape[1]


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
        """:func:`check_rotary_inputs` with this backend's dtypes; returns R."""
        return check_rotary_inputs(q, k, cos, sin, backend=self.backend, float_check=self.check_float)

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
