"""``torch.compile(fullgraph=True)`` through a bound model: no graph break, same numbers.

Backend ``aot_eager``: dynamo traces the whole forward (a graph break raises under
``fullgraph=True``) and AOTAutograd traces the backward, which is what decides whether a
kernel compiles; inductor's C++ code generation on a 2-core CPU would add minutes and
tests nothing about the binding.

What compiles fullgraph (and the spec's ``supports_compile`` says so): every eager kernel
but the experts loop (rms_norm, rotary, swiglu, moe_router, attention, fused-linear CE,
load_balancing_loss), sdpa attention, chunked fused-linear CE, grouped_mm experts
(bfloat16). What does not: the eager experts loop
(``nonzero`` + a loop over the experts hit: data-dependent), ``supports_compile=False``.
Asking for router logits graph-breaks on the *first* call in transformers itself (lazy hook
installation under a lock); after one eager call it compiles fullgraph.
"""

from __future__ import annotations

import inspect

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
        ("residual_rms_norm", "standard"): "eager",
        ("rotary", "full"): "eager",
        ("attention", "standard"): "sdpa",
        ("moe_router", "standard"): "eager",
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


def _bound_copy(fn):
    """The copy binding made of a forward: under a decorator's copy (transformers'
    ``deprecate_kwarg``), the function its closure holds; binding's copies have no ``__name__``
    in their globals."""
    while "__name__" in fn.__globals__:
        fn = next(c.cell_contents for c in fn.__closure__ or () if inspect.isfunction(c.cell_contents))
    return fn


def _break_rotary(model):
    """Make each bound attention forward split in two under dynamo (a graph break in the middle
    of it, as some kernels and transformers code paths cause on a GPU): the rotary function its
    globals name calls ``torch._dynamo.graph_break()``. Returns the attention forwards."""
    attns = [m for m in model.modules() if type(m).__name__ == "Qwen3Attention"]
    for fn in {_bound_copy(a.forward.__func__) for a in attns}:  # one function when the copies are shared
        g = fn.__globals__
        rotary = g["apply_rotary_pos_emb"]

        def breaking(*args, rotary=rotary, **kwargs):
            torch._dynamo.graph_break()
            return rotary(*args, **kwargs)

        g["apply_rotary_pos_emb"] = breaking
    return attns


def test_layers_compiled_one_by_one_run_through_a_graph_break_in_a_bound_forward(registry):
    """Per-layer compile (what `train.compile` does under a layout): each decoder layer's forward
    compiled in place, the bound attention forward breaks the graph. Dynamo keeps the pieces
    of a split frame in the frame's globals and caches by code object: the bound copies must not
    be several functions of one code object with different globals (GPU run of 2026-11-26:
    ``NameError: name '__compiled_fn_5_...' is not defined`` on every `train.compile` + layout)."""
    from veomni_ops.parallel.fsdp import compile_layers

    ref, model = pair("qwen3", num_hidden_layers=3)
    veomni_ops.apply(model, {"attn_implementation": "sdpa"}, registry=registry, device="cpu", compile=True)
    attns = _break_rotary(model)
    assert len(attns) == 3
    # the layers of one binding share one copy of the attention forward (one compiled code) ...
    assert len({a.forward.__func__ for a in attns}) == 1
    # ... whose code is not transformers' own code object (a frame of the original is cached apart)
    copy, original = _bound_copy(attns[0].forward.__func__), inspect.unwrap(type(attns[0]).forward)
    assert copy.__code__ is not original.__code__ and copy.__code__ == original.__code__
    b = batch()
    want = model(**b).loss
    torch._dynamo.reset()
    compile_layers(model, backend="aot_eager")
    got = model(**b).loss
    got.backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, ref(**b).loss, atol=1e-5, rtol=1e-5)


def test_two_bound_models_compiled_in_one_process_keep_their_own_compiled_code(registry):
    """Two models bound in one process (a policy and a reference model), their layers compiled,
    each through a graph break in its bound forward: each model's copies run their own code."""
    from veomni_ops.parallel.fsdp import compile_layers

    torch._dynamo.reset()
    out = []
    for seed in (0, 1):
        _, model = pair("qwen3", num_hidden_layers=2)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(seed * 1e-2)
        veomni_ops.apply(model, {"attn_implementation": "sdpa"}, registry=registry, device="cpu", compile=True)
        _break_rotary(model)
        want = model(**batch()).loss
        compile_layers(model, backend="aot_eager")
        out.append((model, want))
    for model, want in out:
        torch.testing.assert_close(model(**batch()).loss, want, atol=1e-5, rtol=1e-5)


def test_layers_compiled_one_by_one_capture_router_logits_without_a_graph_break(registry):
    """Per-layer compile of an MoE model asked for its router logits (the aux loss): the router's
    output-capturing hook reads transformers' ContextVar, which dynamo cannot trace (every MoE
    layer broke in two on the GPUs, 2026-11-26). compile_layers hands the hooks transformers' own
    compile-time variable instead: no graph break, one graph for all layers (no recompile per
    layer as the list of logits grows), and the same loss, aux loss, logits and gradients as eager."""
    from torch._dynamo.utils import counters
    from veomni_ops.parallel.fsdp import compile_layers, graph_breaks

    ref, model = pair("qwen3_moe", dtype=torch.bfloat16, num_hidden_layers=3)
    veomni_ops.apply(model, {}, registry=registry, device="cpu", compile=True)  # grouped_mm experts: they trace
    # training's call (as the layouts' shard_batch): no KV cache, whose per-layer state would recompile
    b, kw = batch(), {"output_router_logits": True, "use_cache": False}
    tol = dict(atol=2e-2, rtol=2e-2)  # bfloat16, the bound model eager vs its layers under aot_eager
    want = model(**b, **kw)
    want.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    counters.clear()
    compile_layers(model, backend="aot_eager", fullgraph=True)  # a graph break would raise
    for _ in range(2):  # the second call reuses the graph: no recompile
        got = model(**b, **kw)
        assert graph_breaks() == {}, graph_breaks()
        assert len(got.router_logits) == 3
        for g, w in zip(got.router_logits, want.router_logits, strict=True):
            torch.testing.assert_close(g, w, **tol)
        torch.testing.assert_close(got.aux_loss, want.aux_loss, **tol)
        torch.testing.assert_close(got.loss, want.loss, **tol)
        got.loss.backward()
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, grads[n], **tol, msg=lambda m, n=n: f"grad of {n}: {m}")
        model.zero_grad(set_to_none=True)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    # outside a compiled layer, transformers' variable is a context variable again
    from transformers.utils.output_capturing import _active_collector

    assert not _active_collector.compiling and _active_collector.global_var is None
    torch.testing.assert_close(model(**b).loss, ref(**b).loss, **tol)
