"""Compiled decoder layers (``veomni_ops.compile_layers``, ``train.compile`` in one process):
sdpa keeps its causal path (no attention mask) for rows of one document, and packed rows keep
their block mask (issue 35: the whole model under torch.compile built a ``[B, 1, S, S]`` mask for
every batch, and sdpa left its flash kernel: 2.4x slower than eager at 32k tokens).

What sdpa is given is read off the graphs dynamo captures (a backend that records every
``scaled_dot_product_attention`` call's ``attn_mask`` and ``is_causal``, then runs the graph as it
is), so the check costs no code generation and puts no graph break of its own into the model."""

from __future__ import annotations

import io
import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import veomni_ops  # noqa: E402
from test_train import TINY, write_job  # noqa: E402
from veomni_ops import train  # noqa: E402
from veomni_ops.ops.attention import kernel as K  # noqa: E402

#: (attn_mask is None, is_causal) of each sdpa call in the graphs the probe backend compiled.
SDPA_CALLS: list[tuple[bool, bool]] = []
PROBE = "veomni_test_sdpa_probe"
_SDPA = {torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}


@torch._dynamo.register_backend(name=PROBE)
def _probe(gm, example_inputs):
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _SDPA:
            SDPA_CALLS.append((n.kwargs.get("attn_mask") is None, bool(n.kwargs.get("is_causal", False))))
    return gm.forward


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    SDPA_CALLS.clear()
    yield
    torch._dynamo.reset()


OPS_SDPA = {"attn_implementation": "sdpa", "rms_norm_implementation": "eager",
            "cross_entropy_loss_implementation": "eager"}


def test_train_compile_keeps_sdpa_causal_without_a_mask(tmp_path):
    """``train.compile: true`` in one process: each decoder layer compiled, the mask built eagerly
    (None for these unpadded rows), and sdpa called with ``is_causal`` and no mask inside the
    compiled layers; the same losses as eager. (Before: the whole model was compiled, and both
    transformers' mask builder and the kernel's packing check, traced, gave sdpa a mask.)"""
    model = {"architecture": "qwen3", "size": "tiny", "config": {**TINY, "num_hidden_layers": 2}}
    job = train.load_job(write_job(tmp_path, ops=OPS_SDPA, model=model, compile=True, compile_backend=PROBE,
                                   steps=3, seq_len=16))
    res = train.train_one(job, out=io.StringIO())
    assert SDPA_CALLS, "no sdpa call was compiled"
    assert all(no_mask and causal for no_mask, causal in SDPA_CALLS), SDPA_CALLS
    assert res["compiled"] and res["compile"]["what"] == "decoder layers" and res["compile"]["layers"] == 2
    assert res["compile"]["graph_breaks"] == {}
    eager = train.train_one(train.load_job(write_job(tmp_path, name="eager.yaml", ops=OPS_SDPA, model=model,
                                                     steps=3, seq_len=16)), out=io.StringIO())
    torch.testing.assert_close(res["losses"], eager["losses"], rtol=1e-5, atol=1e-6)


def _tiny_bound(layers: int = 2):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**{**TINY, "num_hidden_layers": layers})
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    veomni_ops.apply(model, OPS_SDPA, compile=True, device="cpu")
    return model


