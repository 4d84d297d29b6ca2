"""``moe_experts`` (quack): the adapter's routing, sentinels, gather indices, combine and backward.

Quack's grouped GEMMs cannot run here: these tests call the adapter against the STAND-IN
``tests/standins/quack/gemm_interface.py`` (``gemm``, ``gemm_gated``, ``gemm_dgated`` in plain
torch, with the real signatures, the semantics the adapter relies on -- varlen-M/varlen-K
groups, the ``A_idx`` row gather, ``concat_layout``, the interleaved SwiGLU pairs, the dgated
epilogue's scale and per-row reduction -- and the real layout asserts; rows a real kernel
never writes are NaN there). So what is tested is the adapter's math against a float64
reference of the contract; that the real Quack kernels have these semantics is checked on a
GPU by ``.devrun/quack/moe_gpu.py`` (numerics against float64 and veomni-triton) and
``veomni-ops check --backend veomni-quack --op moe_experts``.
"""

from __future__ import annotations

import sys

import pytest
import quack.gemm_interface as stand_in
import torch
import torch.nn.functional as F
import veomni_quack.kernels._common as common
from _helpers import assert_close
from veomni_ops import OpsConfig, build_registry, resolve
from veomni_ops.resolve import ResolutionError
from veomni_quack import specs
from veomni_quack.kernels import moe

T, H, E, INTER = 13, 16, 5, 24


def reference(x, idx, w, gate_up, down):
    """The contract in float64, route by route: sentinels (-1, E) contribute nothing."""
    x, w, gate_up, down = (t.double() for t in (x, w, gate_up, down))
    out = torch.zeros_like(x)
    num_experts = gate_up.shape[0]
    for t in range(x.shape[0]):
        for k in range(idx.shape[1]):
            e = int(idx[t, k])
            if 0 <= e < num_experts:
                g, u = (gate_up[e] @ x[t]).chunk(2)
                out[t] = out[t] + w[t, k] * (down[e] @ (F.silu(g) * u))
    return out


def make(t=T, h=H, e=E, i=INTER, k=2, dtype=torch.float64, idx=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if idx is None:
        idx = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    x = torch.randn(t, h, generator=gen, dtype=torch.float64)
    w = torch.randn(t, idx.shape[1], generator=gen, dtype=torch.float64).softmax(-1)
    gate_up = torch.randn(e, 2 * i, h, generator=gen, dtype=torch.float64) / h**0.5
    down = torch.randn(e, h, i, generator=gen, dtype=torch.float64) / i**0.5
    return [x.to(dtype), idx, w.to(dtype), gate_up.to(dtype), down.to(dtype)]


@pytest.fixture
def float64(monkeypatch):
    """Let the adapter and the stand-in run in float64, so the formulas are checked to 1e-10."""
    monkeypatch.setattr(moe, "_DTYPES", (*moe._DTYPES, torch.float64))
    monkeypatch.setattr(common.CHECKS, "dtypes", (*common.CHECKS.dtypes, torch.float64))
    monkeypatch.setattr(stand_in, "ALLOW_FLOAT64", True)


def run(inputs, grad_seed=1):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = moe.moe_experts(*leaves)
    gout = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=torch.float64)
    out.backward(gout.to(out.dtype))
    return out, [leaves[i].grad for i in (0, 2, 3, 4)], gout


