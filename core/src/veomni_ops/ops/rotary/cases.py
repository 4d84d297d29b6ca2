"""The rotary harness and cases, and the cos/sin a model's rotary embedding returns."""

from __future__ import annotations

import torch

from ...testing.cases.base import Builder, Case, OpHarness, pick, same_dtype


def cos_sin(b: Builder, batch: int, seq: int, rotary_dim: int, theta: float = 10000.0):
    """What a model's rotary embedding returns: ``cat(freqs, freqs)`` cos/sin ``[B, S, R]``,
    at random position offsets per sequence (packed / shifted positions)."""
    offsets = torch.randint(0, 4 * seq + 1, (batch, 1), generator=b.gen).to(torch.float64)
    pos = offsets + torch.arange(seq, dtype=torch.float64)
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(b.dtype).to(b.device), emb.sin().to(b.dtype).to(b.device)


def _rotary_call(fn, inp, reference):
    q, k = fn(inp["q"], inp["k"], inp["cos"], inp["sin"])
    return q, k


def _rotary_cases(variant: str, size: str) -> list[Case]:
    def case(name, about, bsz, hq, hk, s, d, transposed=False):
        # partial: a quarter of the head rotates (Qwen3.5 / Qwen3-Next), at least 2 channels.
        r = d if variant == "full" else max(2, d // 4)

        def build(b: Builder):
            if transposed:
                q, k = b.bshd(bsz, hq, s, d), b.bshd(bsz, hk, s, d)
            else:
                q, k = b.randn(bsz, hq, s, d), b.randn(bsz, hk, s, d)
            cos, sin = cos_sin(b, bsz, s, r)
            return {"q": q, "k": k, "cos": cos, "sin": sin}

        label = f"{name}-r{r}" if variant == "partial" else name
        return Case(label, build, ("q", "k"), about)

    small = [
        case("mha-1x2x2x5x16", "one sequence, as many kv heads as q heads", 1, 2, 2, 5, 16),
        case("gqa-2x4x2x7x32", "grouped-query heads, odd sequence", 2, 4, 2, 7, 32),
        case("bshd-view-2x4x1x9x64", "q/k as the model passes them: [B,S,H,D] transposed (not contiguous)",
             2, 4, 1, 9, 64, transposed=True),
    ]
    full = [
        case("gqa-2x32x8x512x128", "32 q / 8 kv heads, head dim 128", 2, 32, 8, 512, 128),
        case("bshd-view-1x16x2x1031x256", "model layout, odd sequence, head dim 256", 1, 16, 2, 1031, 256,
             transposed=True),
        case("mha-4x8x8x257x64", "head dim 64, odd sequence", 4, 8, 8, 257, 64),
        case("seed-bshd-4x32x8x2048x128", "the seed benchmark's shape, model layout", 4, 32, 8, 2048, 128,
             transposed=True),
    ]
    return pick(size, small, full)


#: The ``rotary`` harness: how the conformance kit and the bench call its kernels, and its cases.
HARNESS = OpHarness(
    op="rotary",
    out_names=("q_out", "k_out"),
    reference={"full": "veomni_ops.ops.rotary.kernel:apply_rotary", "partial": "veomni_ops.ops.rotary.kernel:apply_rotary"},
    call=_rotary_call,
    out_dtypes=lambda dt: [same_dtype(dt), same_dtype(dt)],
    cases=_rotary_cases,
)
