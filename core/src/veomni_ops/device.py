"""The device a plan is resolved for: detected once per process, or overridden.

Override with ``VEOMNI_OPS_DEVICE`` (or ``--device`` on the CLI) to resolve for a device
this machine does not have: ``cuda:9.0``, ``cuda:sm90``, ``rocm:9.4``, ``npu``, ``xpu``,
``mps``, ``cpu``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass

from .spec import DEVICE_TYPES, HardwareRequirement

DEVICE_ENV = "VEOMNI_OPS_DEVICE"


class DeviceError(ValueError):
    """A device description could not be understood."""


@dataclass(frozen=True)
class DeviceInfo:
    """``type`` is one of cuda/rocm/npu/xpu/mps/cpu; ``capability`` is (major, minor) for GPUs."""

    type: str
    capability: tuple[int, int] | None = None
    name: str = ""
    overridden: bool = False

    def __str__(self) -> str:
        s = self.type
        if self.capability:
            s += ":%d.%d" % self.capability
        return s

    @property
    def torch_device(self) -> str:
        """The torch device string (ROCm devices are ``cuda`` to torch)."""
        return "cuda" if self.type == "rocm" else self.type

    def to_dict(self) -> dict:
        return {
            "type": self.type,
            "capability": list(self.capability) if self.capability else None,
            "name": self.name,
            "overridden": self.overridden,
        }


def parse_device(text: str) -> DeviceInfo:
    """Parse ``cuda``, ``cuda:9.0``, ``cuda:sm_90``, ``rocm:9.4``, ``npu``, ``cpu`` ..."""
    raw = text
    text = text.strip().lower()
    dtype, _, cap = text.partition(":")
    if dtype == "gpu":
        dtype = "cuda"
    if dtype not in DEVICE_TYPES or dtype == "any":
        raise DeviceError(
            f"unknown device {raw!r}; write one of cuda[:MAJOR.MINOR], rocm[:MAJOR.MINOR], npu, xpu, mps, cpu "
            "(e.g. cuda:9.0 for an H100)"
        )
    capability = None
    if cap:
        m = re.fullmatch(r"(?:sm_?)?(\d+)\.(\d+)|sm_?(\d+)(\d)", cap)
        if not m or dtype not in ("cuda", "rocm"):
            raise DeviceError(
                f"device {raw!r}: {cap!r} is not a compute capability for {dtype}; write e.g. cuda:9.0 or cuda:sm90"
            )
        capability = (int(m.group(1)), int(m.group(2))) if m.group(1) else (int(m.group(3)), int(m.group(4)))
    return DeviceInfo(dtype, capability, name=f"override {raw}", overridden=True)


def _detect() -> DeviceInfo:
    import torch

    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        return DeviceInfo(kind, (int(cap[0]), int(cap[1])), torch.cuda.get_device_name())
    # Ascend: torch_npu is only importable where the CANN stack is; checking for it is the
    # one vendor import the core makes, and only here, at resolution time.
    if importlib.util.find_spec("torch_npu") is not None:
        try:
            import torch_npu  # noqa: F401

            if torch.npu.is_available():  # type: ignore[attr-defined]  # torch_npu adds torch.npu
                return DeviceInfo("npu", None, "Ascend NPU")
        except Exception:  # a broken CANN install is not an NPU we can use
            pass
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return DeviceInfo("xpu", None, torch.xpu.get_device_name())
    if torch.backends.mps.is_available():
        return DeviceInfo("mps", None, "Apple MPS")
    return DeviceInfo("cpu", None, "cpu")


@functools.lru_cache(maxsize=1)
def detected_device() -> DeviceInfo:
    """This machine's device, detected once per process (no override applies)."""
    return _detect()


def current_device(override: str | DeviceInfo | None = None) -> DeviceInfo:
    """The device to resolve for: ``override``, else ``$VEOMNI_OPS_DEVICE``, else detected (cached)."""
    if isinstance(override, DeviceInfo):
        return override
    if override:
        return parse_device(override)
    env = os.environ.get(DEVICE_ENV, "").strip()
    if env:
        return parse_device(env)
    return detected_device()


def is_local(dev: DeviceInfo) -> bool:
    """Is ``dev`` this machine's device (so its kernels can be imported and run here)?"""
    if not dev.overridden:
        return True
    here = detected_device()
    return dev.type == here.type and (dev.capability is None or dev.capability == here.capability)


def check_hardware(req: HardwareRequirement, dev: DeviceInfo) -> str | None:
    """``None`` if ``dev`` satisfies ``req``, else the reason it does not (one phrase)."""
    if "any" not in req.device_types and dev.type not in req.device_types:
        return f"needs a {'/'.join(req.device_types)} device, this is {dev.type}"
    if dev.type in ("cuda", "rocm") and (req.min_capability or req.max_capability):
        if dev.capability is None:
            return f"needs compute capability {req.describe()}, and the {dev.type} device's capability is unknown"
        if req.min_capability and dev.capability < req.min_capability:
            return "needs compute capability >= %d.%d, this device has %d.%d" % (*req.min_capability, *dev.capability)
        if req.max_capability and dev.capability > req.max_capability:
            return "needs compute capability <= %d.%d, this device has %d.%d" % (*req.max_capability, *dev.capability)
    return None