def expected(inputs, gout):
    leaves = [t.detach().double().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    out = reference(*leaves)
    out.backward(gout)
    return out, [leaves[i].grad for i in (0, 2, 3, 4)]


NAMES = ("hidden_states", "top_k_weights", "gate_up_proj", "down_proj")


def check_float64(inputs, tol=1e-10):
    out, grads, gout = run(inputs)
    ref, ref_grads = expected(inputs, gout)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    for name, g, r in zip(NAMES, grads, ref_grads):
        assert g is not None, name
        torch.testing.assert_close(g, r, atol=tol, rtol=tol, msg=lambda m, n=name: f"d {n}: {m}")
    return out, grads


# --------------------------------------------------------------------------- the math, float64
def test_matches_the_contract_forward_and_backward(float64):
    check_float64(make(k=2))


def test_top1_and_top_k_equal_e(float64):
    check_float64(make(k=1))
    check_float64(make(t=7, e=3, k=3))


def test_expert_without_tokens_gets_zero_weight_gradients(float64):
    idx = torch.tensor([[0, 2], [2, 0], [0, 3], [3, 2]] * 3)  # experts 1 and 4 get no token
    out, grads = check_float64(make(t=idx.shape[0], idx=idx))
    _, _, d_gate_up, d_down = grads
    for e in (1, 4):
        assert torch.equal(d_gate_up[e], torch.zeros_like(d_gate_up[e]))
        assert torch.equal(d_down[e], torch.zeros_like(d_down[e]))


def test_sentinels_contribute_exactly_zero(float64):
    idx = torch.tensor([[0, -1], [E, 1], [-1, E], [2, 2], [4, -1], [E, 3], [-1, -1]])
    inputs = make(t=idx.shape[0], idx=idx)
    out, grads = check_float64(inputs)
    # A token whose every route is a sentinel: zero output and zero gradient, exactly.
    assert torch.equal(out[6], torch.zeros_like(out[6]))
    d_x, d_w, _, _ = grads
    assert torch.equal(d_x[6], torch.zeros_like(d_x[6])) and torch.equal(d_x[2], torch.zeros_like(d_x[2]))
    sentinel = (idx == -1) | (idx == E)
    assert torch.equal(d_w[sentinel], torch.zeros_like(d_w[sentinel]))
    assert torch.isfinite(d_w).all()


def test_every_route_to_one_expert_and_duplicates(float64):
    check_float64(make(t=9, e=4, idx=torch.full((9, 2), 3)))
    idx = torch.stack([torch.tensor([1, 1]), torch.tensor([0, 2])] * 5)
    check_float64(make(t=10, e=4, idx=idx))


def test_int32_index_and_strided_hidden(float64):
    inputs = make(idx=None)
    inputs[1] = inputs[1].to(torch.int32)
    check_float64(inputs)
    wide = torch.randn(T, H + 8, dtype=torch.float64)
    wide[:, :H] = inputs[0]
    inputs[0] = wide[:, :H]  # row stride H + 8: the adapter copies it to a contiguous layout
    check_float64(inputs)


def test_zero_tokens(float64):
    inputs = make(t=0, idx=torch.zeros(0, 2, dtype=torch.long))
    out, grads, _ = run(inputs)
    assert out.shape == (0, H)
    assert torch.equal(grads[2], torch.zeros_like(grads[2])) and torch.equal(grads[3], torch.zeros_like(grads[3]))


@pytest.mark.parametrize("mode", ["sorted", "transpose", "in_place"])
def test_gate_up_weight_gradient_modes(float64, monkeypatch, mode):
    # The three ways to compute d gate_up_proj (moe.WGRAD_GATE_UP): the same numbers.
    monkeypatch.setattr(moe, "WGRAD_GATE_UP", mode)
    stand_in.CALLS.clear()
    check_float64(make(idx=torch.tensor([[0, -1], [E, 1], [2, 2], [4, 3]] * 3), t=12))
    wgrad = [c[1] for c in stand_in.CALLS if c[1].get("cu_seqlens_k") is not None]
    assert len(wgrad) == 2  # d down_proj, d gate_up_proj
    assert (wgrad[1]["A_idx"] is None) == (mode == "sorted")
    assert wgrad[1]["concat_layout"] == (("out",) if mode == "in_place" else None)


def test_unknown_gate_up_weight_gradient_mode(monkeypatch):
    monkeypatch.setattr(moe, "WGRAD_GATE_UP", "nope")
    x, idx, w, gu, dn = make(dtype=torch.bfloat16)
    gu.requires_grad_(True)
    with pytest.raises(ValueError, match="WGRAD_GATE_UP is 'nope'"):
        moe.moe_experts(x, idx, w, gu, dn).sum().backward()


@pytest.mark.parametrize(("flag", "value"), [("GATE_UP_CONCAT", False), ("WGRAD_GATHER", False)])
def test_fallback_variants(float64, monkeypatch, flag, value):
    # The switches the GPU script can flip if a Quack feature misbehaves there: the same numbers.
    monkeypatch.setattr(moe, flag, value)
    check_float64(make(idx=torch.tensor([[0, -1], [E, 1], [2, 2], [4, 3]] * 3), t=12))


def test_gradient_subsets(float64):
    inputs = make(k=2)
    x, idx, w, gu, dn = inputs
    gu = gu.clone().requires_grad_(True)
    out = moe.moe_experts(x, idx, w, gu, dn)
    out.sum().backward()
    ref = gu.detach().clone().requires_grad_(True)
    reference(x, idx, w, ref, dn).sum().backward()
    torch.testing.assert_close(gu.grad, ref.grad, atol=1e-10, rtol=1e-10)
    with torch.no_grad():
        torch.testing.assert_close(moe.moe_experts(*inputs), reference(*inputs), atol=1e-10, rtol=1e-10)


# --------------------------------------------------------------------------- what Quack is asked
def test_quack_calls():
    stand_in.CALLS.clear()
    inputs = make(k=2, dtype=torch.bfloat16)
    run(inputs)
    names = [c[0] for c in stand_in.CALLS]
    assert all(c[1]["tuned"] is False for c in stand_in.CALLS)  # Quack's default config, no autotuning pass
    assert names == ["gemm_act", "gemm", "gemm_dact", "gemm", "gemm", "gemm"]
    fwd_gated = stand_in.CALLS[0][1]
    assert fwd_gated["activation"] == "swiglu" and fwd_gated["concat_layout"] == ("B",)
    assert fwd_gated["A"].shape == (T, H) and fwd_gated["A_idx"].shape == (T * 2,)  # rows gathered, not copied
    cu = fwd_gated["cu_seqlens_m"]
    assert cu.dtype == torch.int32 and cu.shape == (E + 1,) and int(cu[-1]) == T * 2
    dgated = stand_in.CALLS[2][1]
    assert dgated["colvec_reduce"] and dgated["colvec_scale"].dtype == torch.float32
    assert dgated["A_idx"] is not None and dgated["A"].shape == (T, H)
    d_down, d_gate_up = stand_in.CALLS[3][1], stand_in.CALLS[4][1]
    assert d_down["cu_seqlens_k"] is not None and d_down["A_idx"] is not None
    # Default WGRAD_GATE_UP = "sorted": [dg | du]^T (m-major) @ x rows gathered into a copy.
    assert d_gate_up["cu_seqlens_k"] is not None and d_gate_up["A_idx"] is None
    assert d_gate_up["A"].shape == (2 * INTER, T * 2) and d_gate_up["A"].stride(-2) == 1


# --------------------------------------------------------------------------- 16-bit, tolerances
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_within_the_declared_tolerance(dtype):
    idx = torch.stack([torch.randperm(E)[:2] for _ in range(T)])
    idx[0, 1], idx[3, 0] = -1, E
    inputs = make(dtype=dtype, idx=idx)
    out, grads, gout = run(inputs)
    ref, ref_grads = expected(inputs, gout)
    assert out.dtype == dtype
    assert_close(out, ref, "moe_experts", "standard", "out", dtype)
    for name, g, r in zip(NAMES, grads, ref_grads):
        assert g.dtype == dtype, name
        assert_close(g, r, "moe_experts", "standard", f"d {name}", dtype)


def test_float32_top_k_weights_with_bf16_experts():
    inputs = make(dtype=torch.bfloat16)
    inputs[2] = inputs[2].float()
    out, grads, gout = run(inputs)
    assert out.dtype == torch.bfloat16 and grads[1].dtype == torch.float32
    ref, ref_grads = expected(inputs, gout)
    assert_close(out, ref, "moe_experts", "standard", "out", torch.bfloat16)
    assert_close(grads[1], ref_grads[1], "moe_experts", "standard", "d top_k_weights", torch.bfloat16)


# --------------------------------------------------------------------------- refusals
def test_cpu_tensors_are_refused_outside_the_tests(monkeypatch):
    monkeypatch.setattr(common.CHECKS, "device_types", ("cuda",))
    with pytest.raises(ValueError, match=r"moe_experts \(quack\): hidden_states is on cpu.*CUDA GPUs \(sm 9.0\+\)"):
        moe.moe_experts(*make(dtype=torch.bfloat16))


def test_float32_is_refused_naming_the_fix():
    with pytest.raises(TypeError, match=r"bfloat16 and float16 only.*moe_implementation: triton"):
        moe.moe_experts(*make(dtype=torch.float32))


@pytest.mark.parametrize(("h", "i"), [(12, 24), (16, 20)])
def test_unaligned_sizes_are_refused(h, i):
    with pytest.raises(ValueError, match=rf"H = {h} and .*I = {i} must be multiples of 8.*moe_implementation: triton"):
        moe.moe_experts(*make(h=h, i=i, dtype=torch.bfloat16))


def test_index_outside_the_sentinels_is_refused():
    inputs = make(dtype=torch.bfloat16)
    inputs[1][2, 1] = E + 1
    with pytest.raises(ValueError, match=r"moe_experts \(quack\): top_k_index holds 6, outside \[0, 5\)"):
        moe.moe_experts(*inputs)
    inputs[1][2, 1] = -2
    with pytest.raises(ValueError, match=r"holds -2"):
        moe.moe_experts(*inputs)


def test_shape_and_dtype_mismatches_are_refused():
    x, idx, w, gu, dn = make(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"moe_experts \(quack\): down_proj"):
        moe.moe_experts(x, idx, w, gu, dn[:, :, :-8])
    with pytest.raises(TypeError, match=r"moe_experts \(quack\)"):
        moe.moe_experts(x, idx, w, gu.half(), dn)


def test_pre_hopper_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA A100")
    moe._capability_problem.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"A100 is compute capability 8.0.*sm 9.0\+.*moe_implementation: triton"):
            moe._check_capability(torch.device("cuda", 0))
    finally:
        moe._capability_problem.cache_clear()


