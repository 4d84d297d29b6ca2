"""The attention harness and cases, and the module stand-in its kernels receive."""

from __future__ import annotations

import torch

from ...testing.cases.base import Builder, Case, OpHarness, pick, same_dtype


class AttentionModule(torch.nn.Module):
    """The attributes transformers' attention modules carry that kernels read."""

    def __init__(self, head_dim: int, is_causal: bool):
        super().__init__()
        self.head_dim = head_dim
        self.is_causal = is_causal
        self.scaling = head_dim**-0.5
        self.layer_idx = 0
        self.eval()  # conformance is checked without dropout


def _attn_call(fn, inp, reference):
    mask = inp["ref_attention_mask"] if reference and "ref_attention_mask" in inp else inp["attention_mask"]
    out = fn(inp["module"], inp["query"], inp["key"], inp["value"], mask, dropout=0.0, scaling=inp["scaling"])
    if not isinstance(out, (tuple, list)) or len(out) < 1:
        raise TypeError(f"attention kernel returned {type(out).__name__}; the contract is (output, weights or None)")
    return (out[0],)


def _attn_out_masks(inp):
    rows = inp.get("valid_rows")  # [B, S] bool: padded query rows do not count
    return [None if rows is None else rows[:, :, None, None]]


def _attn_cases(variant: str, size: str) -> list[Case]:
    def case(name, about, bsz, hq, hk, s, d, *, causal=True, layout="plain", mask=None):
        def build(b: Builder):
            mk = b.bshd if layout == "bshd" else (lambda bb, h, ss, dd: b.randn(bb, h, ss, dd))
            q, k, v = mk(bsz, hq, s, d), mk(bsz, hk, s, d), mk(bsz, hk, s, d)
            out = {"module": AttentionModule(d, causal), "query": q, "key": k, "value": v,
                   "attention_mask": None, "scaling": d**-0.5}
            if mask:
                # right padding: sequence r has lens[r] real tokens; the first is full length
                lens = torch.randint(max(1, s // 3), s + 1, (bsz,), generator=b.gen)
                lens[0] = s
                valid = (torch.arange(s)[None, :] < lens[:, None]).to(b.device)  # [B, S]
                allowed = valid[:, None, None, :].expand(bsz, 1, s, s)
                if causal:
                    allowed = allowed & torch.ones(s, s, dtype=torch.bool, device=b.device).tril()
                if mask == "4d-bool":
                    out["attention_mask"] = allowed
                elif mask == "4d-additive":
                    neg = torch.finfo(b.dtype).min
                    zero = torch.zeros((), dtype=b.dtype, device=b.device)
                    out["attention_mask"] = torch.where(allowed, zero, torch.full((), neg, dtype=b.dtype, device=b.device))
                elif mask == "2d":
                    out["attention_mask"] = valid.long()  # the padding mask flash implementations receive
                    out["ref_attention_mask"] = allowed
                out["valid_rows"] = valid
            return out

        return Case(name, build, ("query", "key", "value"), about, optional=mask is not None)

    small = [
        case("causal-gqa-1x4x2x9x16", "causal, 4 q / 2 kv heads, odd sequence", 1, 4, 2, 9, 16),
        case("causal-mha-2x2x2x16x32", "causal, batch 2", 2, 2, 2, 16, 32),
        case("bshd-view-2x4x1x12x32", "model layout ([B,S,H,D] transposed), 4:1 GQA", 2, 4, 1, 12, 32, layout="bshd"),
        case("bidirectional-1x2x2x7x16", "module.is_causal = False", 1, 2, 2, 7, 16, causal=False),
        case("padding-4d-bool-3x4x2x10x16", "padding as a 4-D boolean mask (eager/sdpa form)", 3, 4, 2, 10, 16,
             causal=False, mask="4d-bool"),
        case("padding-4d-additive-2x2x2x8x16", "padding as a 4-D additive mask", 2, 2, 2, 8, 16, causal=False,
             mask="4d-additive"),
        case("padding-2d-3x4x2x10x16", "padding as a 2-D [B, S] mask (flash form)", 3, 4, 2, 10, 16, causal=False,
             mask="2d"),
    ]
    full = [
        case("causal-gqa-2x16x4x1024x128", "causal, 16 q / 4 kv heads, head dim 128", 2, 16, 4, 1024, 128),
        case("bshd-view-1x32x8x1031x128", "model layout, odd sequence", 1, 32, 8, 1031, 128, layout="bshd"),
        case("causal-mha-1x8x8x2048x64", "head dim 64, sequence 2048", 1, 8, 8, 2048, 64),
        case("bidirectional-2x8x2x777x128", "not causal, odd sequence", 2, 8, 2, 777, 128, causal=False),
        case("padding-4d-bool-4x8x2x512x128", "padding, 4-D boolean mask", 4, 8, 2, 512, 128, causal=False,
             mask="4d-bool"),
        case("padding-2d-4x8x2x512x128", "padding, 2-D mask (flash form)", 4, 8, 2, 512, 128, causal=False,
             mask="2d"),
    ]
    return pick(size, small, full)


#: The ``attention`` harness: how the conformance kit and the bench call its kernels, and its cases.
HARNESS = OpHarness(
    op="attention",
    out_names=("out",),
    reference={"standard": "veomni_ops.ops.attention.kernel:eager_attention"},
    call=_attn_call,
    out_dtypes=lambda dt: [same_dtype(dt)],
    cases=_attn_cases,
    out_masks=_attn_out_masks,
)
