"""Where a model departs from the plain Llama shape: what ``apply`` binds there, and that it is right.

Each test here pins one behaviour of transformers that a bound model must keep (a dropout
inside the MLP, ``return_dict=False``, positional arguments, an interleaved rotary layout,
multimodal rope, a config shared by two models).
"""

from __future__ import annotations

import copy

import pytest
import torch
import veomni_ops
from models_support import ALL_EAGER, assert_grads_close, batch, build, config, pair
from veomni_ops.binding import BindingError, survey

# -- Seed-OSS: the MLP applies residual dropout after down_proj --------------------------------


def test_seed_oss_mlp_keeps_residual_dropout(registry):
    ref, model = pair("seed_oss", residual_dropout=0.5)
    veomni_ops.apply(model, ALL_EAGER, registry=registry, device="cpu")
    x = torch.randn(2, 5, 64)
    for train in (True, False):
        ref.train(train)
        model.train(train)
        torch.manual_seed(3)
        want = ref.model.layers[0].mlp(x)
        torch.manual_seed(3)
        got = model.model.layers[0].mlp(x)
        if train:
            assert (want == 0).float().mean() > 0.3  # the dropout is real
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6,
                                   msg=lambda m, t=train: f"training={t}: patched Seed-OSS MLP differs: {m}")


# -- the causal-LM head keeps transformers' calling conventions ---------------------------------


