"""The moe_experts harness and cases."""

from __future__ import annotations

import math

import torch

from ...testing.cases.base import Builder, Case, OpHarness, pick, same_dtype


def _moe_call(fn, inp, reference):
    return (fn(inp["hidden_states"], inp["top_k_index"], inp["top_k_weights"], inp["gate_up_proj"], inp["down_proj"]),)


def _moe_cases(variant: str, size: str) -> list[Case]:
    # H and I are multiples of 8, as in every real model: grouped GEMMs need 16-byte rows.
    def case(name, about, t, e, k, h, i, routing="random", pad=0):
        def build(b: Builder):
            hidden = b.strided(t, h, pad=pad) if pad else b.randn(t, h)
            if routing == "random":  # k distinct experts per token
                index = b.perms(t, e)[:, :k].contiguous()
            elif routing == "idle":  # only the first half of the experts get tokens
                index = b.perms(t, max(k, e // 2))[:, :k].contiguous()
            elif routing == "one":  # every route to one expert
                index = torch.full((t, k), e // 2, dtype=torch.long)
            elif routing == "duplicate":  # distinct routes, then every other token lists an expert twice
                index = b.perms(t, e)[:, :k].clone()
                index[::2, 1] = index[::2, 0]
            elif routing == "hot":  # half the tokens all go to expert 0 (load imbalance)
                index = b.perms(t, e)[:, :k].clone()
                hot = index[: t // 2]
                has0 = (hot == 0).any(dim=1)
                hot[~has0, 0] = 0
            else:
                raise ValueError(routing)
            router = torch.randn(t, k, generator=b.gen, dtype=torch.float64).softmax(-1)
            return {
                "hidden_states": hidden,
                "top_k_index": index.to(b.device),
                "top_k_weights": router.to(b.dtype).to(b.device),
                "gate_up_proj": b.randn(e, 2 * i, h, scale=1 / math.sqrt(h)),
                "down_proj": b.randn(e, h, i, scale=1 / math.sqrt(i)),
            }

        return Case(name, build, ("hidden_states", "top_k_weights", "gate_up_proj", "down_proj"), about)

    small = [
        case("random-13tok-e5-k2", "odd token count, random distinct routes", 13, 5, 2, 16, 24),
        case("idle-experts-16tok-e8-k2", "half the experts get no token", 16, 8, 2, 16, 8, routing="idle"),
        case("one-expert-9tok-e4-k2", "every route goes to one expert", 9, 4, 2, 8, 16, routing="one"),
        case("duplicate-routes-10tok-e4-k2", "tokens that list the same expert twice", 10, 4, 2, 16, 16,
             routing="duplicate"),
        case("strided-hidden-11tok-e4-k3", "hidden rows with a stride", 11, 4, 3, 16, 8, pad=8),
    ]
    full = [
        case("random-1031tok-e64-k8", "64 experts, top-8", 1031, 64, 8, 1024, 512),
        case("idle-experts-512tok-e128-k8", "half of 128 experts idle", 512, 128, 8, 512, 256, routing="idle"),
        case("hot-expert-1024tok-e32-k4", "half the tokens on expert 0", 1024, 32, 4, 1024, 768, routing="hot"),
        case("duplicate-routes-257tok-e16-k4", "duplicate routes", 257, 16, 4, 512, 384, routing="duplicate"),
        case("one-expert-300tok-e8-k2", "every route to one expert", 300, 8, 2, 1024, 512, routing="one"),
    ]
    return pick(size, small, full)


#: The ``moe_experts`` harness: how the conformance kit and the bench call its kernels, and its cases.
HARNESS = OpHarness(
    op="moe_experts",
    out_names=("out",),
    reference={"standard": "veomni_ops.ops.moe_experts.kernel:moe_experts_eager"},
    call=_moe_call,
    out_dtypes=lambda dt: [same_dtype(dt)],
    cases=_moe_cases,
)
