"""The core's device detection on an Ascend machine, with the stand-in torch_npu.

``veomni_ops.device._detect`` (uncached; ``current_device`` caches it) looks for
``torch_npu`` only when no CUDA device is present, imports it, and asks
``torch.npu.is_available()``. The real torch_npu installs ``torch.npu`` when imported; the
stand-in does not, so these tests patch ``torch.npu`` in (monkeypatch restores it) and pin
CUDA, XPU and MPS to unavailable so the outcome does not depend on this machine.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import veomni_ops.device as device
from veomni_ops import current_device, parse_device


@pytest.fixture
def no_other_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def _fake_torch_npu_module(monkeypatch, available: bool):
    # torch.npu as torch_npu would install it; monkeypatch removes it again afterwards.
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(is_available=lambda: available), raising=False)


def test_detects_an_npu_when_torch_npu_reports_one(monkeypatch, no_other_devices):
    _fake_torch_npu_module(monkeypatch, True)
    info = device._detect()
    assert (info.type, info.capability, info.overridden) == ("npu", None, False)
    import torch_npu

    assert torch_npu.IS_STAND_IN  # the import went to the stand-in, not a real install


def test_torch_npu_without_a_device_is_not_an_npu(monkeypatch, no_other_devices):
    _fake_torch_npu_module(monkeypatch, False)
    assert device._detect().type == "cpu"


def test_no_torch_npu_installed_is_not_an_npu(monkeypatch, no_other_devices):
    _fake_torch_npu_module(monkeypatch, True)
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # find_spec -> None, as when not installed
    assert device._detect().type == "cpu"


def test_a_broken_cann_install_is_not_an_npu(monkeypatch, tmp_path, no_other_devices):
    # torch_npu whose import fails the way a missing CANN library does.
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "raise OSError('libascendcl.so: cannot open shared object file: No such file or directory')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    _fake_torch_npu_module(monkeypatch, True)
    assert device._detect().type == "cpu"
    assert "torch_npu" not in sys.modules  # the failed import left nothing behind


def test_cuda_wins_over_torch_npu(monkeypatch):
    # The CUDA check comes first: an NPU machine never reaches it, a CUDA one never imports torch_npu.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in GPU")
    monkeypatch.setattr(torch.version, "hip", None)
    _fake_torch_npu_module(monkeypatch, True)
    assert device._detect().type == "cuda"


def test_override_names_an_npu_on_any_machine(monkeypatch):
    monkeypatch.setenv(device.DEVICE_ENV, "npu")
    info = current_device()
    assert (info.type, info.overridden) == ("npu", True)
    assert parse_device("NPU").type == "npu"
    with pytest.raises(device.DeviceError):
        parse_device("npu:9.0")  # NPUs have no compute capability
