"""Helpers of the veomni-quack tests: declared tolerances, comparison, the core reference."""

from __future__ import annotations

import torch
import veomni_quack.specs as specs
from veomni_ops.spec import KernelSpec
from veomni_ops.testing import backend_tests as kit

#: What the backend registers: (op, variant) -> factory.
EXPECTED = {
    ("rms_norm", "standard"): "veomni_quack.kernels.rms_norm:rms_norm_standard",
    ("rms_norm", "offset"): "veomni_quack.kernels.rms_norm:rms_norm_offset",
    ("cross_entropy", "logits"): "veomni_quack.kernels.cross_entropy:cross_entropy_sum",
    ("cross_entropy", "fused_linear"): "veomni_quack.kernels.linear_cross_entropy:fused_linear_cross_entropy_sum",
    ("moe_experts", "standard"): "veomni_quack.kernels.moe:moe_experts",
}


#: The core's eager reference module ``veomni_ops.kernels.<name>`` (skips the test if missing).
core_kernels = kit.core_reference


def all_specs() -> list[KernelSpec]:
    return kit.all_specs(specs)


def spec_for(op: str, variant: str) -> KernelSpec:
    return kit.spec_for(specs, op, variant)


def assert_close(actual, expected, op: str, variant: str, what: str, dtype: torch.dtype | None = None) -> None:
    """``|actual - expected| <= atol * max(1, max|expected|) + rtol * |expected|`` with the spec's tolerance."""
    tol = spec_for(op, variant).tolerance(str(dtype or actual.dtype).removeprefix("torch."))
    kit.assert_close(actual, expected, tol, what, dtype=dtype)
