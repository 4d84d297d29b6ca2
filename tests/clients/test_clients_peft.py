"""PEFT LoRA: ``get_peft_model`` on a bound model, and ``veomni_ops.apply`` on a PEFT model;
training, then ``merge_and_unload``, against the same with the unbound model.

LoRA targets the attention projections and, in the dense model, the MLP's; in the MoE model
the routed experts' 3-D weights (``target_parameters``: PEFT wraps the parameter, which the
bound experts kernel reads). ``init_lora_weights=False`` makes ``B`` random too, so the
adapters change the output (and every adapter gets a gradient) from the first step.
"""

from __future__ import annotations

import copy

import peft
import pytest
import torch
import veomni_ops
from clients_support import (
    FP32_LOSS,
    MODELS,
    assert_bf16_no_worse,
    assert_binds_the_head,
    assert_runs_close,
    batches,
    bound_pair,
    describe,
    model_kwargs,
    train,
)
from models_support import build

STEPS = 5


def lora(name: str, **over):
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    extra: dict = {}
    if name == "qwen3":
        targets += ["gate_proj", "up_proj", "down_proj"]
    else:
        extra["target_parameters"] = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    return peft.LoraConfig(**{"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "init_lora_weights": False,
                              "target_modules": targets, **extra, **over})


def wrap(model, config):
    torch.manual_seed(1)  # LoRA's initial weights: the same on both sides
    return peft.get_peft_model(model, config)


def _merged_match(pu, pb, name: str, what: str) -> None:
    """merge_and_unload on both: the merged models' outputs (eval logits, training loss) agree."""
    mu, mb = pu.merge_and_unload(), pb.merge_and_unload()
    assert not any("lora" in n for n, _ in mb.named_parameters()), f"{what}: LoRA weights left after merge_and_unload"
    b = batches(1, b=2, seed=7)[0]
    mu.eval(), mb.eval()
    with torch.no_grad():
        ou, ob = mu(**b), mb(**b)
    assert describe(ob) == describe(ou), f"{what}: merged model's output {describe(ob)} vs unbound {describe(ou)}"
    torch.testing.assert_close(ob.logits, ou.logits, rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"{what}: logits of the merged models differ: {m}")
    torch.testing.assert_close(ob.loss, ou.loss, rtol=FP32_LOSS, atol=0,
                               msg=lambda m: f"{what}: eval loss of the merged models differs: {m}")
    mu.train(), mb.train()
    lu, lb = mu(**b).loss, mb(**b).loss
    torch.testing.assert_close(lb, lu, rtol=FP32_LOSS, atol=0,
                               msg=lambda m: f"{what}: training loss of the merged models differs: {m}")


def _lora_grads_everywhere(run, config_targets: str) -> None:
    names = run.grads[-1].keys()
    assert any("lora_A" in n for n in names) and all("lora" in n for n in names), (
        f"the trainable parameters should be the LoRA adapters ({config_targets}): {sorted(names)}")
    zero = [n for n, g in run.grads[-1].items() if not g.any()]
    assert not zero, f"adapters with an all-zero gradient: {zero}"


@pytest.mark.parametrize("name", MODELS)
def test_get_peft_model_on_a_bound_model_trains_and_merges_like_unbound(name):
    unbound, bound, _ = bound_pair(name)
    pu, pb = wrap(unbound, lora(name)), wrap(bound, lora(name))
    data = batches(STEPS)
    ru, rb = train(pu, data), train(pb, data, keep_outputs=True)
    what = f"LoRA (get_peft_model after apply) on {name}"
    assert_runs_close(ru, rb, what)
    _lora_grads_everywhere(rb, "get_peft_model after apply")
    assert all(o.logits is None for o in rb.outputs), f"{what}: the fused loss did not run in training"
    _merged_match(pu, pb, name, what)


@pytest.mark.parametrize("name", MODELS)
def test_apply_on_a_peft_model_binds_the_inner_model_and_merges_like_unbound(name):
    base = build(name, **model_kwargs(name))
    pu, pb = wrap(copy.deepcopy(base), lora(name)), wrap(copy.deepcopy(base), lora(name))
    binding = veomni_ops.apply(pb, {}, device="cpu")
    assert_binds_the_head(name, binding)
    data = batches(STEPS)
    ru, rb = train(pu, data), train(pb, data, keep_outputs=True)
    what = f"apply on a PeftModel ({name})"
    assert_runs_close(ru, rb, what)
    _lora_grads_everywhere(rb, "apply after get_peft_model")
    assert all(o.logits is None for o in rb.outputs), f"{what}: the inner model's fused loss did not run in training"
    _merged_match(pu, pb, name, what)


@pytest.mark.parametrize("head, order", [
    ("lora", "apply_then_peft"),
    ("lora", "peft_then_apply"),
    ("modules_to_save", "apply_then_peft"),
    ("modules_to_save", "peft_then_apply"),
])
def test_an_adapted_lm_head_trains_through_the_bound_loss(head, order):
    """LoRA on ``lm_head`` (or a trainable copy of it, ``modules_to_save``): the bound loss
    head must compute the loss through the adapted head, as transformers does, whichever
    came first: a fused loss that reads ``lm_head.weight`` would skip the adapter."""
    over = {"target_modules": ["q_proj", "lm_head"]} if head == "lora" else {
        "target_modules": ["q_proj"], "modules_to_save": ["lm_head"]}
    base = build("qwen3")
    pu = wrap(copy.deepcopy(base), lora("qwen3", **over))
    if order == "apply_then_peft":
        bound = copy.deepcopy(base)
        veomni_ops.apply(bound, {}, device="cpu")
        pb = wrap(bound, lora("qwen3", **over))
    else:
        pb = wrap(copy.deepcopy(base), lora("qwen3", **over))
        veomni_ops.apply(pb, {}, device="cpu")
    data = batches(STEPS)
    ru, rb = train(pu, data), train(pb, data)
    assert any("lm_head" in n for n in ru.grads[0]), "the unbound model's lm_head adapter got no gradient"
    assert_runs_close(ru, rb, f"qwen3 with {head} on lm_head ({order})")


@pytest.mark.parametrize("name", MODELS)
def test_peft_bf16_autocast_matches_unbound(name):
    unbound, bound, _ = bound_pair(name)
    reference = copy.deepcopy(unbound)
    pu, pb, pr = wrap(unbound, lora(name)), wrap(bound, lora(name)), wrap(reference, lora(name))
    data = batches(STEPS)
    assert_bf16_no_worse(train(pr, data), train(pu, data, bf16=True), train(pb, data, bf16=True),
                         f"LoRA on {name}, bf16 autocast")
