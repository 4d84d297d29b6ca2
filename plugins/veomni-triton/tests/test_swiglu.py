"""SwiGLU (silu(gate) * up) Triton kernels vs a float64 reference (and the core's), fwd and bwd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _helpers import DTYPES, assert_close, core_kernels, graph_capturing_backend
from veomni_triton.kernels.swiglu import silu_mul


def run_and_check(gate: torch.Tensor, up: torch.Tensor, leaves: tuple[torch.Tensor, ...], what: str) -> torch.Tensor:
    """``leaves`` are the tensors gate/up were derived from (grads are compared on those)."""
    y = silu_mul(gate, up)
    assert y.shape == gate.shape and y.dtype == gate.dtype
    dy = torch.randn_like(y)
    y.backward(dy)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    if len(leaves) == 1:  # a fused gate_up projection, chunked
        g64, u64 = leaves64[0].chunk(2, dim=-1)
    else:
        g64, u64 = leaves64
    y64 = F.silu(g64) * u64
    y64.backward(dy.double())
    assert_close(y, y64, "swiglu", f"{what} y")
    for t, t64, name in zip(leaves, leaves64, ("d(leaf 0)", "d(leaf 1)")):
        assert_close(t.grad, t64.grad, "swiglu", f"{what} {name}")
    return y


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(33,), (7, 100), (2, 3, 257)], ids=str)
def test_contiguous_matches_float64_reference(device, dtype, shape):
    g = (3 * torch.randn(shape, device=device, dtype=dtype)).requires_grad_()
    u = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    run_and_check(g, u, (g, u), f"contiguous {shape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunked_gate_up_read_in_place(device, dtype):
    """gate, up = gate_up.chunk(2, -1): strided rows, no copy, grads land in the fused tensor."""
    gu = torch.randn(2, 5, 2 * 77, device=device, dtype=dtype, requires_grad=True)
    g, u = gu.chunk(2, dim=-1)
    assert not g.is_contiguous()
    run_and_check(g, u, (gu,), "chunked gate_up")


def test_transposed_inputs(device):
    g = torch.randn(40, 6, device=device).t().requires_grad_()
    leaf_g = g
    u = torch.randn(6, 40, device=device, requires_grad=True)
    run_and_check(leaf_g, u, (leaf_g, u), "transposed gate")


def test_extreme_values(device):
    """Large |gate| saturates the sigmoid: no inf/nan, gradients still right."""
    g = torch.tensor([-80.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 80.0] * 5, device=device, requires_grad=True)
    u = torch.randn(35, device=device, requires_grad=True)
    y = run_and_check(g, u, (g, u), "extremes")
    assert torch.isfinite(y).all() and torch.isfinite(g.grad).all()


def test_only_one_input_requires_grad(device):
    g = torch.randn(4, 16, device=device, requires_grad=True)
    u = torch.randn(4, 16, device=device)
    silu_mul(g, u).sum().backward()
    g64 = g.detach().double().requires_grad_()
    (F.silu(g64) * u.double()).sum().backward()
    assert_close(g.grad, g64.grad, "swiglu", "dgate")


def test_matches_core_eager(device):
    core = core_kernels("swiglu")
    for dtype in DTYPES:
        g = torch.randn(3, 5, 96, device=device, dtype=dtype, requires_grad=True)
        u = torch.randn(3, 5, 96, device=device, dtype=dtype, requires_grad=True)
        dy = torch.randn(3, 5, 96, device=device, dtype=dtype)
        y = silu_mul(g, u)
        y.backward(dy)
        gr = g.detach().clone().requires_grad_()
        ur = u.detach().clone().requires_grad_()
        yr = core.silu_mul(gr, ur)
        yr.backward(dy)
        assert_close(y, yr, "swiglu", "vs core y")
        assert_close(g.grad, gr.grad, "swiglu", "vs core dgate")
        assert_close(u.grad, ur.grad, "swiglu", "vs core dup")


def test_compile_fullgraph_no_break(device):
    graphs: list = []

    def f(gu):
        g, u = gu.chunk(2, dim=-1)
        return silu_mul(g, u).square().sum()

    compiled = torch.compile(f, fullgraph=True, backend=graph_capturing_backend(graphs))
    gu = torch.randn(3, 4, 2 * 24, device=device, requires_grad=True)
    compiled(gu).backward()
    assert len(graphs) == 1
    assert "veomni_triton.swiglu_fwd" in graphs[0].code
    gu2 = gu.detach().clone().requires_grad_()
    f(gu2).backward()
    torch.testing.assert_close(gu.grad, gu2.grad)


def test_errors_are_clear(device):
    g = torch.randn(4, 16, device=device)
    with pytest.raises(ValueError, match="same shape"):
        silu_mul(g, torch.randn(4, 15, device=device))
    with pytest.raises(TypeError, match="cast one"):
        silu_mul(g, g.to(torch.bfloat16))
    with pytest.raises(TypeError, match="int64"):
        silu_mul(g.long(), g.long())
    with pytest.raises(ValueError, match="I >= 1"):
        silu_mul(torch.randn(4, 0, device=device), torch.randn(4, 0, device=device))
