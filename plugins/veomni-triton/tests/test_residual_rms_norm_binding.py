"""A tiny Qwen3 bound with the fused residual add + RMSNorm Triton kernel (on the CPU: under the
interpreter) against the same model unbound: loss and every gradient, float32."""

from __future__ import annotations

import copy
import dataclasses
import types

import pytest
import torch
import veomni_ops
import veomni_ops.backends.reference as reference
from veomni_ops import build_registry, hookimpl
from veomni_ops.spec import HardwareRequirement
from veomni_ops.testing import backend_tests as kit
from veomni_triton import specs

T = pytest.importorskip("transformers")
OP = "residual_rms_norm"


def registry(device: torch.device) -> veomni_ops.Registry:
    """The core's reference and veomni-triton's kernel, declared for this device (the
    interpreter runs it on the CPU, which the real spec does not claim)."""
    spec = dataclasses.replace(kit.spec_for(specs, OP, name="triton"), name="triton_here",
                               hardware=HardwareRequirement((device.type,)))

    def hook():
        return [spec]

    hook.__name__ = OP
    mod = types.ModuleType("triton_here")
    setattr(mod, OP, hookimpl(hook))
    return build_registry(modules=[("eager", reference), ("triton_here", mod)], include_entry_points=False, env={})


def test_bound_qwen3_matches_unbound(device):
    torch.manual_seed(0)
    cfg = T.Qwen3Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=32)
    ref = T.Qwen3ForCausalLM(cfg).float().to(device)
    model = copy.deepcopy(ref)
    binding = veomni_ops.apply(model, {"residual_rms_norm_implementation": "triton_here"}, device=device.type,
                               registry=registry(device))
    assert [k for _, op, _, k in binding.bound if op == OP] == ["triton_here", "triton_here"]
    ids = torch.randint(0, 64, (2, 9), device=device)
    out, want = model(input_ids=ids, labels=ids), ref(input_ids=ids, labels=ids)
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-6, atol=1e-6)
    out.loss.backward()
    want.loss.backward()
    for (name, a), (_, b) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_auto_keeps_eager():
    """``auto`` does not take the Triton kernel (priority below the core's eager: never measured
    in a training step on a GPU), also where it can run; named, it is taken."""
    plan = veomni_ops.resolve({}, "cuda:9.0", needs={OP: ["standard"]})
    assert plan.get(OP, "standard").kernel == "eager"
    plan = veomni_ops.resolve({"residual_rms_norm_implementation": "triton"}, "cuda:9.0", needs={OP: ["standard"]})
    assert plan.get(OP, "standard").kernel == "triton"
