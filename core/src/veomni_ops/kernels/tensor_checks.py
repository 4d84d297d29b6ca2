"""The op-agnostic input checks and the value-check policy: what every op's checks are built from.

Backend authors import them from :mod:`veomni_ops.kernels.checks` (the public face, which
re-exports everything here and every op's checks); this module holds the shared part so
that each op's own checks (``veomni_ops/ops/<op>/checks.py``) can build on it without
importing the other ops'. It imports torch: use it in HEAVY modules only, never in
``specs.py`` or an op folder's light table.

They look at shapes, dtypes and devices only, never at values, so they cost no
device-to-host synchronisation and trace under ``torch.compile`` -- except
:func:`check_index_range` and :func:`value_range`, which say so. Every message starts with
:func:`where`: the op and, where given, the backend (``"moe_experts (liger): ..."``).

* :func:`check_tensor` -- a ``torch.Tensor`` at all;
* :func:`check_float` -- a float dtype among ``dtypes`` (default: float32/bfloat16/float16/float64);
* :func:`check_kernel_dtype` -- a dtype the backend's kernels take (default: no float64),
  pointing float64 users to the ``eager`` kernel;
* :func:`check_integer` -- an integer tensor (indices, labels);
* :func:`check_same_device`, :func:`check_same_dtype` -- several tensors agree;
* :func:`check_ndim` -- the number of dimensions, naming the expected layout;
* :func:`check_eps` -- a non-negative Python float;
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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import torch

__all__ = [
    "FLOAT_DTYPES",
    "KERNEL_DTYPES",
    "VALUE_CHECKS_ENV",
    "TensorCheck",
    "can_read_values",
    "check_eps",
    "check_float",
    "check_index_range",
    "check_integer",
    "check_kernel_dtype",
    "check_ndim",
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