def _registry():
    import veomni_ops.backends.reference

    return build_registry(modules=[("eager", veomni_ops.backends.reference), ("quack", specs)],
                          include_entry_points=False, env={})


@pytest.mark.parametrize(("device", "match"), [
    ("cpu", "kernel .quack. .* needs a cuda device, this is cpu"),
    ("cuda:8.0", "needs compute capability >= 9.0, this device has 8.0"),
])
def test_resolution_refuses_cpu_and_pre_hopper(device, match):
    with pytest.raises(ResolutionError, match=match):
        resolve(OpsConfig(moe_implementation="quack"), device=device, registry=_registry(),
                needs={"moe_experts": ["standard"]}, load=False)


def test_resolution_accepts_hopper_in_bf16_and_refuses_float32():
    plan = resolve(OpsConfig(moe_implementation="quack"), device="cuda:9.0", registry=_registry(),
                   needs={"moe_experts": ["standard"]}, dtype="bfloat16", load=True)
    assert plan.entries[0].kernel == "quack" and plan.entries[0].fn is moe.moe_experts
    with pytest.raises(ResolutionError, match="does not support dtype float32"):
        resolve(OpsConfig(moe_implementation="quack"), device="cuda:9.0", registry=_registry(),
                needs={"moe_experts": ["standard"]}, dtype="float32", load=False)


