"""Helpers of the veomni-npu tests: spec lookup, comparisons, the conformance kit on the stand-in."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
import veomni_npu.specs as specs
from veomni_ops.spec import KernelSpec
from veomni_ops.testing import backend_tests as kit

STANDINS = Path(__file__).resolve().parent / "standins"

#: (op, variant) -> factory, everything the backend registers.
EXPECTED = {
    ("rms_norm", "standard"): "veomni_npu.kernels.rms_norm:rms_norm_standard",
    ("rms_norm", "offset"): "veomni_npu.kernels.rms_norm:rms_norm_offset",
    ("rotary", "full"): "veomni_npu.kernels.rotary:apply_rotary",
    ("rotary", "partial"): "veomni_npu.kernels.rotary:apply_rotary",
    ("swiglu", "standard"): "veomni_npu.kernels.swiglu:silu_mul",
    ("moe_experts", "standard"): "veomni_npu.kernels.moe:moe_experts",
    ("attention", "standard"): "veomni_npu.kernels.attention:npu_attention",
}


def all_specs() -> list[KernelSpec]:
    return kit.all_specs(specs)


def spec_for(op: str, variant: str) -> KernelSpec:
    return kit.spec_for(specs, op, variant)


def kernel(op: str, variant: str):
    mod, _, attr = EXPECTED[(op, variant)].partition(":")
    return getattr(importlib.import_module(mod), attr)


def conformance(op: str, variant: str) -> list:
    """The core's conformance cases for this kernel (small shapes, every declared dtype,
    forward and backward, float64 reference), run through the stand-in on the CPU."""
    from veomni_ops.testing.runner import check_kernel

    spec = spec_for(op, variant)
    return check_kernel(kernel(op, variant), spec, device="cpu", size="small", seed=1234)


def assert_all_pass(results: list) -> None:
    assert results, "no conformance case ran"
    bad = [r.describe() for r in results if r.status != "pass"]
    assert not bad, "\n".join(bad)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, op: str, variant: str, what: str) -> None:
    """``|a - b| <= atol * max(1, max|b|) + rtol * |b|`` with the spec's tolerance for ``actual``'s dtype."""
    tol = spec_for(op, variant).tolerance(str(actual.dtype).removeprefix("torch."))
    kit.assert_close(actual, expected, tol, what)
