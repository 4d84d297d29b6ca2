"""The checks the Triton kernels share: the core's input checks bound to this backend
(:data:`CHECKS`), the device check (CUDA, or the CPU under ``TRITON_INTERPRET=1``) and
:func:`check_tensors`, its fast form for a wrapper's hot path. How the kernels are launched is
in :mod:`.launch`."""

from __future__ import annotations

import os

import torch
import triton
from veomni_ops.kernels.checks import BackendChecks, check_same_device, where

#: The core's checks for these kernels: float32/bfloat16/float16 (no float64).
CHECKS = BackendChecks("triton", kernels="veomni-triton's kernels")
_FLOAT_DTYPES = CHECKS.dtypes


def interpreter_active() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``).

    ``triton.jit`` decides interpreter vs. compiled mode when a kernel is *decorated*, i.e. when
    our kernel modules are imported, so what counts is the mode our kernels were built in, not
    the environment variable now. We read Triton's own knob where it exists (Triton >= 3.4
    parses the same truthy spellings it uses itself) and the variable otherwise.
    """
    return _INTERPRET_AT_IMPORT


def _read_interpret_flag() -> bool:
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    if runtime is not None and hasattr(runtime, "interpret"):
        return bool(runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


# Evaluated once, when the kernel modules (which import this one first) are imported and
# their @triton.jit decorators run.
_INTERPRET_AT_IMPORT = _read_interpret_flag()


def check_device(op: str, **tensors: torch.Tensor | None) -> torch.device:
    """All tensors (``None`` skipped) on one device, and a device these kernels can run on; returns it."""
    check_same_device(op, backend=CHECKS.backend, **tensors)
    dev = next(t for t in tensors.values() if t is not None).device
    if dev.type == "cuda":
        # Under TRITON_INTERPRET=1 CUDA tensors still work (the interpreter copies them to the
        # host and back, very slowly): that is Triton's debugging mode, chosen explicitly.
        return dev
    if dev.type == "cpu":
        if not interpreter_active():
            raise RuntimeError(
                f"{where(op, CHECKS.backend)}: got CPU tensors, but these are Triton GPU kernels (CUDA, sm80+). Move "
                "the tensors to a CUDA device, or, to test on a CPU, set TRITON_INTERPRET=1 before importing "
                "veomni_triton.kernels (Triton fixes the mode when the kernels are defined)"
            )
        return dev
    raise RuntimeError(
        f"{where(op, CHECKS.backend)}: device {dev} is not supported; these Triton kernels run on CUDA (sm80+) "
        "(or on the CPU under TRITON_INTERPRET=1 for testing)"
    )


def check_tensors(op: str, names: tuple[str, ...], tensors: tuple[torch.Tensor, ...]) -> int:
    """Every tensor a float tensor on one device these kernels run on; returns the device index
    (``get_device()``: -1 for the CPU). A handful of attribute reads on the good path; the
    detailed messages come from :data:`CHECKS` and :func:`check_device` on the bad one."""
    try:
        index = tensors[0].get_device()
        for t in tensors:
            if t.dtype not in _FLOAT_DTYPES or t.get_device() != index:
                break
        else:
            if index >= 0:
                if tensors[0].is_cuda:  # (another accelerator is refused by check_device below)
                    return index
            elif _INTERPRET_AT_IMPORT:  # testing mode: CPU tensors (not meta)
                for t in tensors:
                    if not t.is_cpu:
                        break
                else:
                    return index
    except AttributeError:
        pass
    for name, t in zip(names, tensors):
        CHECKS.check_tensor(t, name, op)
    for name, t in zip(names, tensors):
        CHECKS.check_float(t, name, op)
    check_device(op, **dict(zip(names, tensors)))
    raise AssertionError("unreachable: check_device accepts what the fast path accepted")