# --------------------------------------------------------------------------- custom ops, compile
def test_custom_ops_pass_opcheck():
    # No sentinel here: the forward op's preact rows of sentinel routes are never written (NaN in the
    # stand-in, uninitialised memory on a GPU; nothing reads them), which opcheck's
    # eager-vs-traced comparison of every output would flag.
    inputs = make(dtype=torch.bfloat16, idx=torch.tensor([[0, 4], [3, 1], [2, 2]] * 3))
    inputs[0] = inputs[0][: 9].clone()
    inputs[2] = inputs[2][: 9].clone()
    leaves = [t.requires_grad_(t.is_floating_point()) for t in inputs]
    torch.library.opcheck(torch.ops.veomni_quack.moe_experts_fwd.default, tuple(leaves))
    out = moe._fwd(*leaves)
    gout = torch.randn(out[0].shape, dtype=torch.bfloat16)
    saved = (inputs[0], out[1], out[2], inputs[3], inputs[4], *out[3:])
    for needs in ([True, True, True, True], [False, True, False, True]):
        torch.library.opcheck(torch.ops.veomni_quack.moe_experts_bwd.default,
                              (gout, *(t.detach() for t in saved), needs))


def test_compiles_with_fullgraph():
    # aot_eager: the graph dynamo and AOTAutograd build (inductor would need a C++ compiler here).
    inputs = make(dtype=torch.bfloat16, idx=torch.tensor([[0, -1], [E, 1], [2, 2], [4, 3]] * 3), t=12)
    eager_out, eager_grads, gout = run(inputs)
    torch._dynamo.reset()
    compiled = torch.compile(moe.moe_experts, fullgraph=True, backend="aot_eager")
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = compiled(*leaves)
    out.backward(gout.to(out.dtype))
    assert torch.equal(out, eager_out)
    for name, i, g in zip(NAMES, (0, 2, 3, 4), eager_grads):
        assert torch.equal(leaves[i].grad, g), name


# --------------------------------------------------------------------------- Quack's fingerprinting
def test_fingerprint_installed_dsl_treats_the_dsl_as_installed(monkeypatch):
    import types

    from veomni_quack.kernels.dsl_fingerprint import fingerprint_installed_dsl

    identity = types.ModuleType("quack.gemm_runtime.identity")
    identity._is_extern_function = lambda fn: False  # a DSL outside site-packages, as Quack 0.6.5 sees it
    monkeypatch.setitem(sys.modules, "quack.gemm_runtime", types.ModuleType("quack.gemm_runtime"))
    monkeypatch.setitem(sys.modules, "quack.gemm_runtime.identity", identity)

    def dsl_fn():
        pass

    def quack_fn():
        pass

    dsl_fn.__module__, quack_fn.__module__ = "cutlass._mlir_helpers.op", "quack.activation"
    assert fingerprint_installed_dsl() and fingerprint_installed_dsl()  # idempotent
    assert identity._is_extern_function(dsl_fn) is True
    assert identity._is_extern_function(quack_fn) is False  # Quack's own code is still fingerprinted
    assert identity._is_extern_function(len) is False  # no __code__: Quack's own rule decides


def test_fingerprint_installed_dsl_without_quack_internals():
    from veomni_quack.kernels.dsl_fingerprint import fingerprint_installed_dsl

    assert fingerprint_installed_dsl() is False  # the stand-in has no quack.gemm_runtime