@pytest.mark.parametrize("cfg", [ALL_EAGER, {}], ids=["eager", "auto"])
def test_return_dict_false_gives_tuple(cfg, registry):
    ref, model = pair("qwen3")
    veomni_ops.apply(model, cfg, registry=registry, device="cpu")
    b = batch()
    with torch.no_grad():
        r = ref(input_ids=b["input_ids"], return_dict=False)
        g = model(input_ids=b["input_ids"], return_dict=False)
    assert isinstance(g, tuple)
    torch.testing.assert_close(g[0], r[0], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        r = ref(**b, return_dict=False)
        g = model(**b, return_dict=False)
    assert isinstance(g, tuple)
    torch.testing.assert_close(g[0], r[0], atol=1e-5, rtol=1e-5)  # the loss comes first


def test_positional_arguments_mean_what_transformers_says(registry):
    """``model(input_ids, attention_mask, position_ids)`` as transformers' signature orders them."""
    ref, model = pair("qwen3")
    veomni_ops.apply(model, ALL_EAGER, registry=registry, device="cpu")
    b = batch(b=1)
    pos = torch.arange(5, 5 + b["input_ids"].shape[1])[None]  # shifted positions change the rope
    with torch.no_grad():
        r = ref(b["input_ids"], b["attention_mask"], pos)
        g = model(b["input_ids"], b["attention_mask"], pos)
    assert g.loss is None and r.loss is None
    torch.testing.assert_close(g.logits, r.logits, atol=1e-5, rtol=1e-5)


def test_generate_matches(registry):
    ref, model = pair("qwen3")
    veomni_ops.apply(model, {}, registry=registry, device="cpu")
    ids = batch(b=1)["input_ids"][:, :4]
    ref.eval()
    model.eval()
    out_r = ref.generate(ids, max_new_tokens=4, do_sample=False)
    out_g = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(out_g, out_r)


# -- DeepSeek-V3: rotary is bound only where the model calls the contract's layout ---------------


INTERLEAVED = ("its forward calls apply_rotary_pos_emb_interleave instead of apply_rotary_pos_emb when "
               "config.rope_interleave is set (here True), which a rotary kernel would not replace")


def test_deepseek_interleaved_rope_is_left_to_the_model_with_why(counting_registry, counter):
    model = build("deepseek_v3")
    assert model.config.rope_interleave is True  # transformers' default
    assert {p.left for p in survey(model) if p.op == "rotary"} == {INTERLEAVED}
    with pytest.raises(BindingError, match="rotary_pos_emb_implementation='counting'") as ei:
        veomni_ops.apply(model, {"rotary_pos_emb_implementation": "counting"}, registry=counting_registry, device="cpu")
    assert f"at model.layers.0.self_attn: {INTERLEAVED}" in str(ei.value)
    binding = veomni_ops.apply(model, {}, registry=counting_registry, device="cpu")
    assert [(p, why) for p, op, why in binding.skipped if op == "rotary"] == [
        (f"model.layers.{i}.self_attn", INTERLEAVED) for i in range(2)]
    assert "rotary" not in binding.summary()


# -- a rotary function that is not the contract's: left to the model, with why -------------------


def _interleaved_rotary(q, k, cos, sin):
    """A rotary of another layout (pairs (x0, x1), (x2, x3), ... instead of halves)."""
    def rot(x):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def _raising_rotary(q, k, cos, sin):
    raise RuntimeError("needs position_ids")


@pytest.mark.parametrize("fn, why", [
    (_interleaved_rotary, "does not compute the contract's rotate_half form"),
    (_raising_rotary, "raised RuntimeError: needs position_ids when probed with the contract's inputs"),
], ids=["other_layout", "raises"])
def test_a_rotary_that_is_not_the_contracts_is_left_with_why(fn, why, counting_registry, counter, monkeypatch):
    """A model whose apply_rotary_pos_emb fails the probe: each attention's rotary is a place left
    to the model's code, named with the reason (the binding lists it), and a kernel named for it
    is refused with that reason, not "no place"."""
    from transformers.models.qwen3 import modeling_qwen3

    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", fn)
    model = build("qwen3")
    name = f"{__name__}.{fn.__qualname__}"
    binding = veomni_ops.apply(model, {}, registry=counting_registry, device="cpu")
    left = [(p, w) for p, op, w in binding.skipped if op == "rotary"]
    assert [p for p, _ in left] == ["model.layers.0.self_attn", "model.layers.1.self_attn"], binding
    assert all(f"its apply_rotary_pos_emb ({name}) {why}" in w for _, w in left), left
    assert "rotary" not in binding.summary() and binding.summary()["attention"] == 2
    # the two rotaries, and the two post-attention norms residual_rms_norm's (counting) kernel computes
    assert "4 left to the model's own code" in str(binding) and f"({name}) {why}" in str(binding)
    binding.remove()
    with pytest.raises(BindingError, match="rotary_pos_emb_implementation='counting' at model.layers.0.self_attn: "
                                           f"its apply_rotary_pos_emb \\({name}\\) {why}"):
        veomni_ops.apply(model, {"rotary_pos_emb_implementation": "counting"}, registry=counting_registry,
                         device="cpu")


def test_deepseek_plain_rope_binds_and_is_called(counting_registry, counter):
    ref, model = pair("deepseek_v3", rope_interleave=False)
    veomni_ops.apply(model, {"rotary_pos_emb_implementation": "counting"}, registry=counting_registry, device="cpu")
    b = batch()
    r, g = ref(**b), model(**b)
    assert counter[("rotary", "full")] == 2  # one call per attention layer
    torch.testing.assert_close(g.loss, r.loss, atol=1e-5, rtol=1e-5)
    r.loss.backward()
    g.loss.backward()
    assert_grads_close(ref, model, atol=1e-5, rtol=1e-4)


# -- Qwen2-VL: multimodal rope, vision tower -----------------------------------------------------


def _vl_batch():
    torch.manual_seed(5)
    ids = torch.randint(0, 100, (1, 12))
    # two images: grid (1, 2, 2) -> 1 merged token, grid (1, 2, 4) -> 2 merged tokens
    ids[0, 2:5] = torch.tensor([122, 120, 123])
    ids[0, 6:10] = torch.tensor([122, 120, 120, 123])
    return {
        "input_ids": ids,
        "labels": ids.clone(),
        "pixel_values": torch.randn(12, 3 * 2 * 14 * 14),
        "image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 4]]),
        "mm_token_type_ids": (ids == 120).int(),
    }


def test_qwen2_vl_mrope_rotary_binds_and_is_called(counting_registry, counter):
    """M-RoPE's sections are recomposed inside the rotary embedding module: what reaches
    apply_rotary_pos_emb is plain rotate_half cos/sin [B, S, D], so the rotary kernel binds
    (full) and must reproduce the model, text-only and with images."""
    ref, model = pair("qwen2_vl")
    binding = veomni_ops.apply(model, {"rotary_pos_emb_implementation": "counting"}, registry=counting_registry,
                               device="cpu")
    rot = [x for x in binding.bound if x[1] == "rotary"]
    assert [(p, v) for p, _, v, _ in rot] == [
        ("model.language_model.layers.0.self_attn", "full"),
        ("model.language_model.layers.1.self_attn", "full"),
    ]
    for b in (batch(), _vl_batch()):
        counter.clear()
        r, g = ref(**b), model(**b)
        assert counter[("rotary", "full")] == 2
        torch.testing.assert_close(g.loss, r.loss, atol=1e-5, rtol=1e-5)


def test_qwen2_vl_with_images_all_eager(registry):
    """The vision tower's attention is bound too (non-causal, per image): same loss and grads."""
    ref, model = pair("qwen2_vl")
    binding = veomni_ops.apply(model, ALL_EAGER, registry=registry, device="cpu")
    assert ("model.visual.blocks.0.attn", "attention", "standard", "eager") in binding.bound
    b = _vl_batch()
    r, g = ref(**b), model(**b)
    torch.testing.assert_close(g.loss, r.loss, atol=1e-5, rtol=1e-5)
    r.loss.backward()
    g.loss.backward()
    assert_grads_close(ref, model, atol=1e-5, rtol=1e-4)
    assert model.model.visual.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


# -- a config object shared by two models ----------------------------------------------------------


def test_apply_does_not_touch_a_shared_config(counting_registry, counter):
    """Two models built from one config object share it in transformers; binding one must
    not change how the other builds its masks or picks its attention."""
    cfg = config("qwen3")
    teacher = build("qwen3", cfg=cfg)
    student = build("qwen3", cfg=cfg, seed=1)
    assert teacher.config is student.config
    before = cfg._attn_implementation
    b = batch()
    with torch.no_grad():
        out_before = teacher(**b).logits
    veomni_ops.apply(student, {"attn_implementation": "eager"}, registry=counting_registry, device="cpu")
    assert teacher.config._attn_implementation == before
    assert teacher.model.layers[0].self_attn.config._attn_implementation == before
    with torch.no_grad():
        assert torch.equal(teacher(**b).logits, out_before)


# -- heads that change the logits after lm_head -----------------------------------------------------


def _gemma2(softcap, attn_softcap=None):
    import transformers as T

    cfg = T.Gemma2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=128, final_logit_softcapping=softcap,
                         attn_logit_softcapping=attn_softcap)
    torch.manual_seed(0)
    return T.Gemma2ForCausalLM(cfg).train()


