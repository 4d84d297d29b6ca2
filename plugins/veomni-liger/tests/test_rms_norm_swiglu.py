"""Liger's real RMSNorm and SwiGLU kernels through the adapters, forward and backward.

On a GPU they run as they are. Triton's CPU interpreter cannot run Liger 0.8.5's versions
unaided, for two reasons that have nothing to do with the kernels' math, so under the
interpreter two test-only shims are installed:

* Scalar kernel arguments arrive as Python floats, and the kernels call ``eps.to(tl.float32)``
  on them (added in 0.8.2 to pin Inductor's fp64 scalars): the shim passes ``float``
  subclasses whose ``.to()`` returns the value.
* RMSNorm's ``rsqrt`` comes from ``libdevice``, which the interpreter lacks: the shim swaps in
  ``tl.rsqrt`` (same function).

Everything else -- loads, stores, casting modes, the in-place SwiGLU backward -- is Liger's code.
The interpreter does bf16 arithmetic on raw bits, so bf16 runs only on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import veomni_liger.kernels.rms_norm as rms
import veomni_liger.kernels.swiglu as sw
from _helpers import BF16_ARITH_SKIP, assert_close, core_kernels, dtype_params, interpreter_active, spec_for

DTYPES = dtype_params(bf16_arith=True)


class _InterpFloat(float):
    """A float that answers the ``.to(dtype)`` Liger's kernels call on scalar arguments."""

    def to(self, dtype):  # noqa: ARG002 - Triton's signature
        return float(self)


@triton.jit
def _rsqrt(x):
    # Stands in for libdevice's rsqrt under the interpreter (a module-level jit function:
    # the interpreter resolves `tl` through the function's globals).
    return tl.rsqrt(x)


@pytest.fixture
def liger_kernels_runnable(monkeypatch):
    if not interpreter_active():
        return
    from liger_kernel.ops import rms_norm as liger_rms
    from liger_kernel.ops import swiglu as liger_swiglu

    monkeypatch.setattr(liger_rms, "rsqrt", _rsqrt)
    real = rms.LigerRMSNormFunction

    class _ScalarShim:
        @staticmethod
        def apply(x, w, eps, offset, casting_mode, in_place):
            return real.apply(x, w, _InterpFloat(eps), _InterpFloat(offset), casting_mode, in_place)

    monkeypatch.setattr(rms, "LigerRMSNormFunction", _ScalarShim)
    # swiglu_forward/backward call float(gate_multiplier): a module global shadows the builtin.
    monkeypatch.setattr(liger_swiglu, "float", _InterpFloat, raising=False)


def _ref_rms(x, w, eps, variant):
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return xhat * w if variant == "standard" else xhat * (1 + w)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_rms_norm_forward_backward(liger_kernels_runnable, device, dtype, variant):
    fn = rms.rms_norm_standard if variant == "standard" else rms.rms_norm_offset
    h = 96  # not a power of two: masked columns
    x = torch.randn(3, 5, h, device=device).to(dtype).requires_grad_()
    w = ((1.0 if variant == "standard" else 0.0) + 0.1 * torch.randn(h, device=device)).to(dtype).requires_grad_()
    y = fn(x, w, 1e-6)
    assert y.shape == x.shape and y.dtype == dtype
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    ref = _ref_rms(x64, w64, 1e-6, variant)
    assert_close(y, ref, "rms_norm", variant, "y")
    g = torch.randn_like(y)
    g_before = g.clone()
    y.backward(g)
    ref.backward(g.double())
    assert torch.equal(g, g_before)  # in_place=False: the incoming gradient is not overwritten
    assert_close(x.grad, x64.grad, "rms_norm", variant, "dx")
    assert_close(w.grad, w64.grad, "rms_norm", variant, "dw")


@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_rms_norm_matches_the_core_reference(liger_kernels_runnable, device, variant):
    core = core_kernels("rms_norm")
    x = torch.randn(7, 64, device=device)
    w = 0.1 * torch.randn(64, device=device) + (1.0 if variant == "standard" else 0.0)
    ours = (rms.rms_norm_standard if variant == "standard" else rms.rms_norm_offset)(x, w, 1e-5)
    eager = (core.rms_norm_standard if variant == "standard" else core.rms_norm_offset)(x, w, 1e-5)
    assert_close(ours, eager, "rms_norm", variant, "y vs core eager")


def test_rms_norm_non_contiguous_rows(liger_kernels_runnable, device):
    base = torch.randn(64, 6, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    rms.rms_norm_standard(base.t(), w, 1e-6).sum().backward()
    b64 = base.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    _ref_rms(b64.t(), w64, 1e-6, "standard").sum().backward()
    assert_close(base.grad, b64.grad, "rms_norm", "standard", "dx (transposed input)")
    assert_close(w.grad, w64.grad, "rms_norm", "standard", "dw (transposed input)")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_forward_backward(liger_kernels_runnable, device, dtype):
    gate0 = torch.randn(4, 3, 200, device=device).to(dtype)
    up0 = torch.randn(4, 3, 200, device=device).to(dtype)
    gate = gate0.clone().requires_grad_()
    up = up0.clone().requires_grad_()
    out = sw.silu_mul(gate * 1, up * 1)  # non-leaf inputs: Liger's backward writes into them
    g64 = gate0.double().requires_grad_()
    u64 = up0.double().requires_grad_()
    ref = F.silu(g64) * u64
    assert_close(out, ref, "swiglu", "standard", "out")
    go = torch.randn_like(out)
    out.backward(go)
    ref.backward(go.double())
    assert_close(gate.grad, g64.grad, "swiglu", "standard", "dgate")
    assert_close(up.grad, u64.grad, "swiglu", "standard", "dup")


def test_swiglu_fused_projection_halves_and_core_reference(liger_kernels_runnable, device):
    core = core_kernels("swiglu")
    fused = torch.randn(6, 2 * 40, device=device, requires_grad=True)
    gate, up = fused.chunk(2, dim=-1)
    out = sw.silu_mul(gate, up)
    assert_close(out, core.silu_mul(gate.detach(), up.detach()), "swiglu", "standard", "out vs core eager")
    before = fused.detach().clone()
    out.sum().backward()
    assert torch.equal(fused.detach(), before)  # the halves were copied, not overwritten
    ref = before.clone().double().requires_grad_()
    g, u = ref.chunk(2, dim=-1)
    (F.silu(g) * u).sum().backward()
    assert_close(fused.grad, ref.grad, "swiglu", "standard", "dfused")


def test_swiglu_second_backward_raises(liger_kernels_runnable, device):
    x = torch.randn(3, 16, device=device, requires_grad=True)
    loss = sw.silu_mul(x * 2, x * 3).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=BF16_ARITH_SKIP)])
@pytest.mark.parametrize("variant", ["standard", "offset"])
def test_rms_norm_float32_weight_with_16_bit_input_conformance_case(liger_kernels_runnable, device, dtype, variant):
    # The conformance kit's mixed-precision case: a float32 weight with 16-bit activations keeps
    # the activations' dtype for the output (and the weight's for its gradient).
    from veomni_ops.testing.cases import harness
    from veomni_ops.testing.runner import check_case

    h = harness("rms_norm")
    case = next(c for c in h.cases(variant, "small") if c.name.startswith("fp32-weight"))
    fn = rms.rms_norm_standard if variant == "standard" else rms.rms_norm_offset
    res = check_case(fn, spec_for("rms_norm", variant), h, variant, case, dtype, device, seed=4)
    assert res.status == "pass", res.describe()
