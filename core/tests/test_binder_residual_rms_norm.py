"""``residual_rms_norm``'s binder: which decoder layers it binds (real transformers classes, tiny
configs), which it leaves and why, the model unchanged under ``eager``, and a bound model equal
to the unbound one."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from torch import nn

T = pytest.importorskip("transformers")

import veomni_ops  # noqa: E402
import veomni_ops.backends.reference as reference  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer  # noqa: E402
from veomni_ops import KernelSpec, build_registry, hookimpl  # noqa: E402
from veomni_ops.binding import survey  # noqa: E402
from veomni_ops.binding.errors import BindingError  # noqa: E402
from veomni_ops.ops.residual_rms_norm.kernel import residual_rms_norm  # noqa: E402

OP = "residual_rms_norm"
COMMON = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, vocab_size=64, max_position_embeddings=32)


def qwen3():
    torch.manual_seed(0)
    return T.Qwen3ForCausalLM(T.Qwen3Config(**COMMON)).float()


def qwen3_moe():
    torch.manual_seed(0)
    return T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2,
                                                  moe_intermediate_size=16, decoder_sparse_step=1)).float()


def places(model):
    return [p for p in survey(model) if p.op == OP]


CALLS: list[int] = []


def counted(x, residual, weight, eps):
    """The eager kernel under another name (``fused``), counting its calls."""
    CALLS.append(1)
    return residual_rms_norm(x, residual, weight, eps)


def registry():
    """The core's reference backend and a plugin with kernel ``fused`` (:func:`counted`)."""
    def hook() -> list[KernelSpec]:
        return [KernelSpec(name="fused", op=OP, variant="standard", factory=f"{__name__}:counted",
                           dtypes=("float32", "float64"), description="eager under another name, counted")]

    hook.__name__ = OP
    mod = types.ModuleType("fused_plugin")
    setattr(mod, OP, hookimpl(hook))
    return build_registry(modules=[("eager", reference), ("fused", mod)], include_entry_points=False, env={})


@pytest.mark.parametrize("build", [qwen3, qwen3_moe], ids=["qwen3", "qwen3_moe"])
def test_binds_every_decoder_layer(build):
    model = build()
    found = places(model)
    assert [p.path for p in found] == ["model.layers.0", "model.layers.1"]
    assert all(p.left is None and p.variant == "standard" and p.info["eps"] == 1e-6 for p in found)


def test_auto_is_eager_and_leaves_the_model_as_it_is():
    """``auto`` takes the eager reference (the Triton kernel ranks below it), and binding eager
    changes no decoder layer: the layer runs its own add and norm, its norms stay rms_norm's."""
    model = qwen3()
    binding = veomni_ops.apply(model, {}, device="cpu")
    entry = binding.plan.get(OP, "standard")
    assert entry.kernel == "eager"
    assert {path for path, op, _, _ in binding.bound if op == OP} == {"model.layers.0", "model.layers.1"}
    for layer in model.model.layers:
        assert "forward" not in layer.__dict__
        assert "forward" in layer.post_attention_layernorm.__dict__  # rms_norm's binding


def test_bound_model_matches_unbound():
    """A non-eager kernel: the layer's forward is the library's with the add and norm fused;
    loss and every gradient equal the unbound model's (float32); the kernel runs once a layer."""
    ref = qwen3()
    model = copy.deepcopy(ref)
    binding = veomni_ops.apply(model, {"residual_rms_norm_implementation": "fused"}, device="cpu",
                               registry=registry())
    assert [(p, k) for p, op, _, k in binding.bound if op == OP] == [("model.layers.0", "fused"),
                                                                     ("model.layers.1", "fused")]
    # the fused kernel takes over post_attention_layernorm: rms_norm leaves it, and says why
    norms = {p for p, op, _, _ in binding.bound if op == "rms_norm"}
    assert "model.layers.0.input_layernorm" in norms and "model.layers.0.post_attention_layernorm" not in norms
    assert ("model.layers.1.post_attention_layernorm", "rms_norm",
            "computed by residual_rms_norm's fused kernel in model.layers.1, which no longer calls this module"
            ) in binding.skipped
    assert all("forward" not in layer.post_attention_layernorm.__dict__ for layer in model.model.layers)
    ids = torch.randint(0, 64, (2, 7))
    CALLS.clear()
    out, want = model(input_ids=ids, labels=ids), ref(input_ids=ids, labels=ids)
    assert len(CALLS) == 2
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-6, atol=1e-6)
    out.loss.backward()
    want.loss.backward()
    for (name, a), (_, b) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)
    binding.remove()
    assert all("forward" not in layer.__dict__ for layer in model.model.layers)


class ScaledLayer(Qwen3DecoderLayer):
    """A user's layer: its forward scales the output."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs) * 0.5


class LibraryLikeScaled(Qwen3DecoderLayer):
    """Stands for library code of another shape (its module says transformers): a scaled residual."""

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_embeddings=position_embeddings, **kwargs)
        hidden_states = residual + hidden_states * 0.5
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states


LibraryLikeScaled.__module__ = "transformers.models.fake.modeling_fake"


def _swap(model, cls):
    for layer in model.model.layers:
        layer.__class__ = cls
    return model


def test_leaves_other_layers_with_a_reason():
    # a user's subclass overriding forward: user code, never replaced (and said so)
    model = _swap(qwen3(), ScaledLayer)
    found = places(model)
    assert all(p.foreign and p.foreign.endswith("ScaledLayer.forward") for p in found)
    binding = veomni_ops.apply(model, {}, device="cpu")
    assert ("model.layers.0", OP, f"user code: {found[0].foreign}") in binding.skipped
    # library code of another shape: left, with the statement that differs
    found = places(_swap(qwen3(), LibraryLikeScaled))
    assert all("not the pre-norm residual pattern (statement 4: 'hidden_states = residual + hidden_states * 0.5')"
               in p.left for p in found)
    # a LayerNorm where the RMSNorm was
    model = qwen3()
    model.model.layers[1].post_attention_layernorm = nn.LayerNorm(32)
    left = {p.path: p.left for p in places(model)}
    assert left["model.layers.0"] is None
    assert "post_attention_layernorm is a LayerNorm, not an RMSNorm" in left["model.layers.1"]
    # Gemma-2: x̂ * (1 + w) norms and extra feed-forward norms
    gemma = T.Gemma2ForCausalLM(T.Gemma2Config(**COMMON))
    assert all("offset RMSNorm" in p.left for p in places(gemma))


def test_named_kernel_where_a_layer_is_left_is_refused():
    model = _swap(qwen3(), LibraryLikeScaled)
    with pytest.raises(BindingError, match="residual_rms_norm_implementation='fused' at model.layers.0"):
        veomni_ops.apply(model, {"residual_rms_norm_implementation": "fused"}, device="cpu", registry=registry())
