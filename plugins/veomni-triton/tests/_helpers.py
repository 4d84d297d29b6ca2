"""Helpers of the tests: tolerances from our KernelSpecs, comparison, optional core reference."""

from __future__ import annotations

import importlib

import pytest
import torch
import veomni_triton.specs as specs

DTYPES = [torch.float32, torch.bfloat16]


def tolerance(op: str, dtype: torch.dtype):
    """The tolerance our KernelSpec declares for ``op`` at ``dtype``: the tests hold us to it."""
    hook = getattr(specs, op)
    spec = next(s for s in hook() if s.name == "triton")
    return spec.tolerance(str(dtype).removeprefix("torch."))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, op: str, what: str, scale: float = 1.0) -> None:
    """``|actual - expected| <= atol*scale + rtol*|expected|`` elementwise, expected in float64.

    ``scale`` widens atol for reductions whose terms are much larger than their sum (dw).
    """
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    tol = tolerance(op, actual.dtype)
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    err = (a - e).abs()
    bound = tol.atol * scale + tol.rtol * e.abs()
    bad = err > bound
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(
            f"{what} ({actual.dtype}): {int(bad.sum())}/{bad.numel()} elements out of tolerance "
            f"(atol={tol.atol}*{scale}, rtol={tol.rtol}); first at flat index {i}: "
            f"got {a.flatten()[i].item():.6g}, expected {e.flatten()[i].item():.6g}; max err {err.max().item():.3g}"
        )


def core_kernels(module: str):
    """The core's eager reference module ``veomni_ops.kernels.<module>``, or skip with the reason."""
    try:
        return importlib.import_module(f"veomni_ops.kernels.{module}")
    except ModuleNotFoundError as e:
        pytest.skip(f"core reference veomni_ops.kernels.{module} is not importable yet ({e})")


def graph_capturing_backend(graphs: list):
    """A torch.compile backend that records each FX graph, then runs it through aot_eager."""
    from torch._dynamo.backends.common import aot_autograd  # noqa: F401  (ensures dynamo backends exist)
    from torch._dynamo.backends.registry import lookup_backend

    aot_eager = lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    return backend
