"""RMSNorm, RoPE and SwiGLU adapters through the stand-in torch_npu, against the core's eager
reference: the conformance cases (float64 reference, forward and backward, every declared
dtype, odd sizes, strided inputs), then what the adapters themselves decide (dtype pairs,
ranks, pass-through channels, the gate/up order, input validation)."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_all_pass, assert_close, conformance, kernel
from veomni_ops.kernels import rms_norm as ref_rms
from veomni_ops.kernels import rotary as ref_rotary
from veomni_ops.kernels import swiglu as ref_swiglu

ELEMENTWISE = [("rms_norm", "standard"), ("rms_norm", "offset"), ("rotary", "full"), ("rotary", "partial"),
               ("swiglu", "standard")]


@pytest.mark.parametrize("key", ELEMENTWISE, ids=lambda k: "-".join(k))
def test_conformance_cases(key):
    assert_all_pass(conformance(*key))


def _grads(fn, *inputs):
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    cot = [torch.randn_like(o, dtype=torch.float32).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, cot)
    return outs, [t.grad for t in leaves], cot


# --------------------------------------------------------------------------- rms_norm
def test_offset_is_bitwise_the_reference_in_float32_math():
    # gamma = 1 + w in float32 and one cast at the end: the same operations, in the same order,
    # as the reference, so the stand-in (CANN's golden arithmetic) reproduces it bit for bit.
    x = torch.randn(6, 40).to(torch.bfloat16)
    w = (torch.randn(40) * 0.1).to(torch.bfloat16)
    got = kernel("rms_norm", "offset")(x, w, 1e-6)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, ref_rms.rms_norm_offset(x, w, 1e-6))


@pytest.mark.parametrize("x_dtype, w_dtype", [
    (torch.bfloat16, torch.float32),  # a documented pair: passed as is
    (torch.float32, torch.bfloat16),  # not a documented pair: the weight goes up to float32
    (torch.float16, torch.bfloat16),  # neither: float32 weight
])
@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_weight_of_another_dtype(variant, x_dtype, w_dtype):
    x = torch.randn(5, 3, 24).to(x_dtype)
    shift = 1.0 if variant == "standard" else 0.0
    w = (torch.randn(24) * 0.1 + shift).to(w_dtype)
    fn = kernel("rms_norm", variant)
    ref = getattr(ref_rms, f"rms_norm_{variant}")
    (y,), (dx, dw), (cot,) = _grads(lambda a, b: fn(a, b, 1e-5), x, w)
    assert y.dtype == x_dtype and dx.dtype == x_dtype and dw.dtype == w_dtype
    (y64,), (dx64, dw64), _ = _ref_grads(lambda a, b: ref(a, b, 1e-5), (x, w), (cot,))
    assert_close(y, y64, "rms_norm", variant, "out")
    assert_close(dx, dx64, "rms_norm", variant, "dx")
    assert_close(dw, dw64, "rms_norm", variant, "dw")  # in the weight dtype's tolerance


def _ref_grads(fn, inputs, cots):
    leaves = [t.detach().double().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward(outs, [c.double() for c in cots])
    return outs, [t.grad for t in leaves], None


@pytest.mark.parametrize("shape", [(32,), (1, 1, 1, 1, 1, 1, 1, 2, 32)], ids=["1d", "9d"])
def test_ranks_torch_npu_does_not_take_go_through_a_2d_view(shape):
    # npu_rms_norm takes 2-8-D input (the stand-in refuses others, as documented).
    x = torch.randn(*shape)
    w = torch.randn(32) * 0.1 + 1
    y = kernel("rms_norm", "standard")(x, w, 1e-6)
    assert y.shape == x.shape
    assert_close(y, ref_rms.rms_norm_standard(x.double(), w.double(), 1e-6), "rms_norm", "standard", "out")


def test_rms_norm_validation():
    fn = kernel("rms_norm", "standard")
    with pytest.raises(ValueError, match=r"weight must have shape \[H\] = \[8\]"):
        fn(torch.randn(2, 8), torch.randn(7), 1e-6)
    with pytest.raises(TypeError, match="float64"):
        fn(torch.randn(2, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64), 1e-6)
    with pytest.raises(ValueError, match="eps"):
        fn(torch.randn(2, 8), torch.randn(8), -1.0)


# --------------------------------------------------------------------------- rotary
def _cos_sin(b, s, r, dtype=torch.float32):
    inv = 1.0 / (10000 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    pos = torch.arange(s, dtype=torch.float64)[None, :] + 3 * torch.arange(b, dtype=torch.float64)[:, None]
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def test_partial_rotary_passes_the_channels_past_r_through_bitwise():
    q = torch.randn(2, 4, 5, 32).to(torch.bfloat16)
    k = torch.randn(2, 2, 5, 32).to(torch.bfloat16)
    cos, sin = _cos_sin(2, 5, 8, torch.bfloat16)
    (qo, ko), (dq, dk, _, _), (cq, ck) = _grads(kernel("rotary", "partial"), q, k, cos, sin)
    assert torch.equal(qo[..., 8:], q[..., 8:]) and torch.equal(ko[..., 8:], k[..., 8:])
    # The pass-through channels' gradient is the cotangent itself.
    assert torch.equal(dq[..., 8:], cq[..., 8:]) and torch.equal(dk[..., 8:], ck[..., 8:])
    rq, rk = ref_rotary.apply_rotary(q.double(), k.double(), cos.double(), sin.double())
    assert_close(qo, rq, "rotary", "partial", "q")
    assert_close(ko, rk, "rotary", "partial", "k")


def test_rotary_casts_cos_sin_to_the_tensor_dtype():
    q = torch.randn(1, 2, 7, 16).to(torch.float16)
    k = torch.randn(1, 1, 7, 16).to(torch.float16)
    cos, sin = _cos_sin(1, 7, 16, torch.float32)  # float32 tables with float16 activations
    qo, ko = kernel("rotary", "full")(q, k, cos, sin)
    assert qo.dtype == ko.dtype == torch.float16
    rq, rk = ref_rotary.apply_rotary(q, k, cos, sin)  # the reference casts to q's dtype as well
    assert_close(qo, rq.double(), "rotary", "full", "q")
    assert_close(ko, rk.double(), "rotary", "full", "k")


def test_rotary_gradients_reach_cos_and_sin_when_asked():
    q, k = torch.randn(2, 2, 3, 8), torch.randn(2, 1, 3, 8)
    cos, sin = _cos_sin(2, 3, 8)
    (_, _), (dq, dk, dcos, dsin), cots = _grads(kernel("rotary", "full"), q, k, cos, sin)
    _, (rdq, rdk, rdcos, rdsin), _ = _ref_grads(ref_rotary.apply_rotary, (q, k, cos, sin), cots)
    for got, want, what in ((dq, rdq, "dq"), (dk, rdk, "dk"), (dcos, rdcos, "dcos"), (dsin, rdsin, "dsin")):
        assert_close(got, want, "rotary", "full", what)


def test_rotary_validation_names_the_torch_npu_limits():
    fn = kernel("rotary", "full")
    cos, sin = _cos_sin(1, 3, 8)
    with pytest.raises(ValueError, match="must be even"):
        c7, s7 = _cos_sin(1, 3, 8)
        fn(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), c7[..., :7], s7[..., :7])
    with pytest.raises(ValueError, match="below 896"):
        cw, sw = _cos_sin(1, 3, 896)
        fn(torch.randn(1, 1, 3, 896), torch.randn(1, 1, 3, 896), cw, sw)
    with pytest.raises(ValueError, match="below 1000"):
        fn(torch.randn(1, 1000, 3, 8), torch.randn(1, 1, 3, 8), cos, sin)
    with pytest.raises(ValueError, match=r"cos.detach\(\)"):
        cb, sb = _cos_sin(2, 3, 8)
        fn(torch.randn(2, 600, 3, 8), torch.randn(2, 1, 3, 8), cb.requires_grad_(), sb)
    with pytest.raises(ValueError, match="transpose"):
        fn(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 4, 8), cos, sin)


# --------------------------------------------------------------------------- swiglu
def test_swiglu_takes_the_gate_from_the_first_half():
    # silu(gate) * up is not symmetric: swapping the halves of the concatenation would show.
    gate = torch.tensor([[-3.0, 0.5, 2.0]])
    up = torch.tensor([[1.0, -2.0, 0.25]])
    got = kernel("swiglu", "standard")(gate, up)
    assert torch.allclose(got, ref_swiglu.silu_mul(gate, up), atol=1e-6, rtol=1e-6)
    assert not torch.allclose(got, ref_swiglu.silu_mul(up, gate), atol=1e-3)


def test_swiglu_strided_halves_and_gradients():
    gu = torch.randn(2, 6, 2 * 20).to(torch.bfloat16)
    gate, up = gu[..., :20], gu[..., 20:]  # strided views: npu_swiglu itself refuses those
    (y,), (dg, du), cots = _grads(kernel("swiglu", "standard"), gate, up)
    (ry,), (rdg, rdu), _ = _ref_grads(ref_swiglu.silu_mul, (gate, up), cots)
    assert y.dtype == torch.bfloat16
    assert_close(y, ry, "swiglu", "standard", "out")
    assert_close(dg, rdg, "swiglu", "standard", "dgate")
    assert_close(du, rdu, "swiglu", "standard", "dup")


def test_swiglu_empty_and_many_dims():
    fn = kernel("swiglu", "standard")
    e = torch.randn(0, 8, requires_grad=True)
    out = fn(e, torch.randn(0, 8))
    assert out.shape == (0, 8) and out.requires_grad
    x, u = torch.randn(*([1] * 8), 3, 4), torch.randn(*([1] * 8), 3, 4)  # 10-D: beyond npu_swiglu's 8
    assert_close(fn(x, u), ref_swiglu.silu_mul(x.double(), u.double()), "swiglu", "standard", "out")


def test_swiglu_validation():
    fn = kernel("swiglu", "standard")
    with pytest.raises(ValueError, match="same shape"):
        fn(torch.randn(2, 4), torch.randn(2, 5))
    with pytest.raises(TypeError, match="different dtypes"):
        fn(torch.randn(2, 4), torch.randn(2, 4).half())


def test_tensors_off_the_npu_are_refused_with_the_fix(monkeypatch):
    # With the real torch_npu the adapters take NPU tensors only; CPU tensors get a clear error.
    from veomni_npu.kernels import _common

    monkeypatch.setattr(_common.CHECKS, "device_types", ("npu",))
    with pytest.raises(ValueError, match=r"on cpu, but the Ascend kernels take tensors on an Ascend NPU only"):
        kernel("swiglu", "standard")(torch.randn(2, 4), torch.randn(2, 4))
