"""grouped_mm experts vs the eager loop inside Qwen3-MoE, with forced routing.

Layer 0's router weight is zeroed: every token gets identical (uniform) router logits, so
all tokens go to the same top-k experts and the others get no token at all; layer 1
routes randomly. ``grouped_mm`` is declared for bfloat16 only (its compiled path), so the
model comparison runs in bfloat16; the experts' own inputs, captured from the model's
forward, are also compared in float32 (the CPU kernel runs it eagerly).
"""

from __future__ import annotations

import copy

import pytest
import torch
import veomni_ops
from models_support import batch, build
from veomni_ops import ResolutionError


def _forced(top_k: int, dtype: torch.dtype) -> torch.nn.Module:
    model = build("qwen3_moe", dtype, num_experts_per_tok=top_k)
    with torch.no_grad():
        model.model.layers[0].mlp.gate.weight.zero_()
    return model


def _routes(model, b) -> list[torch.Tensor]:
    """Per MoE layer, how many routes each expert receives (from the model's own router)."""
    seen: list[torch.Tensor] = []

    def hook(mod, args):
        seen.append(torch.bincount(args[1].reshape(-1), minlength=4))

    hs = [layer.mlp.experts.register_forward_pre_hook(hook) for layer in model.model.layers]
    with torch.no_grad():
        model(input_ids=b["input_ids"])
    for h in hs:
        h.remove()
    return seen


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("top_k", [1, 2])
def test_grouped_mm_matches_eager_loop_with_forced_routing(top_k, registry):
    base = _forced(top_k, torch.bfloat16)
    b = batch()
    tokens = b["input_ids"].numel()
    counts = _routes(base, b)
    # Layer 0: top_k experts take every token, the rest none.
    assert sorted(counts[0].tolist(), reverse=True) == [tokens] * top_k + [0] * (4 - top_k)
    assert counts[1].sum() == tokens * top_k

    loop, grouped = copy.deepcopy(base), copy.deepcopy(base)
    bl = veomni_ops.apply(loop, {"moe_implementation": "eager"}, registry=registry, device="cpu")
    bg = veomni_ops.apply(grouped, {"moe_implementation": "grouped_mm"}, registry=registry, device="cpu")
    assert bl.plan.get("moe_experts", "standard").kernel == "eager"
    assert bg.plan.get("moe_experts", "standard").kernel == "grouped_mm"

    kw = {"output_router_logits": True}
    outs = [m(**b, **kw) for m in (base, loop, grouped)]
    for o in outs:
        o.loss.backward()
    r, lo, gr = outs
    # The loop is transformers' own expert computation; the aux loss is not bitwise: veomni-ops'
    # load-balancing loss takes the router softmax in float32, transformers in the logits' bfloat16
    # (ops/load_balancing_loss/kernel.py). Measured 2.1e-4 relative on an AMD EPYC (AVX2), 0 on
    # another CPU; the bound is bfloat16's half-ulp, 2^-9, the most one rounded probability moves.
    # The loss adds 0.001 x aux, so it differs by float32 rounding.
    torch.testing.assert_close(lo.aux_loss, r.aux_loss.float(), rtol=2.0**-9, atol=0)
    torch.testing.assert_close(lo.loss, r.loss, rtol=2e-6, atol=0)
    # grouped_mm: bfloat16 with another summation order.
    assert abs(gr.loss.item() - lo.loss.item()) < 2e-2
    torch.testing.assert_close(gr.aux_loss, lo.aux_loss)  # routing is upstream of the experts: identical
    for (n, pl), pg in zip(loop.named_parameters(), grouped.parameters()):
        assert (pl.grad is None) == (pg.grad is None), n
        if pl.grad is None or pl.grad.abs().max() == 0:
            continue
        assert _rel_err(pg.grad, pl.grad) < 3e-2, f"grad of {n}: relative error {_rel_err(pg.grad, pl.grad):.3g}"
    # Experts that got no token have zero gradient in both.
    g0 = grouped.model.layers[0].mlp.experts.gate_up_proj.grad
    idle = (counts[0] == 0).nonzero().flatten()
    assert idle.numel() == 4 - top_k
    assert torch.all(g0[idle] == 0) and torch.all(loop.model.layers[0].mlp.experts.gate_up_proj.grad[idle] == 0)


def test_grouped_mm_kernel_on_captured_expert_inputs_float32():
    """Inputs captured from a real forward (forced layer 0, random layer 1), in float32: tight."""
    from veomni_ops.kernels.moe import moe_experts_eager, moe_experts_grouped_mm

    model = _forced(2, torch.float32)
    captured = []
    hs = [layer.mlp.experts.register_forward_pre_hook(lambda m, a: captured.append((m, a)))
          for layer in model.model.layers]
    with torch.no_grad():
        model(input_ids=batch()["input_ids"])
    for h in hs:
        h.remove()
    assert len(captured) == 2
    for mod, (hidden, idx, w) in captured:
        want = moe_experts_eager(hidden, idx, w, mod.gate_up_proj, mod.down_proj)
        got = moe_experts_grouped_mm(hidden, idx, w, mod.gate_up_proj, mod.down_proj)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        with torch.no_grad():
            torch.testing.assert_close(mod(hidden, idx, w), want, atol=1e-6, rtol=1e-6)  # transformers' loop


def test_grouped_mm_refused_in_float32_auto_takes_eager(registry):
    """grouped_mm declares bfloat16 only: named in a float32 model it is refused, saying why."""
    with pytest.raises(ResolutionError, match="does not support dtype float32"):
        veomni_ops.apply(build("qwen3_moe"), {"moe_implementation": "grouped_mm"}, registry=registry, device="cpu")
    b = veomni_ops.apply(build("qwen3_moe"), {}, registry=registry, device="cpu")
    e = b.plan.get("moe_experts", "standard")
    assert e.kernel == "eager" and "grouped_mm (does not support dtype float32" in e.reason
