"""User code is never silently dropped: a method a user's subclass overrides is not replaced."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
import veomni_ops
from models_support import ALL_EAGER, batch, build
from veomni_ops.binding import BindingError, survey


class ScaledLossQwen3(T.Qwen3ForCausalLM):
    """A user's causal LM: an extra loss term and a logit transform in its own forward."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 0.5 if out.logits is not None else None
        if out.loss is not None:
            out.loss = out.loss * 10.0 + 0.125
        return out


class LoudRMSNorm(T.models.qwen3.modeling_qwen3.Qwen3RMSNorm):
    def forward(self, hidden_states):
        return super().forward(hidden_states) * 2.0


def _user_model():
    torch.manual_seed(0)
    base = build("qwen3")
    model = ScaledLossQwen3(base.config)
    model.load_state_dict(base.state_dict())
    return model.train()


@pytest.mark.parametrize("cfg", [{}, ALL_EAGER], ids=["auto", "eager"])
def test_user_forward_survives_auto_and_eager(cfg, counting_registry, counter):
    ref = _user_model()
    model = copy.deepcopy(ref)
    binding = veomni_ops.apply(model, cfg, registry=counting_registry, device="cpu")
    assert "forward" not in model.__dict__, "the user's forward was replaced"
    assert [s for s in binding.skipped if s[1] == "cross_entropy"] == [
        ("", "cross_entropy", f"user code: {__name__}.ScaledLossQwen3.forward")]
    b = batch()
    r, g = ref(**b), model(**b)
    torch.testing.assert_close(g.loss, r.loss, atol=1e-5, rtol=1e-5)  # x10 + 0.125 kept
    if not cfg:  # the rest of the model is still bound to (and calls) the plan's kernels
        assert counter[("rms_norm", "standard")] > 0 and counter[("attention", "standard")] > 0


def test_named_kernel_for_an_overridden_method_is_refused(registry):
    model = _user_model()
    with pytest.raises(BindingError) as ei:
        veomni_ops.apply(model, {"cross_entropy_loss_implementation": "chunked"}, registry=registry, device="cpu")
    msg = str(ei.value)
    assert f"{__name__}.ScaledLossQwen3.forward is user code" in msg
    assert "cross_entropy_loss_implementation='chunked'" in msg and "'auto' or 'eager'" in msg
    assert not hasattr(model, "veomni_ops_binding") and "forward" not in model.__dict__


def test_user_module_subclass_is_left_alone(registry):
    model = build("qwen3")
    layer = model.model.layers[0]
    loud = LoudRMSNorm(layer.input_layernorm.weight.shape[0], eps=layer.input_layernorm.variance_epsilon)
    loud.load_state_dict(layer.input_layernorm.state_dict())
    layer.input_layernorm = loud
    ref = copy.deepcopy(model)
    places = {p.path: p for p in survey(model)}
    assert places["model.layers.0.input_layernorm"].foreign.endswith("LoudRMSNorm.forward")
    with pytest.raises(BindingError, match="LoudRMSNorm.forward is user code"):
        veomni_ops.apply(copy.deepcopy(model), {"rms_norm_implementation": "counting"}, registry=registry,
                         device="cpu")
    veomni_ops.apply(model, {}, registry=registry, device="cpu")
    assert "forward" not in loud.__dict__
    assert "forward" in model.model.layers[1].input_layernorm.__dict__  # the library's norms are bound
    b = batch()
    torch.testing.assert_close(model(**b).loss, ref(**b).loss, atol=1e-5, rtol=1e-5)
