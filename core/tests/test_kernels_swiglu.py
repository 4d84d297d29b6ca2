"""swiglu eager kernel: float64 reference, transformers' MLP activation bitwise, errors."""

import pytest
import torch
from veomni_ops.backends import reference
from veomni_ops.kernels.swiglu import silu_mul

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def assert_within(actual, expected, tol, what):
    diff = (actual.double() - expected).abs()
    bad = diff > tol.atol + tol.rtol * expected.abs()
    assert not bad.any(), f"{what}: {int(bad.sum())}/{bad.numel()} outside {tol}; max |diff| {diff.max().item():.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 7, 129), (1,), (2, 4096)])
def test_forward_backward_vs_float64(dtype, shape):
    torch.manual_seed(len(shape))
    gate = (torch.randn(shape) * 3).to(dtype).requires_grad_()
    up = torch.randn(shape).to(dtype).requires_grad_()
    y = silu_mul(gate, up)
    assert y.dtype == dtype and y.shape == gate.shape
    gy = torch.randn(shape).to(dtype)
    dg, du = torch.autograd.grad(y, (gate, up), gy)
    g64, u64 = gate.detach().double().requires_grad_(), up.detach().double().requires_grad_()
    y64 = g64 / (1 + torch.exp(-g64)) * u64
    dg64, du64 = torch.autograd.grad(y64, (g64, u64), gy.double())
    tol = reference.swiglu()[0].tolerance(str(dtype))
    assert_within(y, y64, tol, "output")
    assert_within(dg, dg64, tol, "grad gate")
    assert_within(du, du64, tol, "grad up")


def test_gradcheck_float64():
    g = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    u = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(silu_mul, (g, u))


def test_equals_transformers_mlp_activation():
    from transformers.activations import ACT2FN
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

    torch.manual_seed(5)
    cfg = Qwen3Config(hidden_size=32, intermediate_size=72, hidden_act="silu")
    mlp = Qwen3MLP(cfg).to(torch.bfloat16)
    x = torch.randn(3, 5, 32, dtype=torch.bfloat16)
    ours = mlp.down_proj(silu_mul(mlp.gate_proj(x), mlp.up_proj(x)))
    assert torch.equal(ours, mlp(x))
    g, u = torch.randn(2, 72), torch.randn(2, 72)
    assert torch.equal(silu_mul(g, u), ACT2FN["silu"](g) * u)


def test_non_contiguous():
    gu = torch.randn(4, 6, 2 * 24)
    gate, up = gu.chunk(2, dim=-1)  # the fused gate_up projection's halves
    assert not gate.is_contiguous()
    # Strided and contiguous inputs take different (vectorised) CPU loops: equal up to float32 rounding.
    torch.testing.assert_close(silu_mul(gate, up), silu_mul(gate.contiguous(), up.contiguous()), rtol=1e-6, atol=1e-7)


def test_errors():
    with pytest.raises(ValueError, match="same shape"):
        silu_mul(torch.randn(2, 3), torch.randn(2, 4))
    with pytest.raises(TypeError, match="different dtypes"):
        silu_mul(torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="dtype torch.int64"):
        silu_mul(torch.ones(2, dtype=torch.long), torch.ones(2, dtype=torch.long))
