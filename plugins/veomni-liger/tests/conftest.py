"""Shared setup of the veomni-liger tests.

Liger's Triton kernels run on a CUDA GPU, or on the CPU in Triton's interpreter. Triton
decides the mode when a kernel is *defined* (when ``liger_kernel.ops.*`` is imported), so
the interpreter is switched on here, before any test module imports Liger, on machines
without CUDA. Under the interpreter Liger's MoE autotuner is pinned to one config
(``LIGER_FUSED_MOE_AUTOTUNE=0``, read at import): benchmarking configs needs a GPU. The
set-up every backend's tests share is :mod:`veomni_ops.testing.backend_tests`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from veomni_ops.testing.backend_tests import (  # noqa: F401  (seeded: an autouse fixture)
    kernel_device,
    seeded,
    triton_interpreter_unless_cuda,
)

triton_interpreter_unless_cuda()
if os.environ.get("TRITON_INTERPRET") == "1":
    os.environ.setdefault("LIGER_FUSED_MOE_AUTOTUNE", "0")

# The helpers module sits beside the tests (no package, so the tests also run from a wheel).
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def device() -> torch.device:
    return kernel_device()
