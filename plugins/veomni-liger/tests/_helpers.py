"""Helpers of the veomni-liger tests: our declared tolerances, comparison, core reference."""

from __future__ import annotations

import pytest
import torch
import veomni_liger.specs as specs
from veomni_ops.spec import KernelSpec
from veomni_ops.testing import backend_tests as kit
from veomni_ops.testing.execution import interpreter_active

#: The core's eager reference module ``veomni_ops.kernels.<name>`` (skips the test if missing).
core_kernels = kit.core_reference


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


def spec_for(op: str, variant: str) -> KernelSpec:
    return kit.spec_for(specs, op, variant)


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, op: str, variant: str, what: str, dtype: torch.dtype | None = None
) -> None:
    """:func:`veomni_ops.testing.backend_tests.assert_close` with the spec's tolerance for ``dtype``
    (default ``actual.dtype``; pass the input dtype for a float32 loss computed from bf16 logits)."""
    tol = spec_for(op, variant).tolerance(str(dtype or actual.dtype).removeprefix("torch."))
    kit.assert_close(actual, expected, tol, what, dtype=dtype)


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
