"""Shared setup of the veomni-liger tests.

Liger's Triton kernels run on a CUDA GPU, or on the CPU in Triton's interpreter. Triton
decides the mode when a kernel is *defined* (when ``liger_kernel.ops.*`` is imported), so
the interpreter is switched on here, before any test module imports Liger, on machines
without CUDA. Under the interpreter Liger's MoE autotuner is pinned to one config
(``LIGER_FUSED_MOE_AUTOTUNE=0``, read at import): benchmarking configs needs a GPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    os.environ.setdefault("LIGER_FUSED_MOE_AUTOTUNE", "0")

# The helpers module sits beside the tests (no package, so the tests also run from a wheel).
sys.path.insert(0, str(Path(__file__).parent))


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(scope="session")
def device() -> torch.device:
    if interpreter_active():
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.skip("no CUDA device and TRITON_INTERPRET is off: nothing can run Liger's Triton kernels")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
