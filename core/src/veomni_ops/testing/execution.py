"""Where and how conformance cases run: the device kernels run on here, the case size,
the Triton interpreter, CPU threads; the status words of a result."""

from __future__ import annotations

import contextlib
import os

import torch

from ..device import DeviceError, DeviceInfo

REFUSALS = (ValueError, TypeError, NotImplementedError)

PASS, FAIL, ERROR, UNSUPPORTED, SKIP = "pass", "fail", "error", "unsupported", "skip"


def interpreter_active() -> bool:
    """Triton's CPU interpreter is on (``TRITON_INTERPRET=1``): small shapes, CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def execution_device(dev: DeviceInfo) -> torch.device:
    """The torch device on which kernels resolved for ``dev`` run here.

    The detected device runs its own kernels. A device given as an override (``--device`` /
    ``VEOMNI_OPS_DEVICE``) that this machine has is used as well; one it lacks is only
    accepted under the Triton interpreter, which runs GPU Triton kernels on CPU tensors.
    """
    t = dev.torch_device
    if t == "cpu":
        return torch.device("cpu")
    available = {
        "cuda": torch.cuda.is_available(),
        "xpu": hasattr(torch, "xpu") and torch.xpu.is_available(),
        "mps": torch.backends.mps.is_available(),
        "npu": hasattr(torch, "npu") and torch.npu.is_available(),
    }
    if available.get(t):
        return torch.device(t)
    if interpreter_active():
        return torch.device("cpu")
    raise DeviceError(
        f"cannot run kernels for device {dev} here: this machine has no {t} device. Check on a machine that has "
        "one, or set TRITON_INTERPRET=1 to run Triton kernels on the CPU interpreter"
    )


def default_size(device: torch.device) -> str:
    return "small" if device.type == "cpu" or interpreter_active() else "full"


@contextlib.contextmanager
def cpu_threads_for(device: torch.device | str, size: str):
    """One intra-op thread while checking small shapes on the CPU: tensors of a few dozen
    elements gain nothing from threads, and on a busy machine the thread pool's hand-offs
    cost more than the work (10-50x on a loaded 2-core CI box)."""
    if torch.device(device).type != "cpu" or size != "small":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
