"""Argument translation of the RMSNorm and SwiGLU adapters, with recording stand-ins.

The stand-ins replace Liger's function and record exactly what the adapter passes (argument
order, offset, casting mode, ``in_place``, contiguity, dtypes), then compute what Liger's
Triton kernels compute (read from ``liger_kernel/ops/rms_norm.py`` and ``swiglu.py``),
including SwiGLU's in-place backward done behind autograd's back. So these tests pin the
translation and the autograd plumbing independently of Triton; ``test_rms_norm_swiglu.py``
runs the real kernels. The last test pins the Liger signatures every adapter relies on.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
import veomni_liger.kernels.rms_norm as rms
import veomni_liger.kernels.swiglu as sw
from _helpers import assert_close, core_kernels

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


# ---------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------


class FakeLigerRMSNorm(torch.autograd.Function):
    """``LigerRMSNormFunction`` as its kernel computes it: y = (x / rms) * (offset + w)."""

    calls: list = []

    @staticmethod
    def forward(ctx, X, W, eps, offset=0.0, casting_mode="llama", in_place=True, row_mode=None):
        FakeLigerRMSNorm.calls.append(
            {"X": X, "W": W, "eps": eps, "offset": offset, "casting_mode": casting_mode, "in_place": in_place}
        )
        ctx.save_for_backward(X, W)
        ctx.args = (eps, offset, casting_mode)
        return FakeLigerRMSNorm._math(X, W, eps, offset, casting_mode)

    @staticmethod
    def _math(X, W, eps, offset, casting_mode):
        xf = X.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        if casting_mode == "llama":  # x̂ rounded to X's dtype, weight product in fp32, stored in X's dtype
            return (((xf * rstd).to(X.dtype)).float() * (offset + W.float())).to(X.dtype)
        if casting_mode == "gemma":  # all fp32, one rounding at the end
            return (xf * rstd * (offset + W.float())).to(X.dtype)
        raise AssertionError(f"unexpected casting mode {casting_mode!r}")

    @staticmethod
    def backward(ctx, dy):
        X, W = ctx.saved_tensors
        with torch.enable_grad():
            x = X.detach().requires_grad_()
            w = W.detach().requires_grad_()
            y = FakeLigerRMSNorm._math(x, w, *ctx.args)
            dx, dw = torch.autograd.grad(y, (x, w), dy)
        return dx, dw, None, None, None, None, None


@pytest.fixture
def fake_rms(monkeypatch):
    FakeLigerRMSNorm.calls = []
    monkeypatch.setattr(rms, "LigerRMSNormFunction", FakeLigerRMSNorm)
    return FakeLigerRMSNorm


def _ref_rms(x, w, eps, variant):
    x64, w64 = x.double(), w.double()
    xhat = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return xhat * w64 if variant == "standard" else xhat * (1 + w64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_rms_norm_translation_gives_the_contract(fake_rms, dtype, variant):
    fn = rms.rms_norm_standard if variant == "standard" else rms.rms_norm_offset
    x = torch.randn(2, 5, 48, dtype=dtype).requires_grad_()
    w = (torch.randn(48) * 0.1 + (1.0 if variant == "standard" else 0.0)).to(dtype).requires_grad_()
    y = fn(x, w, 1e-6)
    (call,) = fake_rms.calls
    assert call["X"] is x and call["W"] is w and call["eps"] == 1e-6
    assert (call["offset"], call["casting_mode"]) == ((0.0, "llama") if variant == "standard" else (1.0, "gemma"))
    assert call["in_place"] is False  # never write dX into a gradient autograd may share
    assert y.shape == x.shape and y.dtype == dtype
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = _ref_rms(x64, w64, 1e-6, variant)
    assert_close(y, ref, "rms_norm", variant, "y")
    g = torch.randn_like(y)
    y.backward(g)
    ref.backward(g.double())
    assert_close(x.grad, x64.grad, "rms_norm", variant, "dx")
    assert_close(w.grad, w64.grad, "rms_norm", variant, "dw")


@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_rms_norm_translation_matches_the_core_reference(fake_rms, variant):
    core = core_kernels("rms_norm")
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    w = (torch.randn(64) * 0.1).to(torch.bfloat16)
    ours = (rms.rms_norm_standard if variant == "standard" else rms.rms_norm_offset)(x, w, 1e-5)
    eager = (core.rms_norm_standard if variant == "standard" else core.rms_norm_offset)(x, w, 1e-5)
    # Same roundings in the same order: bitwise equal to transformers' formula.
    assert torch.equal(ours, eager)


def test_rms_norm_passes_non_contiguous_and_mixed_dtype_through(fake_rms):
    x = torch.randn(16, 4, dtype=torch.bfloat16).t()  # [4, 16], rows strided
    w = torch.randn(16)  # float32 weight with bf16 activations
    y = rms.rms_norm_standard(x, w, 1e-6)
    assert y.dtype == torch.bfloat16  # the contract keeps the input dtype
    assert fake_rms.calls[0]["X"] is x  # Liger's ensure_contiguous makes the copy


@pytest.mark.parametrize(
    "x, w, eps, exc, match",
    [
        (torch.randn(2, 8), torch.randn(7), 1e-6, ValueError, r"\[H\]"),
        (torch.randn(2, 8).double(), torch.randn(8).double(), 1e-6, TypeError, "float64"),
        (torch.randn(2, 8), torch.randn(8), -1.0, ValueError, "eps"),
        (torch.randn(2, 8), torch.randn(8), torch.tensor(1e-6), ValueError, "eps"),
        (torch.randn(()), torch.randn(1), 1e-6, ValueError, "at least one dimension"),
        (torch.zeros(1, 65537, dtype=torch.float16), torch.zeros(65537, dtype=torch.float16), 1e-6, ValueError,
         "65536"),
    ],
)
def test_rms_norm_bad_inputs(fake_rms, x, w, eps, exc, match):
    with pytest.raises(exc, match=match):
        rms.rms_norm_standard(x, w, eps)
    assert not fake_rms.calls


# ---------------------------------------------------------------------------------------
# SwiGLU
# ---------------------------------------------------------------------------------------


class FakeSwiglu:
    """Liger's swiglu_forward/backward, including the backward's writes into a and b.

    The writes go through ``.data`` so that, like Triton's stores, they do not bump
    autograd's version counter: any version check the tests see is the adapter's.
    """

    def __init__(self):
        self.calls = []

    def forward(self, a, b):
        self.calls.append(("forward", a, b))
        assert a.is_contiguous() and b.is_contiguous() and a.shape == b.shape and a.dtype == b.dtype
        return a, b, F.silu(a.float()).to(b.dtype) * b

    def backward(self, a, b, dc):
        self.calls.append(("backward", a, b, dc))
        # Liger walks a, b and dc with one row stride.
        assert a.is_contiguous() and b.is_contiguous() and dc.is_contiguous()
        af, bf, dcf = a.float(), b.float(), dc.float()
        sig = torch.sigmoid(af)
        silu = af * sig
        db = dcf * silu
        da = dcf * (silu * (1 - sig) + sig) * bf
        a.data.copy_(da)
        b.data.copy_(db)
        return a, b


@pytest.fixture
def fake_swiglu(monkeypatch):
    fake = FakeSwiglu()
    monkeypatch.setattr(sw, "swiglu_forward", fake.forward)
    monkeypatch.setattr(sw, "swiglu_backward", fake.backward)
    return fake


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_translation_forward_backward(fake_swiglu, dtype):
    gate0 = torch.randn(3, 7, 40).to(dtype)
    up0 = torch.randn(3, 7, 40).to(dtype)
    gate, up = gate0.clone().requires_grad_(), up0.clone().requires_grad_()
    # Non-leaf inputs, as a model's projections produce them.
    out = sw.silu_mul(gate * 1, up * 1)
    assert out.shape == gate.shape and out.dtype == dtype
    g64, u64 = gate0.double().requires_grad_(), up0.double().requires_grad_()
    ref = F.silu(g64) * u64
    assert_close(out, ref, "swiglu", "standard", "out")
    go = torch.randn_like(out)
    out.backward(go)
    ref.backward(go.double())
    assert_close(gate.grad, g64.grad, "swiglu", "standard", "dgate")
    assert_close(up.grad, u64.grad, "swiglu", "standard", "dup")


def test_swiglu_matches_the_core_reference(fake_swiglu):
    core = core_kernels("swiglu")
    gate, up = torch.randn(4, 24, dtype=torch.bfloat16), torch.randn(4, 24, dtype=torch.bfloat16)
    assert torch.equal(sw.silu_mul(gate, up), core.silu_mul(gate, up))


def test_swiglu_halves_of_a_fused_projection_are_copied_not_overwritten(fake_swiglu):
    fused = torch.randn(5, 2 * 16, requires_grad=True)
    gate_up = fused * 1
    before = gate_up.detach().clone()
    gate, up = gate_up.chunk(2, dim=-1)  # non-contiguous views
    sw.silu_mul(gate, up).sum().backward()
    _, a, b = fake_swiglu.calls[0]
    assert a.is_contiguous() and a.data_ptr() != gate.data_ptr()
    assert torch.equal(gate_up.detach(), before)
    ref = fused.detach().clone().requires_grad_()
    g, u = ref.chunk(2, dim=-1)
    (F.silu(g) * u).sum().backward()
    torch.testing.assert_close(fused.grad, ref.grad)


def test_swiglu_same_tensor_for_gate_and_up(fake_swiglu):
    x = torch.randn(3, 8, requires_grad=True)
    sw.silu_mul(x * 1, x * 1).sum().backward()  # two distinct non-leaf tensors: the usual case
    grad_two = x.grad.clone()
    x.grad = None
    h = x * 1
    sw.silu_mul(h, h).sum().backward()  # one tensor twice: da and db must not share a buffer
    torch.testing.assert_close(x.grad, grad_two)
    ref = x.detach().clone().requires_grad_()
    (F.silu(ref) * ref).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)


def test_swiglu_backward_overwrite_is_visible_to_autograd(fake_swiglu):
    x = torch.randn(4, 8, requires_grad=True)
    gate, up = x * 2, x * 3
    loss = sw.silu_mul(gate, up).sum() / 2
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    # Another op that saved gate and runs its backward after ours sees the overwrite too.
    gate2 = x * 2
    z = gate2.sin().sum()  # SinBackward saves gate2
    loss2 = z + sw.silu_mul(gate2, x * 3).sum()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss2.backward()


@pytest.mark.parametrize(
    "gate, up, exc, match",
    [
        (torch.randn(2, 8), torch.randn(2, 7), ValueError, "same shape"),
        (torch.randn(2, 8), torch.randn(2, 8).half(), TypeError, "different dtypes"),
        (torch.randn(2, 8).double(), torch.randn(2, 8).double(), TypeError, "float64"),
        (torch.randn(()), torch.randn(()), ValueError, "at least one dimension"),
    ],
)
def test_swiglu_bad_inputs(fake_swiglu, gate, up, exc, match):
    with pytest.raises(exc, match=match):
        sw.silu_mul(gate, up)
    assert not fake_swiglu.calls


# ---------------------------------------------------------------------------------------
# The Liger signatures the adapters call (positional order matters)
# ---------------------------------------------------------------------------------------


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_liger_signatures_the_adapters_rely_on():
    from liger_kernel.ops.cross_entropy import cross_entropy_forward
    from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import rope_backward, rope_forward
    from liger_kernel.ops.swiglu import swiglu_backward, swiglu_forward

    assert _params(LigerRMSNormFunction.forward)[:7] == [
        "ctx", "X", "W", "eps", "offset", "casting_mode", "in_place",
    ]
    assert _params(swiglu_forward)[:2] == ["a", "b"]
    assert _params(swiglu_backward)[:3] == ["a", "b", "dc"]
    assert _params(rope_forward)[:4] == ["q", "k", "cos", "sin"]
    assert _params(rope_backward)[:4] == ["dq", "dk", "cos", "sin"]
    assert _params(cross_entropy_forward)[:9] == [
        "_input", "target", "weight", "ignore_index", "lse_square_scale", "label_smoothing", "reduction",
        "softcap", "return_z_loss",
    ]
    assert {"_input", "weight", "target", "bias", "ignore_index", "reduction", "accum_dtype"} <= set(
        _params(fused_linear_cross_entropy_forward)
    )
    assert _params(LigerFusedMoEFunction.forward) == [
        "ctx", "x", "gate_up_proj", "down_proj", "top_k_index", "top_k_weights",
    ]
