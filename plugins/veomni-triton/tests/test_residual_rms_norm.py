"""The fused residual add + RMSNorm Triton kernel vs a float64 reference, fwd and bwd, and
through the core's conformance kit (``residual_rms_norm``'s cases)."""

from __future__ import annotations

import pytest
import torch
from _helpers import DTYPES, assert_close
from veomni_ops.testing import backend_tests as kit
from veomni_ops.testing.case_check import check_case
from veomni_ops.testing.cases import harness
from veomni_triton import specs
from veomni_triton.kernels import rms_norm as R
from veomni_triton.kernels.residual_rms_norm import residual_rms_norm

EPS = 1e-6
OP = "residual_rms_norm"
CASES = harness(OP).cases("standard", "small")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.name for c in CASES])
def test_residual_conformance_cases(device, dtype, index):
    """The core's conformance cases (``residual_rms_norm``'s ``cases.py``) against the float64
    reference at the spec's tolerances; the kit's own class skips a CUDA spec on the CPU, so
    the cases are checked here directly (under the interpreter on a CPU)."""
    spec = kit.spec_for(specs, OP, name="triton")
    res = check_case(residual_rms_norm, spec, harness(OP), "standard", CASES[index], dtype, device, seed=index)
    assert res.ok, res.describe() + "".join(f"\n  {c.name}: error {c.ratio:.3g}" for c in res.comparisons)


def reference(x, residual, w, eps):
    """The contract in float64: the sum and the x̂ rounded to the input dtype as the kernel
    rounds them; the roundings pass gradients straight through (as autograd of ``.to``)."""
    dt = x.dtype
    s = residual.double() + x.double()
    s = s + (s.to(dt).double() - s).detach()
    xhat = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    xhat = xhat + (xhat.to(dt).double() - xhat).detach()
    return w.double() * xhat, s


def run(x, r, w, grad_summed=True):
    """Ours and the reference, forward and backward, on the same inputs and output gradients."""
    x, r, w = (t.detach().requires_grad_() for t in (x, r, w))
    y, s = residual_rms_norm(x, r, w, EPS)
    dy, ds = torch.randn_like(y), torch.randn_like(s)
    torch.autograd.backward([y, s] if grad_summed else [y], [dy, ds] if grad_summed else [dy])
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    y64, s64 = reference(x64, r64, w64, EPS)
    torch.autograd.backward([y64, s64] if grad_summed else [y64],
                            [dy.double(), ds.double()] if grad_summed else [dy.double()])
    return (y, s, x.grad, r.grad, w.grad), (y64, s64, x64.grad, r64.grad, w64.grad)


def check(ours, ref, what, rows):
    for name, a, b in zip(("normed", "summed", "dx", "dresidual"), ours, ref):
        assert a.dtype == ours[0].dtype and a.shape == b.shape, name
        assert_close(a, b, OP, f"{what} {name}")
    # dw sums `rows` terms: its absolute error grows like sqrt(rows)
    assert_close(ours[4], ref[4], OP, f"{what} dw", scale=max(1.0, rows**0.5))


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 100), (9, 128), (301, 24)], ids=str)
def test_residual_matches_float64_reference(device, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype)
    r = torch.randn(shape, device=device, dtype=dtype)
    w = (1.0 + 0.5 * torch.randn(shape[-1], device=device)).to(dtype)
    ours, ref = run(x, r, w)
    # x and residual get one gradient (the same tensor: d summed from the output plus through the norm)
    assert torch.equal(ours[2], ours[3])
    check(ours, ref, f"{dtype} {shape}", rows=x.numel() // shape[-1])


@pytest.mark.parametrize("scale", [1e3, 1e-3], ids=["large", "tiny"])
def test_residual_extreme_values(device, scale):
    """|x| ~ 1000 (x² overflows float16 but for the float32 statistics) and |x| ~ 1e-3 (mean(x²) ~ eps)."""
    for dtype in (torch.float32, torch.float16):
        x = scale * torch.randn(5, 64, device=device, dtype=torch.float32)
        r = scale * torch.randn(5, 64, device=device, dtype=torch.float32)
        ours, ref = run(x.to(dtype), r.to(dtype), torch.rand(64, device=device).to(dtype) + 0.5)
        check(ours, ref, f"{dtype} scale {scale}", rows=5)


def test_residual_only_normed_used(device):
    """When ``summed`` gets no gradient (zeros), dx is the norm's gradient alone."""
    ours, ref = run(torch.randn(6, 40, device=device), torch.randn(6, 40, device=device),
                    torch.randn(40, device=device), grad_summed=False)
    check(ours, ref, "normed only", rows=6)


def test_residual_strided_inputs_and_grads(device):
    big = torch.randn(2, 4, 80, device=device)
    x, r = big[..., 10:43], torch.randn(2, 33, 4, device=device).transpose(1, 2)  # a row stride; a transpose
    ours, ref = run(x, r, torch.randn(33, device=device))
    check(ours, ref, "strided", rows=8)


def test_residual_zero_rows(device):
    x = torch.randn(0, 16, device=device, requires_grad=True)
    r = torch.randn(0, 16, device=device, requires_grad=True)
    w = torch.randn(16, device=device, requires_grad=True)
    y, s = residual_rms_norm(x, r, w, EPS)
    assert y.shape == s.shape == (0, 16)
    (y.sum() + s.sum()).backward()
    assert x.grad.shape == r.grad.shape == (0, 16)
    assert torch.equal(w.grad, torch.zeros(16, device=device))


def test_residual_no_grad_same_bits(device):
    x, r, w = (torch.randn(5, 48, device=device) for _ in range(3))
    w = w[0]
    with torch.no_grad():
        plain = residual_rms_norm(x, r, w, EPS)
    graded = residual_rms_norm(x, r, w.requires_grad_(), EPS)
    assert all(torch.equal(a, b.detach()) for a, b in zip(plain, graded))


def test_residual_bad_inputs_name_the_problem(device):
    x = torch.randn(4, 32, device=device)
    with pytest.raises(ValueError, match=r"residual_rms_norm \(triton\): x \(4, 32\) .* must have one shape"):
        residual_rms_norm(x, torch.randn(4, 16, device=device), torch.randn(32, device=device), EPS)
    with pytest.raises(ValueError, match=r"weight must be \[32\]"):
        residual_rms_norm(x, x, torch.randn(16, device=device), EPS)


def test_rms_norm_backward_adds_residual_gradient(device):
    """The shared backward with ``dres``: dx is the norm's gradient plus ``dres``, one rounding."""
    x = torch.randn(9, 24, device=device)
    w = torch.randn(24, device=device)
    dy, dres = torch.randn(9, 24, device=device), torch.randn(9, 24, device=device)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + EPS)
    dx0, dw0 = R.launch_bwd(dy, x, w, rstd, False, x.get_device(), x.shape)
    dx1, dw1 = R.launch_bwd(dy, x, w, rstd, False, x.get_device(), x.shape, dres=dres)
    torch.testing.assert_close(dx1, dx0 + dres, rtol=1e-6, atol=1e-6)
    assert torch.equal(dw0, dw1)
