"""The helpers the Quack adapters share: importing Quack, the core's input checks bound to
this backend (:data:`CHECKS`), layout fixes.

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
from veomni_ops.kernels.checks import BackendChecks

INSTALL_HINT = 'pip install "veomni-ops[quack]"'

#: Versions every registered kernel has been written against (README "Versions").
TESTED_WITH = "quack-kernels 0.6.5 with nvidia-cutlass-dsl 4.8.1"

#: The core's checks for Quack's kernels: float32/bfloat16/float16 (they assert on anything
#: else, float64 included), CUDA only. The unit tests widen ``CHECKS.device_types`` to run the
#: adapters against a plain-torch stand-in of Quack on the CPU. Label ranges are checked always
#: (one synchronisation): Quack's adapters synchronise anyway (why the specs say supports_compile=False).
CHECKS = BackendChecks(
    "quack", kernels="Quack's kernels", device_types=("cuda",), runs_on="CUDA GPUs (sm 9.0+)",
    consequence="fix the labels (Quack would read out of bounds)",
)

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


def quack_labels(labels: torch.Tensor, ignore_index: int, op: str) -> torch.Tensor:
    """Checked labels (:meth:`~veomni_ops.kernels.checks.BackendChecks.check_labels`) as Quack reads
    them: int32 or int64, with an ``ignore_index`` that fits in int32 (Quack compares in int32)."""
    if not _INT32_MIN <= ignore_index <= _INT32_MAX:
        raise ValueError(f"{op} (quack): ignore_index {ignore_index} does not fit in int32 (Quack compares in int32)")
    return labels if labels.dtype in (torch.int32, torch.int64) else labels.long()


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
