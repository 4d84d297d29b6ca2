"""The family matrix: every causal-LM family binding supports, bound with all-``eager`` and
all-``auto`` plans, against unpatched transformers (float32 on CPU, within 1e-5), and with
a counting backend that proves every bound kernel is really called.

Families a given transformers release does not have are skipped (``models_support.build``).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import veomni_ops
from models_support import ALL_EAGER, AUX_LOSS_FAMILIES, FAMILIES, assert_grads_close, batch, build, pair
from veomni_ops.binding import survey

TOL = dict(atol=1e-5, rtol=1e-5)
GRAD_TOL = dict(atol=1e-5, rtol=1e-4)

#: What binding leaves to transformers in each family, and why (asserted: a new release that
#: gains or loses a place shows up here).
NOT_BOUND = {
    "gemma": {"swiglu"},  # GELU-tanh MLP, not SiLU
    "gemma2": {"swiglu", "cross_entropy"},  # GELU-tanh; final_logit_softcapping between lm_head and the loss
    "gemma3": {"swiglu", "rotary"},  # GELU-tanh; local and global rotary embeddings of different bases
    "gpt_oss": {"rotary", "moe_experts", "swiglu"},  # chunked (not rotate_half) rope; experts with biases, clamped act
    "granite": {"cross_entropy"},  # logits_scaling between lm_head and the loss
    "qwen3_moe": {"swiglu"},  # every layer sparse
    "mixtral": {"swiglu"},  # every layer sparse
    "deepseek_v3": {"rotary"},  # interleaved rope by default
}


def _kw(name: str) -> dict:
    return {"output_router_logits": True} if name in AUX_LOSS_FAMILIES else {}


def _against_transformers(name: str, config, registry):
    ref, model = pair(name)
    binding = veomni_ops.apply(model, config, registry=registry, device="cpu")
    b, kw = batch(), _kw(name)
    keep = b["attention_mask"].bool()  # padded positions attend to nothing: implementation-defined
    with torch.no_grad():
        r = ref(input_ids=b["input_ids"], attention_mask=b["attention_mask"], **kw)
        g = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], **kw)
    torch.testing.assert_close(g.logits[keep], r.logits[keep], **TOL)
    r, g = ref(**b, **kw), model(**b, **kw)
    torch.testing.assert_close(g.loss, r.loss, **TOL)
    if name in AUX_LOSS_FAMILIES:
        torch.testing.assert_close(g.aux_loss, r.aux_loss, **TOL)
    r.loss.backward()
    g.loss.backward()
    assert assert_grads_close(ref, model, **GRAD_TOL) > 10
    return binding


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("plan", ["eager", "auto"])
def test_family_matches_transformers(name, plan, registry):
    binding = _against_transformers(name, ALL_EAGER if plan == "eager" else {}, registry)
    ops = {op for _, op, _, _ in binding.bound}
    found = {p.op for p in survey(build(name)) if not p.left}
    assert ops == found, "every place found is bound"
    expected_missing = NOT_BOUND.get(name, set())
    core_ops = {"rms_norm", "attention", "rotary", "swiglu", "cross_entropy"}
    assert core_ops - ops == expected_missing - {"moe_experts"}, f"{name}: unexpected set of bound ops {sorted(ops)}"


@pytest.mark.parametrize("name", FAMILIES)
def test_every_bound_kernel_is_called(name, counting_registry, counter):
    """auto with a priority-50 counting backend: each bound place calls its kernel in forward."""
    ref, model = pair(name)
    binding = veomni_ops.apply(model, {}, registry=counting_registry, device="cpu")
    # Text only: the vision tower's places (Qwen2-VL, Qwen2.5-VL) run only with pixel values.
    bound = Counter((op, variant) for path, op, variant, kernel in binding.bound
                    if kernel == "counting" and not path.startswith(("visual", "model.visual")))
    assert bound, "the counting backend was bound somewhere"
    b, kw = batch(), _kw(name)
    out = model(**b, **kw)
    out.loss.backward()
    torch.testing.assert_close(out.loss, ref(**b, **kw).loss, **TOL)
    for (op, variant), places in bound.items():
        # A head is one place called once; rotary/attention/norm/mlp/experts once per module per forward.
        assert counter[(op, variant)] >= places, (
            f"{name}: {op}/{variant} bound at {places} place(s) but called {counter[(op, variant)]} time(s)")
    every = {(e.op, e.variant) for e in binding.plan.entries if e.kernel == "counting"}
    if ("cross_entropy", "fused_linear") in bound and ("cross_entropy", "logits") in every:
        # the head's logits path: evaluation returns the logits and computes the loss from them
        counter.clear()
        model.eval()
        with torch.no_grad():
            assert model(**b, **kw).logits is not None
        assert counter[("cross_entropy", "logits")] == 1 and counter[("cross_entropy", "fused_linear")] == 0
        every.discard(("cross_entropy", "logits"))
    assert every == set(bound), "every kernel the plan chose was bound (in the text model) and called"
