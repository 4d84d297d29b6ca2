"""Shared pieces of the Quack adapters: importing Quack, input checks, layout fixes.

Quack compiles its CuTe kernels for *assumed* layouts (``quack.compile_utils.make_fake_tensor``):
the last dimension has stride 1, every other stride is a multiple of ``div`` elements and
the data pointer is aligned to ``div * element_size`` bytes, where ``div`` is
``gcd(N, 16 bytes / element size)`` over the tensors of one launch. A view that breaks
these (a slice at an odd offset, a row stride that is not a multiple of 8 bf16 elements)
is copied here, with a differentiable clone, before it reaches Quack.
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType

import torch
from veomni_ops.kernels import checks

INSTALL_HINT = 'pip install "veomni-ops[quack]"'

#: Versions every registered kernel has been written against (README "Versions").
TESTED_WITH = "quack-kernels 0.6.5 with nvidia-cutlass-dsl 4.8.1"

#: Device types the adapters accept. Quack's kernels are CUDA only; the unit tests widen
#: this to run the adapters against a plain-torch stand-in of Quack on the CPU.
DEVICE_TYPES: tuple[str, ...] = ("cuda",)

#: dtypes Quack's row kernels accept (they assert on anything else, float64 included).
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def import_quack(module: str) -> ModuleType:
    """Import ``module`` (a ``quack.*`` module) or raise an ImportError saying what to do.

    A missing distribution names the install command. Quack being installed but failing to
    import (e.g. a nvidia-cutlass-dsl it was not released against) keeps the original error
    chained: the core shows it in the refusal.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing in ("quack", "cutlass", "cuda", "tvm_ffi", "torch_c_dlpack_ext", "einops"):
            raise ImportError(
                f"veomni-quack needs {module} but {missing!r} is not installed. To get it: {INSTALL_HINT} "
                f"(this backend has been written against {TESTED_WITH})"
            ) from e
        raise _broken(module, e) from e
    except Exception as e:  # noqa: BLE001 - CuTe-DSL may raise anything while tracing at import
        raise _broken(module, e) from e


def _broken(module: str, e: BaseException) -> ImportError:
    return ImportError(
        f"{module} is installed but failed to import ({type(e).__name__}: {e}). veomni-quack has been "
        f"written against {TESTED_WITH}; install those versions ({INSTALL_HINT} pins them) or choose another kernel"
    )


def check_tensor(x: object, name: str, op: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op} (quack): {name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(x: torch.Tensor, name: str, op: str) -> None:
    check_tensor(x, name, op)
    if x.dtype not in KERNEL_DTYPES:
        raise TypeError(
            f"{op} (quack): {name} has dtype {x.dtype}; Quack's kernels take float32, bfloat16 or float16 "
            f"(cast it, or use the 'eager' kernel for float64)"
        )


def check_device(op: str, **tensors: torch.Tensor | None) -> None:
    devices = {n: t.device for n, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"{op} (quack): inputs are on different devices ({listing}); move them to one device")
    for n, d in devices.items():
        if d.type not in DEVICE_TYPES:
            raise ValueError(
                f"{op} (quack): {n} is on {d}, but Quack's kernels run on CUDA GPUs only (sm 9.0+); "
                "move the inputs to the GPU or choose another kernel"
            )


def check_labels(labels: torch.Tensor, n: int, ignore_index: object, op: str) -> torch.Tensor:
    """Labels ``[N]`` of an integer dtype; returned as int32/int64 (what Quack reads)."""
    check_tensor(labels, "labels", op)
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise TypeError(f"{op} (quack): labels has dtype {labels.dtype}; it must be an integer tensor (labels.long())")
    if labels.dim() != 1:
        raise ValueError(f"{op} (quack): labels must be 1-D [N] (flatten and shift it first), got {tuple(labels.shape)}")
    if labels.shape[0] != n:
        raise ValueError(f"{op} (quack): labels has {labels.shape[0]} entries but there are {n} tokens; they must match")
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"{op} (quack): ignore_index must be a Python int, got {ignore_index!r}")
    if not _INT32_MIN <= ignore_index <= _INT32_MAX:
        raise ValueError(f"{op} (quack): ignore_index {ignore_index} does not fit in int32 (Quack compares in int32)")
    if labels.dtype not in (torch.int32, torch.int64):
        labels = labels.long()
    return labels


def check_label_range(labels: torch.Tensor, vocab: int, ignore_index: int, op: str) -> None:
    """Labels outside ``[0, V)`` other than ``ignore_index`` would make Quack read out of bounds.

    The core's check (:func:`veomni_ops.kernels.checks.check_index_range`): one reduction and
    one device-to-host synchronisation per call, always -- Quack's adapters synchronise anyway
    (why the specs say supports_compile=False). The message names the op and the label.
    """
    checks.check_index_range(
        labels, vocab, "labels", op, f"the vocabulary size V = {vocab}", ignore=ignore_index, backend="quack",
        consequence="fix the labels (Quack would read out of bounds)",
    )


def layout_div(n: int, *tensors: torch.Tensor | None) -> int:
    """The ``div`` Quack compiles for: ``gcd(N, 16 // element_size)`` over the launch's tensors."""
    return math.gcd(n, *(16 // t.element_size() for t in tensors if t is not None))


def fits_layout(t: torch.Tensor, div: int) -> bool:
    """True if ``t`` meets the layout Quack's compiled kernel assumes (module docstring)."""
    if t.dim() == 0 or t.numel() == 0:
        return True
    # Strict even for size-1 dimensions: the FFI may check every stride it was compiled for.
    if t.stride(-1) != 1 or any(s % div for s in t.stride()[:-1]):
        return False
    return t.data_ptr() % (div * t.element_size()) == 0


def to_layout(t: torch.Tensor, div: int) -> torch.Tensor:
    """``t`` itself when it fits, else a fresh (aligned, contiguous) differentiable copy."""
    if fits_layout(t, div):
        return t
    return t.clone(memory_format=torch.contiguous_format)
