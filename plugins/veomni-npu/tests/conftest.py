"""Shared setup of the veomni-npu tests: the stand-in torch_npu goes first on sys.path.

torch_npu needs an Ascend NPU and the CANN toolkit, so these tests run the adapters against
``tests/standins/torch_npu``, a stand-in in plain torch on the CPU implementing the documented
semantics of the few operators the adapters call. ``tests/standins`` also holds stand-in
distribution metadata (``torch_npu-2.7.1.dist-info``) so resolution's requirement check
(``torch-npu>=...``) sees a torch-npu installed. Nothing in these tests touches an NPU.
The set-up every backend's tests share is :mod:`veomni_ops.testing.backend_tests`.
"""

from __future__ import annotations

from pathlib import Path

from veomni_ops.testing.backend_tests import seeded, use_standins  # noqa: F401  (seeded: an autouse fixture)

HERE = Path(__file__).resolve().parent
STANDINS = HERE / "standins"

# The helpers module sits beside the tests (no package, so the tests also run from a wheel).
use_standins(STANDINS, "torch_npu", also=(HERE,),
             fix="On an Ascend machine, check the kernels with gpu/check_npu.py instead")
