"""VeOmni as a client: models built by VeOmni's own builder (``build_foundation_model``: its
generated copies of transformers' modeling code, with VeOmni's ``OpSlot`` s) bind like
transformers' own, and train to the losses and gradients of VeOmni's eager path.

Runs in the ``veomni`` nox session (an environment of its own: importing VeOmni patches
transformers for the whole process, so these tests never share a process with the others).
"""

from __future__ import annotations

import copy

import pytest
import torch

veomni = pytest.importorskip("veomni", reason="VeOmni is installed only in the `veomni` nox session")

import transformers as T  # noqa: E402
import veomni_ops  # noqa: E402
from veomni.arguments.arguments_types import OpsImplementationConfig  # noqa: E402
from veomni.models import build_foundation_model  # noqa: E402

COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, head_dim=16, max_position_embeddings=64)
EAGER = dict(attn_implementation="sdpa", moe_implementation="eager", cross_entropy_loss_implementation="eager",
             rms_norm_implementation="eager", swiglu_mlp_implementation="eager",
             rotary_pos_emb_implementation="eager", load_balancing_loss_implementation="eager")


def _config(name: str):
    if name == "qwen3":
        return T.Qwen3Config(**COMMON, architectures=["Qwen3ForCausalLM"])
    return T.Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                            decoder_sparse_step=1, output_router_logits=True, architectures=["Qwen3MoeForCausalLM"])


def _veomni_model(name: str):
    torch.manual_seed(0)
    model = build_foundation_model(_config(name), torch_dtype="float32", init_device="cpu",
                                   ops_implementation=OpsImplementationConfig(**EAGER))
    assert type(model).__module__.startswith("veomni.models.transformers."), type(model).__module__
    return model.train()


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (2, 16), generator=g)
    return {"input_ids": ids, "labels": ids}


def _train(model, steps: int = 5):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, grads = [], []
    for step in range(steps):
        out = model(**_batch(step))
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, grads


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_veomni_model_binds_every_place(name):
    model = _veomni_model(name)
    plain = T.AutoModelForCausalLM.from_config(_config(name))
    binding = veomni_ops.apply(model, {}, device="cpu")
    assert not binding.skipped, binding.table()
    want = veomni_ops.binding.needs_of(veomni_ops.binding.survey(plain))
    assert {op for _, op, _, _ in binding.bound} == set(want)
    assert len(binding.bound) == len(veomni_ops.binding.survey(plain))


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_bound_veomni_model_trains_like_veomnis_eager_path(name):
    ref = _veomni_model(name)
    model = copy.deepcopy(ref)
    veomni_ops.apply(model, {}, device="cpu")
    want_losses, want_grads = _train(ref)
    got_losses, got_grads = _train(model)
    for step, (g, w) in enumerate(zip(got_losses, want_losses)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=f"loss at step {step}")
    for step, (g, w) in enumerate(zip(got_grads, want_grads)):
        assert g.keys() == w.keys() and len(g) > 10
        for n in w:
            torch.testing.assert_close(g[n], w[n], rtol=1e-4, atol=1e-6, msg=f"grad of {n} at step {step}")


def test_named_kernels_bind_into_veomni_models():
    """A named kernel used to be refused ("will not replace methods your code overrides")."""
    ref = _veomni_model("qwen3_moe")
    model = copy.deepcopy(ref)
    binding = veomni_ops.apply(model, {"cross_entropy_loss_implementation": "chunked", "moe_implementation": "eager",
                                       "rms_norm_implementation": "eager"}, device="cpu")
    assert ("", "cross_entropy", "fused_linear", "chunked") in binding.bound
    model.eval()
    ref.eval()
    b = _batch(7)
    with torch.no_grad():
        g, r = model(**b), ref(**b)
    torch.testing.assert_close(g.loss, r.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.logits, r.logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.aux_loss, r.aux_loss, rtol=1e-5, atol=1e-6)
