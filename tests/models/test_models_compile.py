"""``torch.compile(fullgraph=True)`` through a bound model: no graph break, same numbers.

Backend ``aot_eager``: dynamo traces the whole forward (a graph break raises under
``fullgraph=True``) and AOTAutograd traces the backward, which is what decides whether a
kernel compiles; inductor's C++ code generation on a 2-core CPU would add minutes and
tests nothing about the binding.

What compiles fullgraph (and the spec's ``supports_compile`` says so): every eager kernel
but the experts loop (rms_norm, rotary, swiglu, attention, fused-linear CE,
load_balancing_loss), sdpa attention, chunked fused-linear CE, grouped_mm experts
(bfloat16). What does not: the eager experts loop
(``nonzero`` + a loop over the experts hit: data-dependent), ``supports_compile=False``.
Asking for router logits graph-breaks on the *first* call in transformers itself (lazy hook
installation under a lock); after one eager call it compiles fullgraph.
"""

from __future__ import annotations

import pytest
import torch
import veomni_ops
from models_support import ALL_EAGER, batch, pair


def _compiled_matches(ref, model, plan_entries, b, kw, tol):
    for e in plan_entries:
        assert e.spec.supports_compile, f"{e.op}/{e.variant} {e.kernel} says it does not compile"
    if kw.get("output_router_logits"):
        # transformers installs its output-capturing hooks lazily, under a threading.Lock, on the
        # first call that asks for router logits: dynamo cannot enter that lock (a graph break in
        # transformers itself, bound or not). One eager call installs them.
        with torch.no_grad():
            model(**b, **kw)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out_c = compiled(**b, **kw)
    out_c.loss.backward()
    grads_c = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    out_e = model(**b, **kw)  # the same bound model, not compiled
    out_e.loss.backward()
    torch.testing.assert_close(out_c.loss, out_e.loss, **tol)
    grads_e = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads_c.keys() == grads_e.keys() and len(grads_c) > 10
    for n in grads_e:
        torch.testing.assert_close(grads_c[n], grads_e[n], **tol, msg=lambda m, n=n: f"grad of {n}: {m}")
    # and the bound model still matches transformers
    out_r = ref(**b, **kw)
    torch.testing.assert_close(out_e.loss, out_r.loss, **tol)
    return out_c


def test_qwen3_all_eager_plan_compiles_fullgraph(registry):
    """eager attention (explicit softmax, eager masks), norm, rotary, SwiGLU and the eager
    fused-linear CE."""
    ref, model = pair("qwen3")
    binding = veomni_ops.apply(model, ALL_EAGER, registry=registry, device="cpu")
    assert {e.kernel for e in binding.plan.entries} == {"eager"}
    out = _compiled_matches(ref, model, binding.plan.entries, batch(), {}, dict(atol=1e-5, rtol=1e-5))
    assert out.logits is not None  # eager CE is the logits variant: logits come back, as in transformers


def test_qwen3_moe_auto_plan_compiles_fullgraph(registry):
    """bfloat16, auto: grouped_mm experts, sdpa, chunked CE, eager norm/rotary/aux loss."""
    ref, model = pair("qwen3_moe", dtype=torch.bfloat16, num_hidden_layers=1)
    binding = veomni_ops.apply(model, {}, registry=registry, device="cpu")
    kernels = {(e.op, e.variant): e.kernel for e in binding.plan.entries}
    assert kernels == {
        ("rms_norm", "standard"): "eager",
        ("rotary", "full"): "eager",
        ("attention", "standard"): "sdpa",
        ("moe_experts", "standard"): "grouped_mm",
        ("cross_entropy", "fused_linear"): "chunked",
        ("cross_entropy", "logits"): "eager",  # the head's logits path (evaluation, no grad)
        ("load_balancing_loss", "standard"): "eager",
    }
    out = _compiled_matches(ref, model, binding.plan.entries, batch(), {"output_router_logits": True},
                            dict(atol=2e-2, rtol=2e-2))
    assert out.aux_loss is not None and out.logits is None


def test_eager_experts_loop_does_not_compile_fullgraph(registry):
    """The eager loop graph-breaks (data-dependent), as its spec declares."""
    _, model = pair("qwen3_moe", num_hidden_layers=1)
    binding = veomni_ops.apply(model, {"moe_implementation": "eager"}, registry=registry, device="cpu")
    assert binding.plan.get("moe_experts", "standard").spec.supports_compile is False
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="data-dependent|nonzero|dynamic"):
        compiled(**batch())