def _granite():
    import transformers as T

    cfg = T.GraniteConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=128, logits_scaling=4.0)
    torch.manual_seed(0)
    return T.GraniteForCausalLM(cfg).train()


@pytest.mark.parametrize("make", [lambda: _gemma2(0.5), _granite], ids=["gemma2_softcap", "granite_logits_scaling"])
def test_head_that_rescales_logits_is_not_replaced(make, counting_registry, counter):
    """Gemma-2's final_logit_softcapping / Granite's logits_scaling act between lm_head and the
    loss: the core's causal-LM head would silently drop them. The cross_entropy place is left
    (with why): a named CE kernel is refused, auto leaves transformers' head (and loss) alone
    and the binding says so."""
    ref = make()
    model = copy.deepcopy(ref)
    [place] = [p for p in survey(model) if p.op == "cross_entropy"]
    assert place.left and "rescales its logits" in place.left
    with pytest.raises(BindingError, match="cross_entropy_loss_implementation='counting'.*rescales its logits"):
        veomni_ops.apply(model, {"cross_entropy_loss_implementation": "counting"}, registry=counting_registry,
                         device="cpu")
    binding = veomni_ops.apply(model, {}, registry=counting_registry, device="cpu")
    assert [(p, op) for p, op, why in binding.skipped if "rescales its logits" in why] == [("", "cross_entropy")]
    b = batch()
    r, g = ref(**b), model(**b)
    assert counter[("cross_entropy", "fused_linear")] == 0
    torch.testing.assert_close(g.loss, r.loss, atol=1e-5, rtol=1e-5)


def test_gemma2_without_softcap_keeps_its_ce_place():
    assert [(p.op, p.left) for p in survey(_gemma2(None)) if p.op == "cross_entropy"] == [("cross_entropy", None)]


def test_auto_attention_on_softcapped_attention_model_runs(registry):
    """Gemma-2's attention passes softcap: auto passes over sdpa (which cannot honour it) and
    takes eager, saying why; the model then runs and matches transformers."""
    ref = _gemma2(None, attn_softcap=50.0)
    model = copy.deepcopy(ref)
    binding = veomni_ops.apply(model, {}, registry=registry, device="cpu")
    entry = binding.plan.get("attention", "standard")
    assert entry.kernel == "eager"
    assert "sdpa (does not honour softcap" in entry.reason
    b = batch()
    torch.testing.assert_close(model(**b).loss, ref(**b).loss, atol=1e-5, rtol=1e-5)


def test_named_kernel_that_cannot_softcap_is_refused_at_apply(registry):
    model = _gemma2(None, attn_softcap=50.0)
    with pytest.raises(veomni_ops.ResolutionError, match="sdpa.*does not honour softcap"):
        veomni_ops.apply(model, {"attn_implementation": "sdpa"}, registry=registry, device="cpu")
    assert not hasattr(model, "veomni_ops_binding")
