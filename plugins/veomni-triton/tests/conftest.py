"""Shared fixtures of the veomni-triton tests.

The kernels run on a CUDA GPU, or on the CPU in Triton's interpreter. Triton decides the
mode when a kernel is *defined*, so the interpreter must be switched on before
``veomni_triton.kernels`` is imported: on a machine without CUDA we set
``TRITON_INTERPRET=1`` here (conftest runs before any test module is imported) unless the
caller chose a mode already. The set-up every backend's tests share is
:mod:`veomni_ops.testing.backend_tests`.
"""

from __future__ import annotations

import pytest
import torch
from veomni_ops.testing.backend_tests import (  # noqa: F401  (seeded: an autouse fixture)
    kernel_device,
    seeded,
    triton_interpreter_unless_cuda,
)

triton_interpreter_unless_cuda()


@pytest.fixture(scope="session")
def device() -> torch.device:
    # The mode the kernels were defined in (Triton's own knob), not the variable now.
    from veomni_triton.kernels._common import interpreter_active

    return kernel_device(interpreter_active())
