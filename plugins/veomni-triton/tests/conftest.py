"""Shared fixtures of the veomni-triton tests.

The kernels run on a CUDA GPU, or on the CPU in Triton's interpreter. Triton decides the
mode when a kernel is *defined*, so the interpreter must be switched on before
``veomni_triton.kernels`` is imported: on a machine without CUDA we set
``TRITON_INTERPRET=1`` here (conftest runs before any test module is imported) unless the
caller chose a mode already.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    from veomni_triton.kernels._common import interpreter_active

    if interpreter_active():
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.skip("no CUDA device and TRITON_INTERPRET is off: nothing can run these Triton kernels")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
