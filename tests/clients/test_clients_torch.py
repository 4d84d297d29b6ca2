"""Gradient checkpointing, ``generate()`` and ``torch.compile`` of the whole model, bound vs unbound.

``torch.compile`` uses the ``aot_eager`` backend: dynamo traces the whole forward (a graph
break raises under ``fullgraph=True``) and AOTAutograd the backward, which is what a binding
can break; inductor's code generation on a 2-core CPU would add minutes and test nothing of
the binding. The models are bound with ``compile=True`` there, as the README says to for a
model that will be compiled.
"""

from __future__ import annotations

import pytest
import torch
from clients_support import MODELS, assert_runs_close, batches, bound_pair, train

STEPS = 5


def _count_calls(module) -> list[int]:
    calls = [0]

    def hook(mod, args, out):
        calls[0] += 1

    module.register_forward_hook(hook)
    return calls


@pytest.mark.parametrize("bf16", [pytest.param(False, id="fp32"), pytest.param(True, id="bf16")])
@pytest.mark.parametrize("name", MODELS)
def test_gradient_checkpointing_training_matches_unbound(name, bf16):
    """``gradient_checkpointing_enable()`` on both: the decoder layers run their forward again
    in the backward (counted at the first layer's input norm), and the losses and gradients are
    the unbound model's."""
    unbound, bound, _ = bound_pair(name)
    counts = []
    for m in (unbound, bound):
        m.gradient_checkpointing_enable()
        assert m.is_gradient_checkpointing
        counts.append(_count_calls(m.model.layers[0].input_layernorm))
    data = batches(STEPS)
    ru, rb = train(unbound, data, bf16=bf16), train(bound, data, bf16=bf16)
    assert_runs_close(ru, rb, f"{name} with gradient checkpointing{', bf16 autocast' if bf16 else ''}", bf16=bf16)
    assert counts[0][0] == 2 * STEPS, (
        f"the unbound layer's input norm ran {counts[0][0]} times in {STEPS} checkpointed steps, not forward + recompute")
    assert counts[1][0] == counts[0][0], (
        f"decoder layer 0's input norm in the bound {name} ran {counts[1][0]} times in {STEPS} checkpointed steps, the unbound "
        f"one {counts[0][0]} (forward + recompute each step)")


@pytest.mark.parametrize("name", MODELS)
def test_generate_greedy_tokens_equal_unbound(name):
    """Greedy decoding with the KV cache, a left-padded batch: the same tokens, the same scores.
    (Without router logits: transformers' own MoE aux loss fails on a cached step, whose mask
    is longer than the step's router logits.)"""
    unbound, bound, _ = bound_pair(name, output_router_logits=False)
    b = batches(1, b=2, seed=3)[0]
    prompt = {"input_ids": b["input_ids"][:, :10], "attention_mask": b["attention_mask"][:, :10]}
    outs = []
    for m in (unbound, bound):
        m.eval()
        with torch.no_grad():
            outs.append(m.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None,
                                   output_scores=True, return_dict_in_generate=True))
    ou, ob = outs
    assert type(ob) is type(ou), f"generate() returned {type(ob).__name__} bound, {type(ou).__name__} unbound"
    assert ob.sequences.shape == ou.sequences.shape == (2, 18)
    assert torch.equal(ob.sequences, ou.sequences), (
        f"greedy tokens of {name} differ:\n bound   {ob.sequences[:, 10:].tolist()}\n unbound {ou.sequences[:, 10:].tolist()}")
    for i, (su, sb) in enumerate(zip(ou.scores, ob.scores)):
        torch.testing.assert_close(sb, su, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, i=i: f"generate() scores of {name} at new token {i}: {m}")


@pytest.mark.parametrize("name, dtype", [("qwen3", torch.float32), ("qwen3_moe", torch.float32),
                                         ("qwen3_moe", torch.bfloat16)], ids=["qwen3", "qwen3_moe", "qwen3_moe-bf16"])
def test_torch_compile_fullgraph_of_the_bound_model_trains_like_unbound(name, dtype):
    """``torch.compile(bound, fullgraph=True)``, training (fwd + bwd) for 5 steps: the same
    losses and gradients as the unbound model run eagerly; in bf16 the model's weights are
    bfloat16 (this is the compile case's bf16: autocast would only add casts to the graph)."""
    unbound, bound, binding = bound_pair(name, dtype, compile=True)
    assert binding.plan.compile, "apply(..., compile=True) gave a plan without compile mode"
    if name == "qwen3_moe":
        # transformers installs the hooks that collect router logits on the first call that asks
        # for them, under a threading.Lock dynamo cannot enter (a graph break in transformers
        # itself, bound or not); one eager call installs them.
        with torch.no_grad():
            bound(**batches(1)[0])
    torch._dynamo.reset()
    compiled = torch.compile(bound, fullgraph=True, backend="aot_eager")
    data = batches(STEPS)
    low = dtype == torch.bfloat16
    ru = train(unbound, data)
    try:
        rb = train(bound, data, call=compiled, keep_outputs=True)
    except Exception as e:
        _skip_if_transformers_cannot_either(unbound, name, dtype, e)
        raise
    assert_runs_close(ru, rb, f"torch.compile(fullgraph=True) of the bound {name} ({dtype})", bf16=low)
    assert all(o.logits is None for o in rb.outputs), "the compiled bound model did not take the fused loss"


def _skip_if_transformers_cannot_either(unbound, name, dtype, bound_error: Exception) -> None:
    """The bound model failed to compile: skip if the unbound model fails too (a limit of this
    transformers release, e.g. 5.17's float32 grouped_mm experts backward), else return (the
    caller re-raises: the binding broke what transformers compiles)."""
    import copy

    import transformers

    model = copy.deepcopy(unbound)
    if name == "qwen3_moe":
        with torch.no_grad():
            model(**batches(1)[0])
    torch._dynamo.reset()
    try:
        model.train()
        torch.compile(model, fullgraph=True, backend="aot_eager")(**batches(1)[0]).loss.backward()
    except Exception as e:
        pytest.skip(f"transformers {transformers.__version__}'s own {name} ({dtype}) does not compile with "
                    f"fullgraph=True either: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]} "
                    f"(bound: {type(bound_error).__name__})")
