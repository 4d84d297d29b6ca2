"""Helpers of the tests: tolerances from our KernelSpecs, comparison, optional core reference."""

from __future__ import annotations

import torch
import veomni_triton.specs as specs
from veomni_ops.spec import Tolerance
from veomni_ops.testing import backend_tests as kit

DTYPES = [torch.float32, torch.bfloat16]


def tolerance(op: str, dtype: torch.dtype) -> Tolerance:
    """The tolerance our KernelSpec declares for ``op`` at ``dtype``: the tests hold us to it."""
    return kit.spec_for(specs, op, name="triton").tolerance(str(dtype).removeprefix("torch."))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, op: str, what: str, scale: float = 1.0) -> None:
    """``|actual - expected| <= atol*scale + rtol*|expected|`` elementwise, expected in float64.

    ``scale`` widens atol for reductions whose terms are much larger than their sum (dw).
    """
    kit.assert_close(actual, expected, tolerance(op, actual.dtype), what, scale=scale)


#: The core's eager reference module ``veomni_ops.kernels.<name>`` (skips the test if missing).
core_kernels = kit.core_reference


def graph_capturing_backend(graphs: list):
    """A torch.compile backend that records each FX graph, then runs it through aot_eager."""
    from torch._dynamo.backends.common import aot_autograd  # noqa: F401  (ensures dynamo backends exist)
    from torch._dynamo.backends.registry import lookup_backend

    aot_eager = lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    return backend
