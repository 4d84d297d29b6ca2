"""Shared setup of the veomni-npu tests: the stand-in torch_npu goes first on sys.path.

torch_npu needs an Ascend NPU and the CANN toolkit, so these tests run the adapters against
``tests/fakes/torch_npu``, a stand-in in plain torch on the CPU implementing the documented
semantics of the few operators the adapters call. ``tests/fakes`` also holds stand-in
distribution metadata (``torch_npu-2.7.1.dist-info``) so resolution's requirement check
(``torch-npu>=...``) sees a torch-npu installed. Nothing in these tests touches an NPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
FAKES = HERE / "fakes"

# The helpers module sits beside the tests (no package, so the tests also run from a wheel).
for p in (str(FAKES), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

_loaded = sys.modules.get("torch_npu")
if _loaded is not None and not getattr(_loaded, "IS_STAND_IN", False):
    raise pytest.UsageError(
        "a real torch_npu is already imported in this process; the veomni-npu unit tests run against the "
        "stand-in in tests/fakes. On an Ascend machine, check the kernels with npu/check_npu.py instead"
    )


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
