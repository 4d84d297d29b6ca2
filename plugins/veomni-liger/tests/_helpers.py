"""Helpers of the veomni-liger tests: our declared tolerances, comparison, core reference."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch
import veomni_liger.specs as specs


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


#: Triton's CPU interpreter (3.9) does bfloat16 *arithmetic* on the raw 16-bit patterns
#: (loads, stores and casts are right): a kernel that computes in bf16 (Liger's RoPE does)
#: gives garbage there. Kernels that upcast first (cross-entropy, MoE accumulators) are fine.
BF16_ARITH_SKIP = pytest.mark.skipif(
    interpreter_active(),
    reason="Triton's CPU interpreter computes bf16 arithmetic on raw bits; bf16 runs in `veomni-ops check --backend veomni-liger` on a GPU",
)


def dtype_params(bf16_arith: bool) -> list:
    """float32, float16 and bfloat16 -- the last skipped under the interpreter if the kernel computes in bf16."""
    bf16 = pytest.param(torch.bfloat16, marks=BF16_ARITH_SKIP) if bf16_arith else torch.bfloat16
    return [torch.float32, torch.float16, bf16]


def spec_for(op: str, variant: str):
    return next(s for s in getattr(specs, op)() if s.variant == variant)


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, op: str, variant: str, what: str, dtype: torch.dtype | None = None
) -> None:
    """``|actual - expected| <= atol * scale + rtol * |expected|`` elementwise, with the spec's tolerance.

    The tolerance is the spec's for ``dtype`` (default ``actual.dtype``; pass the input dtype
    for a float32 loss computed from bf16 logits).

    ``scale = max(1, max|expected|)``: for tensors of order one this is exactly the spec's
    absolute tolerance; for sums over many terms (a loss summed over tokens, a weight
    gradient summed over rows) atol grows with the magnitude, as the rounding error does.
    """
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    tol = spec_for(op, variant).tolerance(str(dtype or actual.dtype).removeprefix("torch."))
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    assert torch.isfinite(a).all(), f"{what} ({actual.dtype}): non-finite values"
    scale = max(1.0, e.abs().max().item()) if e.numel() else 1.0
    err = (a - e).abs()
    bad = err > tol.atol * scale + tol.rtol * e.abs()
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(
            f"{what} ({dtype or actual.dtype}): {int(bad.sum())}/{bad.numel()} elements out of tolerance "
            f"(atol={tol.atol}*{scale:.3g}, rtol={tol.rtol}); first at flat index {i}: "
            f"got {a.flatten()[i].item():.6g}, expected {e.flatten()[i].item():.6g}; max err {err.max().item():.3g}"
        )


def core_kernels(module: str) -> ModuleType:
    """The core's eager reference ``veomni_ops.kernels.<module>``, or skip saying why."""
    try:
        return importlib.import_module(f"veomni_ops.kernels.{module}")
    except ModuleNotFoundError as e:
        pytest.skip(f"core reference veomni_ops.kernels.{module} is not importable ({e})")


def rope_cos_sin(batch: int, seq: int, rotary_dim: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin as a model's rotary embedding returns them: ``cat(freqs, freqs)``, [B, S, R]."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    pos = torch.arange(seq, dtype=torch.float64)[None, :].expand(batch, seq)
    # Per-batch offsets so a batch-broadcast bug would show.
    pos = pos + torch.arange(batch, dtype=torch.float64)[:, None] * 3
    freqs = pos[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def rope_reference(q, k, cos, sin):
    """Float64 rotate_half RoPE of the first R channels (R = cos.shape[-1])."""
    q, k, cos, sin = (t.detach().double() for t in (q, k, cos, sin))
    r = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]

    def rot(x):
        xr, xp = x[..., :r], x[..., r:]
        half = r // 2
        rh = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
        return torch.cat([xr * cos + rh * sin, xp], dim=-1)

    return rot(q), rot(k)
