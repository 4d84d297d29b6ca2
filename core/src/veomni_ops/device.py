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
from dataclasses import dataclass, field, replace

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
    #: the override came from ``VEOMNI_OPS_DEVICE`` (not from the caller): every message naming
    #: this device says so (:meth:`describe`), since nothing in the call or the job shows it
    from_env: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        s = self.type
        if self.capability:
            s += ":%d.%d" % self.capability
        return s

    def describe(self) -> str:
        """The device as messages name it: ``cuda:9.0``, or ``cuda:9.0 (from VEOMNI_OPS_DEVICE)``."""
        return f"{self} (from {DEVICE_ENV})" if self.from_env else str(self)

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


#: Compute capabilities a real device of the type can have (MAJOR range; MINOR 0..9), with
#: examples, for refusing what no GPU has (``cuda:99.0``) and saying what is valid. ROCm's is
#: the gfx generation as torch reports it (gfx90a 9.0, gfx942 9.4, gfx1100 11.0).
CAPABILITY_RANGES: dict[str, tuple[int, int, str]] = {
    "cuda": (3, 12, "7.0 V100, 8.0 A100, 8.9 L40S, 9.0 H100/H200, 10.0 B200, 12.0 RTX 50xx"),
    "rocm": (9, 12, "9.0 MI200, 9.4 MI300X, 9.5 MI350X, 11.0 RX 7900"),
}

_EXAMPLE = {"cuda": "cuda:9.0", "rocm": "rocm:9.4"}
_DEVICE_FORMS = ("write one of cuda[:MAJOR.MINOR], rocm[:MAJOR.MINOR], npu, xpu, mps, cpu "
                 "(e.g. cuda:9.0 for an H100; cuda alone is this machine's GPU)")


def parse_device(text: str) -> DeviceInfo:
    """Parse ``cuda``, ``cuda:9.0``, ``cuda:sm_90``, ``rocm:9.4``, ``npu``, ``cpu`` ... The part
    after ``:`` is a compute capability, for cuda and rocm only; every refusal says what to write
    for the device type given."""
    raw = text
    text = text.strip().lower()
    dtype, colon, cap = text.partition(":")
    if dtype == "gpu":
        raise DeviceError(f"device {raw!r} does not say which kind of GPU: write cuda (NVIDIA), rocm (AMD) or xpu "
                          "(Intel); with a compute capability to plan for another machine (cuda:9.0 for an H100)")
    if dtype not in DEVICE_TYPES or dtype == "any":
        raise DeviceError(f"unknown device {raw!r}; {_DEVICE_FORMS}")
    if colon and dtype not in CAPABILITY_RANGES:
        raise DeviceError(f"device {raw!r}: {dtype} takes nothing after ':' (kernels declare device types, not "
                          f"chips or indices, for {dtype}): write {dtype}")
    capability = _parse_capability(raw, dtype, cap) if colon else None
    return DeviceInfo(dtype, capability, name=f"override {raw}", overridden=True)


def _parse_capability(raw: str, dtype: str, cap: str) -> tuple[int, int]:
    lo, hi, examples = CAPABILITY_RANGES[dtype]
    valid = f"valid: MAJOR.MINOR with MAJOR {lo}..{hi} and MINOR 0..9 ({examples})"
    if cap.isdigit() and len(cap) == 1:
        raise DeviceError(f"device {raw!r}: {cap!r} looks like a torch device index; here the part after ':' is the "
                          f"compute capability to plan for: write {dtype} (this machine's GPU) or {dtype}:MAJOR.MINOR "
                          f"({valid})")
    m = re.fullmatch(r"(?:sm_?)?(\d+)\.(\d+)|sm_?(\d+)(\d)", cap)
    if not m:
        raise DeviceError(f"device {raw!r}: {cap!r} is not a compute capability; write {dtype}:MAJOR.MINOR or "
                          f"{dtype}:smXY ({valid})")
    major, minor = (int(m.group(1)), int(m.group(2))) if m.group(1) else (int(m.group(3)), int(m.group(4)))
    if not (lo <= major <= hi and 0 <= minor <= 9):
        raise DeviceError(f"device {raw!r}: no {dtype} device has compute capability {major}.{minor}; {valid}")
    return major, minor


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
    """The device to resolve for: ``override``, else ``$VEOMNI_OPS_DEVICE``, else detected (cached).
    ``cuda`` or ``rocm`` without a capability is this machine's GPU where it has one of that type
    (the detected device, capability included), else a device of unknown capability."""
    if isinstance(override, DeviceInfo):
        return override
    text = override or os.environ.get(DEVICE_ENV, "").strip()
    if not text:
        return detected_device()
    if override:
        dev = parse_device(text)
    else:
        try:
            dev = replace(parse_device(text), name=f"from {DEVICE_ENV}={text}", from_env=True)
        except DeviceError as e:
            raise DeviceError(f"{DEVICE_ENV}={text!r} (set in the environment): {e}; or unset {DEVICE_ENV} to "
                              "resolve for this machine's device") from None
    if dev.type in CAPABILITY_RANGES and dev.capability is None:
        here = detected_device()
        if here.type == dev.type:
            return here
    return dev


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
            return (f"needs compute capability {req.describe()}, and the {dev.type} device's capability is unknown "
                    f"(no {dev.type} device here to read it from): name it, e.g. {_EXAMPLE[dev.type]}")
        if req.min_capability and dev.capability < req.min_capability:
            return "needs compute capability >= %d.%d, this device has %d.%d" % (*req.min_capability, *dev.capability)
        if req.max_capability and dev.capability > req.max_capability:
            return "needs compute capability <= %d.%d, this device has %d.%d" % (*req.max_capability, *dev.capability)
    return None
