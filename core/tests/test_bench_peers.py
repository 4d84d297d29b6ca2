"""`veomni-ops bench` peers: Liger's RoPE as its users call it beside veomni-liger's adapter, what the
result says about each peer's numbers, and the gradient layout every fwd+bwd row is timed with."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import make_plugin
from veomni_ops import KernelSpec, build_registry
from veomni_ops import bench as B
from veomni_ops.backends import reference
from veomni_ops.bench import loop as L
from veomni_ops.bench import peers as P
from veomni_ops.testing.cases import harness

HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None


def test_liger_rotary_peers_are_declared_for_both_variants_and_say_which_number_is_which():
    rope = {p.variant: p for p in P.PEERS if p.op == "rotary"}
    assert set(rope) == {"full", "partial"}
    for p in rope.values():
        assert (p.name, p.distribution, p.device_types) == ("liger", "liger-kernel", ("cuda",))
        # how it is called, and what the two rows' numbers include
        assert "liger_rotary_pos_emb(q, k, cos, sin)" in p.about and "in place" in p.about
        assert "include those copies, this row's do not" in p.about
    assert "apply_liger_kernel_to_qwen3 " in rope["full"].about
    assert "apply_liger_kernel_to_qwen3_next(rope=True)" in rope["partial"].about
    assert [p.variant for p in P.peers_for("rotary", "full")] == (["full"] if HAS_LIGER else [])


# Liger's RoPE is a Triton kernel: on the CPU it runs under the interpreter, which must be on before
# liger_kernel.ops.rope is imported -- hence a fresh process.
_LIGER_AS_USERS_CALL_IT = textwrap.dedent("""
    import torch
    from veomni_ops.bench.peers import PEERS
    from veomni_ops.kernels.rotary import apply_rotary

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    b, hq, hk, s, d = 2, 4, 2, 5, 32
    for variant, r in (("full", d), ("partial", 8)):
        fn = next(p for p in PEERS if p.op == "rotary" and p.variant == variant).load()
        # a Qwen3 attention's layout: the [B, S, H, D] projection viewed as [B, H, S, D]
        q0 = torch.randn(b, s, hq, d, generator=g).to(dev).transpose(1, 2)
        k0 = torch.randn(b, s, hk, d, generator=g).to(dev).transpose(1, 2)
        pos = torch.arange(s, dtype=torch.float64) + torch.tensor([[0.0], [7.0]], dtype=torch.float64)
        inv = 1.0 / (10000.0 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
        emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
        cos, sin = emb.cos().float().to(dev), emb.sin().float().to(dev)

        q, k = q0.detach().clone(memory_format=torch.preserve_format).requires_grad_(), \\
            k0.detach().clone(memory_format=torch.preserve_format).requires_grad_()
        assert q.transpose(1, 2).is_contiguous()
        q_ptr = q.data_ptr()
        oq, ok = fn(q, k, cos, sin)
        eq, ek = apply_rotary(q0, k0, cos, sin)
        torch.testing.assert_close(oq, eq, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ok, ek, rtol=1e-5, atol=1e-5)
        # as its users call it: no copy, the model's q buffer is rotated in place
        assert oq.data_ptr() == q_ptr and torch.equal(q.detach(), oq.detach()), variant
        # and the backward, handed a gradient laid out as the output, rotates it in place
        gq = torch.empty_like(oq).copy_(torch.randn(oq.shape, generator=g).to(dev))
        gk = torch.empty_like(ok).copy_(torch.randn(ok.shape, generator=g).to(dev))
        q2, k2 = q0.detach().clone().requires_grad_(), k0.detach().clone().requires_grad_()
        rq, rk = apply_rotary(q2, k2, cos, sin)
        torch.autograd.backward((rq, rk), (gq.clone(), gk.clone()))
        gq_before = gq.clone()
        torch.autograd.backward((oq, ok), (gq, gk))
        torch.testing.assert_close(q.grad, q2.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k.grad, k2.grad, rtol=1e-5, atol=1e-5)
        assert not torch.equal(gq, gq_before), variant  # the caller's gradient was overwritten
        if r < d:
            assert torch.equal(oq[..., r:], q0[..., r:])
        try:  # veomni-liger's adapter: the same kernel, the same numbers, on copies (inputs untouched)
            from veomni_liger.kernels import rotary as adapter
        except ImportError:
            adapter = None
        if adapter is not None:
            fa = adapter.apply_rotary_full if variant == "full" else adapter.apply_rotary_partial
            q3, k3 = q0.detach().clone(memory_format=torch.preserve_format), \
                k0.detach().clone(memory_format=torch.preserve_format)
            aq, ak = fa(q3, k3, cos, sin)
            assert torch.equal(aq, oq.detach()) and torch.equal(ak, ok.detach()), variant
            assert torch.equal(q3, q0) and torch.equal(k3, k0) and aq.data_ptr() != q3.data_ptr(), variant
        print("ok", variant)
""")


@pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel is not installed")
def test_liger_peer_runs_the_model_layout_in_place_and_matches_eager():
    """The peer is liger_rotary_pos_emb itself: on q/k as a Qwen3 attention lays them out it matches the
    eager reference forward and backward, and rotates the model's buffers (q, then the gradient) in
    place -- the copies veomni-liger's adapter makes and this row does not. Where veomni-liger is installed,
    its adapter gives the same numbers bitwise and leaves q/k untouched."""
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", _LIGER_AS_USERS_CALL_IT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["ok full", "ok partial"]


def _spy_rotary():
    """A rotary kernel that records the layout of the gradient it is handed."""
    seen = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k):
            # the output is a [B, S, H, D] buffer viewed as [B, H, S, D], as the model's projections are
            return (q.transpose(1, 2).contiguous().transpose(1, 2) * 1.0,
                    k.transpose(1, 2).contiguous().transpose(1, 2) * 1.0)

        @staticmethod
        def backward(ctx, dq, dk):
            seen.append((dq.transpose(1, 2).is_contiguous(), dk.transpose(1, 2).is_contiguous()))
            return dq, dk

    def kernel(q, k, cos, sin):
        return Spy.apply(q, k)

    return kernel, seen


def test_fwd_bwd_hands_each_kernel_a_gradient_laid_out_as_its_output():
    """The cotangent follows the output's layout (as the attention's backward hands it over), so a kernel
    (or peer) that keeps the model's [B, S, H, D] layout is not timed with a copy a model would not make."""
    kernel, seen = _spy_rotary()
    w = next(x for x in B.workloads(["cpu-small"], "rotary") if x.variant == "full")
    inputs, diff = B.build_inputs(w, "cpu")
    closures = L._closures(kernel, inputs, diff, harness("rotary"), torch.device("cpu"))
    fn, _ = closures["fwd+bwd"]
    dq, dk = fn()
    fn()
    assert seen == [(True, True), (True, True)]
    assert dq.shape == inputs["q"].shape and dk.shape == inputs["k"].shape


