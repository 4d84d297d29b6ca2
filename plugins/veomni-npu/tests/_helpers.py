"""Helpers of the veomni-npu tests: spec lookup, comparisons, the conformance kit on the stand-in."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import torch
import veomni_npu.specs as specs
from veomni_ops.spec import KernelSpec

FAKES = Path(__file__).resolve().parent / "fakes"

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
    from veomni_ops import OPS

    return [s for op in OPS if hasattr(specs, op) for s in getattr(specs, op)()]


def spec_for(op: str, variant: str) -> KernelSpec:
    return next(s for s in getattr(specs, op)() if s.variant == variant)


def kernel(op: str, variant: str):
    mod, _, attr = EXPECTED[(op, variant)].partition(":")
    return getattr(importlib.import_module(mod), attr)


def signature(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, None if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(fn).parameters.values()]


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
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    tol = spec_for(op, variant).tolerance(str(actual.dtype).removeprefix("torch."))
    a, e = actual.detach().double(), expected.detach().double()
    scale = max(1.0, e.abs().max().item()) if e.numel() else 1.0
    err = (a - e).abs()
    bad = err > tol.atol * scale + tol.rtol * e.abs()
    assert not bad.any(), f"{what} ({actual.dtype}): {int(bad.sum())}/{bad.numel()} out of tolerance, max err {err.max():.3g}"