def _loss_and_grads(model, ids, **kw):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids, use_cache=False, **kw).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_compile_layers_keeps_packed_rows_apart():
    """The public helper: a row of two documents (restarting position_ids) still gets the block
    mask inside the compiled layers, with eager's loss and gradients; a plain row gets none."""
    model = _tiny_bound()
    ids = torch.randint(0, TINY["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(1))
    packed = torch.cat([torch.arange(9), torch.arange(7)])[None]
    want = {name: _loss_and_grads(model, ids, position_ids=pos) for name, pos in (("plain", None), ("packed", packed))}
    facts = veomni_ops.compile_layers(model, PROBE)
    assert facts["layers"] == 2 and facts["eager"] == "embedding, attention mask, final norm, head and loss"
    for name, pos in (("plain", None), ("packed", packed)):
        SDPA_CALLS.clear()
        loss, grads = _loss_and_grads(model, ids, position_ids=pos)
        assert SDPA_CALLS, f"{name}: nothing compiled"
        assert all(c == ((True, True) if name == "plain" else (False, False)) for c in SDPA_CALLS), (name, SDPA_CALLS)
        torch.testing.assert_close(loss, want[name][0], rtol=1e-5, atol=1e-6)
        assert grads.keys() == want[name][1].keys()
        for n in grads:
            torch.testing.assert_close(grads[n], want[name][1][n], rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    # packed rows are not the plain rows' loss: the block mask did something
    assert not torch.allclose(want["plain"][0], want["packed"][0])


def test_compile_layers_warns_of_a_kv_cache_while_training():
    model = _tiny_bound(layers=1)
    veomni_ops.compile_layers(model, PROBE)
    ids = torch.randint(0, TINY["vocab_size"], (1, 8))
    with pytest.warns(UserWarning, match=r"use_cache=False"):
        model(input_ids=ids, labels=ids, use_cache=True).loss.backward()
    model = _tiny_bound(layers=1)
    veomni_ops.compile_layers(model, PROBE)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    assert not [w for w in seen if "KV cache" in str(w.message)]


def test_the_kernel_trusts_the_check_only_for_its_shape_and_inside_it():
    """Under torch.compile the sdpa kernel leaves the mask out only inside ``positions_checked``
    for position ids of the shape it is given that do not restart; elsewhere (outside it, packed
    positions, or another shape: the gathered positions of sequence parallelism) it builds it."""
    module = torch.nn.Module()
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    f = torch.compile(lambda q, k, v, pos: K.sdpa_attention(module, q, k, v, None, position_ids=pos)[0], backend=PROBE)
    plain = torch.arange(8)[None]
    packed = torch.cat([torch.arange(3), torch.arange(5)])[None]
    ref = K.sdpa_attention(module, q, k, v, None, position_ids=packed)[0]
    cases = [(None, plain, False), (plain, plain, True), (packed, packed, False), (torch.arange(4)[None], plain, False)]
    for checked, given, no_mask in cases:
        torch._dynamo.reset()  # each case compiles (and is recorded), not only those whose guards differ
        SDPA_CALLS.clear()
        with K.positions_checked(checked):
            out = f(q, k, v, given)
        assert SDPA_CALLS == [(no_mask, no_mask)], (checked, given, SDPA_CALLS)
        if given is packed:
            torch.testing.assert_close(out, ref)
    assert K._UNPACKED_SHAPE is None
    with K.positions_checked(plain):
        with K.positions_checked(packed):
            assert K._UNPACKED_SHAPE is None
        assert K._UNPACKED_SHAPE == (1, 8)
    assert K._UNPACKED_SHAPE is None


def test_compile_layers_passes_its_mode_and_only_a_chosen_one(monkeypatch):
    """train.compile_mode reaches torch.compile for every layer (``reduce-overhead``: CUDA graphs);
    the default passes torch.compile's own (None), so a non-inductor backend keeps working."""
    seen: list[dict] = []
    real = torch.compile

    def spy(fn, **kw):
        seen.append(kw)
        return real(fn, backend=PROBE)

    monkeypatch.setattr(torch, "compile", spy)
    model = _tiny_bound()
    facts = veomni_ops.compile_layers(model, "inductor", mode="reduce-overhead")
    assert facts["mode"] == "reduce-overhead" and facts["layers"] == 2
    assert [k.get("mode") for k in seen] == ["reduce-overhead"] * 2 and all(k["backend"] == "inductor" for k in seen)
    seen.clear()
    facts = veomni_ops.compile_layers(_tiny_bound(), PROBE)
    assert facts["mode"] == "default" and len(seen) == 2 and all(k["mode"] is None for k in seen)


def test_reduce_overhead_marks_each_step_for_the_graph_trees(tmp_path, monkeypatch):
    """train.compile_mode reduce-overhead: the loop calls torch.compiler.cudagraph_mark_step_begin()
    once before every step (a new generation of CUDA graph trees), and not for the default mode."""
    from veomni_ops.train.job import load_job
    from veomni_ops.train.loop import train_one

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend=PROBE))  # no codegen on the CPU
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    steps: list[int] = []
    for mode, want in (("reduce-overhead", 3), ("default", 0)):
        marks.clear()
        steps.clear()
        job = load_job(write_job(tmp_path, ops={}, steps=3, compile=True, compile_mode=mode))
        res = train_one(job, out=io.StringIO(), before_step=steps.append)
        assert len(marks) == want and steps == [1, 2, 3], (mode, marks, steps)
        assert res["compile"]["mode"] == mode
