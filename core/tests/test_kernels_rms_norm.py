"""rms_norm eager kernels: float64 reference, transformers bitwise, edge cases, errors."""

import pytest
import torch
from veomni_ops.backends import reference
from veomni_ops.kernels.rms_norm import rms_norm_offset, rms_norm_standard

KERNELS = {"standard": rms_norm_standard, "offset": rms_norm_offset}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def spec(variant):
    return next(s for s in reference.rms_norm() if s.variant == variant and s.name == "eager")


def assert_within(actual, expected, tol, what):
    diff = (actual.double() - expected).abs()
    bound = tol.atol + tol.rtol * expected.abs()
    bad = diff > bound
    assert not bad.any(), (
        f"{what}: {int(bad.sum())}/{bad.numel()} elements outside atol={tol.atol} rtol={tol.rtol}; "
        f"max |diff| {diff.max().item():.3g}"
    )


def ref64(variant, x, w, eps):
    x, w = x.double(), w.double()
    xhat = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return xhat * (1.0 + w) if variant == "offset" else xhat * w


@pytest.mark.parametrize("variant", ["standard", "offset"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 5, 67), (1, 4096), (7, 1)])
def test_forward_backward_vs_float64(variant, dtype, shape):
    torch.manual_seed(hash((variant, str(dtype), shape)) % 2**31)
    h = shape[-1]
    x = (torch.randn(shape) * 3).to(dtype).requires_grad_()
    base = 0.0 if variant == "offset" else 1.0
    w = (base + 0.5 * torch.randn(h)).to(dtype).requires_grad_()
    gy = torch.randn(shape).to(dtype)
    y = KERNELS[variant](x, w, 1e-6)
    assert y.dtype == dtype and y.shape == x.shape
    gx, gw = torch.autograd.grad(y, (x, w), gy)

    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    y64 = ref64(variant, x64, w64, 1e-6)
    gx64, gw64 = torch.autograd.grad(y64, (x64, w64), gy.double())
    tol = spec(variant).tolerance(str(dtype))
    assert_within(y, y64, tol, "output")
    assert_within(gx, gx64, tol, "grad hidden_states")
    # The weight gradient sums over all rows: scale the absolute tolerance by the row count.
    rows = x.numel() // h
    wtol = type(tol)(tol.atol * max(1, rows) ** 0.5, tol.rtol)
    assert_within(gw, gw64, wtol, "grad weight")


@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_gradcheck_float64(variant):
    torch.manual_seed(0)
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: KERNELS[variant](a, b, 1e-5), (x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_bitwise_equal_to_transformers(dtype):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

    torch.manual_seed(1)
    x = (torch.randn(4, 9, 96) * 2).to(dtype)
    for cls, kernel in ((Qwen3RMSNorm, rms_norm_standard), (Qwen3NextRMSNorm, rms_norm_offset)):
        mod = cls(96, eps=1e-6).to(dtype)
        with torch.no_grad():
            mod.weight.copy_(torch.randn(96) * 0.3 + (1.0 if cls is Qwen3RMSNorm else 0.0))
        xa = x.clone().requires_grad_()
        xb = x.clone().requires_grad_()
        ya = mod(xa)
        yb = kernel(xb, mod.weight, mod.variance_epsilon if hasattr(mod, "variance_epsilon") else mod.eps)
        assert torch.equal(ya, yb), cls.__name__
        g = torch.randn_like(ya)
        (ga,) = torch.autograd.grad(ya, xa, g)
        (gb,) = torch.autograd.grad(yb, xb, g)
        assert torch.equal(ga, gb), cls.__name__


@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_non_contiguous_rows(variant):
    torch.manual_seed(2)
    base = torch.randn(6, 10, 40)
    x = base.transpose(0, 1)[:, ::2]  # neither rows nor batch contiguous
    assert not x.is_contiguous()
    w = torch.randn(40)
    assert torch.equal(KERNELS[variant](x, w, 1e-6), KERNELS[variant](x.contiguous(), w, 1e-6))
    x_last = torch.randn(5, 80)[:, ::2]  # strided last dimension
    assert torch.allclose(KERNELS[variant](x_last, w, 1e-6), KERNELS[variant](x_last.contiguous(), w, 1e-6))


def test_mixed_weight_dtype_keeps_input_dtype():
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    w = torch.ones(8, dtype=torch.float32)
    assert rms_norm_standard(x, w, 1e-6).dtype == torch.bfloat16
    assert rms_norm_offset(x, w, 1e-6).dtype == torch.bfloat16


@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_errors(variant):
    k = KERNELS[variant]
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \[H\] = \[8\]"):
        k(x, torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match=r"weight must have shape"):
        k(x, torch.ones(1, 8), 1e-6)
    with pytest.raises(TypeError, match="dtype torch.int64"):
        k(x.long(), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="eps"):
        k(x, torch.ones(8), -1.0)