def _registry_with_a_namesake():
    """A registered kernel named like the peer below ("mine" and "mine (peer)")."""
    mine = make_plugin("mine", swiglu=[KernelSpec(name="mine", op="swiglu", variant="standard",
                                                  factory=lambda: _silu_mul, dtypes=("float32",))])
    return build_registry([("veomni-ops", reference), ("mine", mine)], include_entry_points=False, env={})


def _silu_mul(gate, up):
    return torch.nn.functional.silu(gate) * up


def test_peer_notes_in_the_result_text_markdown_and_merge(monkeypatch, tmp_path):
    monkeypatch.setattr(P, "PEERS", (P.Peer("mine", "pytest", "swiglu", "standard", lambda: _silu_mul,
                                            "called as its users call it; no copy in this row",
                                            device_types=("cpu", "cuda")),))
    res = B.run_bench(presets=["cpu-small"], op="swiglu", registry=_registry_with_a_namesake(), warmup_ms=1,
                      rep_ms=2, progress=False)
    assert {(r["kernel"], r["peer"]) for r in res["rows"]} == {("eager", False), ("mine", False), ("mine", True)}
    assert res["peers"] == [{"op": "swiglu", "variant": "standard", "kernel": "mine", "distribution": "pytest",
                             "version": P.PEERS[0].version(), "about": "called as its users call it; no copy in "
                                                                      "this row"}]
    note = f"mine (peer) swiglu/standard (pytest {P.PEERS[0].version()}): called as its users call it"
    text, md = B.render_text(res), B.render_markdown(res)
    assert note in text and "vs eager: eager's time over the row's, kernel time where both" in text
    assert "## Peers" in md and f"- {note}" in md and "vs eager: eager's time" in md
    # the registered "mine" and the peer "mine" are two rows, not one measured twice
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(res))
    b.write_text(json.dumps(dict(res, rows=[dict(r, op="rms_norm") for r in res["rows"]], peers=[])))
    m = B.merge_results([json.loads(a.read_text()), json.loads(b.read_text())], [str(a), str(b)])
    assert len(m["rows"]) == 2 * len(res["rows"]) and m["peers"] == res["peers"]
    peer_only = dict(res, rows=[r for r in res["rows"] if r["peer"]])
    with pytest.raises(ValueError, match=r"both measured cpu-small swiglu/standard mine \(peer\) fwd"):
        B.merge_results([peer_only, peer_only], ["x", "y"])


def test_vs_eager_says_when_it_compares_wall_times():
    rows = [
        {"preset": "p", "op": "o", "variant": "v", "pass": "fwd", "kernel": "eager", "kernel_ms": 2.0,
         "wall_ms": 4.0},
        {"preset": "p", "op": "o", "variant": "v", "pass": "fwd", "kernel": "a", "kernel_ms": 1.0, "wall_ms": 3.0},
        {"preset": "p", "op": "o", "variant": "v", "pass": "fwd", "kernel": "b", "kernel_ms": None, "wall_ms": 2.0},
    ]
    B.add_speedups(rows)
    assert [(r["vs_eager"], r["vs_eager_on"]) for r in rows] == [(1.0, "kernel_ms"), (2.0, "kernel_ms"),
                                                                 (2.0, "wall_ms")]
    cuda = {"timing": {"kernel": "torch.profiler device time"}}
    assert [B.vs_eager_cell(cuda, r) for r in rows] == ["1.00x", "2.00x", "2.00x (wall)"]
    cpu = {"timing": {"kernel": None}}  # no kernel times anywhere: every number is wall, nothing to mark
    assert B.vs_eager_cell(cpu, rows[2]) == "2.00x"
