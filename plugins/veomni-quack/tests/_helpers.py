"""Helpers of the veomni-quack tests: declared tolerances, comparison, the core reference."""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType

import pytest
import torch
import veomni_quack.specs as specs
from veomni_ops import OPS

#: What the backend registers: (op, variant) -> factory.
EXPECTED = {
    ("rms_norm", "standard"): "veomni_quack.kernels.rms_norm:rms_norm_standard",
    ("rms_norm", "offset"): "veomni_quack.kernels.rms_norm:rms_norm_offset",
    ("cross_entropy", "logits"): "veomni_quack.kernels.cross_entropy:cross_entropy_sum",
    ("cross_entropy", "fused_linear"): "veomni_quack.kernels.linear_cross_entropy:fused_linear_cross_entropy_sum",
    ("moe_experts", "standard"): "veomni_quack.kernels.moe:moe_experts",
}


def all_specs():
    return [s for op in OPS if hasattr(specs, op) for s in getattr(specs, op)()]


def spec_for(op: str, variant: str):
    return next(s for s in getattr(specs, op)() if s.variant == variant)


def signature(fn) -> list:
    return [(p.name, p.kind, None if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(fn).parameters.values()]


def assert_close(actual, expected, op: str, variant: str, what: str, dtype: torch.dtype | None = None) -> None:
    """``|actual - expected| <= atol * max(1, max|expected|) + rtol * |expected|`` with the spec's tolerance."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    tol = spec_for(op, variant).tolerance(str(dtype or actual.dtype).removeprefix("torch."))
    a = actual.detach().double()
    e = expected.detach().double()
    assert torch.isfinite(a).all(), f"{what}: non-finite values"
    scale = max(1.0, e.abs().max().item()) if e.numel() else 1.0
    err = (a - e).abs()
    bad = err > tol.atol * scale + tol.rtol * e.abs()
    assert not bad.any(), (
        f"{what} ({dtype or actual.dtype}): {int(bad.sum())}/{bad.numel()} out of tolerance "
        f"(atol={tol.atol}*{scale:.3g}, rtol={tol.rtol}); max err {err.max().item():.3g}"
    )


def core_kernels(module: str) -> ModuleType:
    try:
        return importlib.import_module(f"veomni_ops.kernels.{module}")
    except ModuleNotFoundError as e:
        pytest.skip(f"core reference veomni_ops.kernels.{module} is not importable ({e})")
