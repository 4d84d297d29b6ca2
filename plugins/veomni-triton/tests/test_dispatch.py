"""Which path a call takes: eager calls go through lean ``autograd.Function``s around the raw
launchers; the ``torch.library`` custom ops (what ``torch.compile`` traces, see the compile
tests) compute the same bits."""

from __future__ import annotations

import torch
from test_rotary import make_qk, tables
from veomni_triton.kernels import rms_norm as R
from veomni_triton.kernels.rotary import apply_rotary
from veomni_triton.kernels.swiglu import silu_mul


def _node(t: torch.Tensor) -> str:
    return type(t.grad_fn).__name__


def test_rms_norm_eager_node_and_op_agree(device):
    x = torch.randn(2, 3, 40, device=device, requires_grad=True)
    w = torch.randn(40, device=device, requires_grad=True)
    y = R.rms_norm_offset(x, w, 1e-6)
    # one autograd node, no custom-op dispatch and no view nodes around it
    assert "RMSNormFunction" in _node(y), _node(y)
    dy = torch.randn_like(y)
    y.backward(dy)
    y_op, _rstd = torch.ops.veomni_triton.rms_norm_fwd(x.detach().view(6, 40), w.detach(), 1e-6, True, False)
    torch.testing.assert_close(y.detach().view(6, 40), y_op, rtol=0, atol=0)
    with torch.no_grad():
        y_ng = R.rms_norm_offset(x, w, 1e-6)  # the no-grad launch skips rstd: same bits for y
    torch.testing.assert_close(y_ng, y.detach(), rtol=0, atol=0)
    dx_op, dw_op = torch.ops.veomni_triton.rms_norm_bwd(dy.view(6, 40), x.detach().view(6, 40), w.detach(), _rstd, True)
    torch.testing.assert_close(x.grad.view(6, 40), dx_op, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, dw_op, rtol=0, atol=0)


def test_swiglu_eager_node_and_op_agree(device):
    g = torch.randn(3, 5, 33, device=device, requires_grad=True)
    u = torch.randn(3, 5, 33, device=device, requires_grad=True)
    y = silu_mul(g, u)
    assert "SwiGLUFunction" in _node(y), _node(y)
    y_op = torch.ops.veomni_triton.swiglu_fwd(g.detach().view(15, 33), u.detach().view(15, 33))
    torch.testing.assert_close(y.detach().view(15, 33), y_op, rtol=0, atol=0)


def test_rotary_eager_node_and_double_backward(device):
    q, k = make_qk(2, 4, 2, 3, 16, device, torch.float32, "bshd_transposed")
    cos, sin = tables(2, 3, 16, device, torch.float32)
    q.requires_grad_()
    k.requires_grad_()
    qo, ko = apply_rotary(q, k, cos, sin)
    assert "RotaryFunction" in _node(qo), _node(qo)
    qo_op, ko_op = torch.ops.veomni_triton.rotary(q.detach(), k.detach(), cos, sin, False)
    torch.testing.assert_close(qo.detach(), qo_op, rtol=0, atol=0)
    torch.testing.assert_close(ko.detach(), ko_op, rtol=0, atol=0)
    # a rotation is orthogonal (cos² + sin² = 1): the Hessian of |rot(q)|² is 2·I, so a
    # Hessian-vector product through the eager backward gives back 2·v
    loss = qo.square().sum() + ko.square().sum()
    gq, gk = torch.autograd.grad(loss, (q, k), create_graph=True)
    vq, vk = torch.randn_like(gq), torch.randn_like(gk)
    hq, hk = torch.autograd.grad((gq * vq).sum() + (gk * vk).sum(), (q, k))
    torch.testing.assert_close(hq, 2 * vq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hk, 2 * vk, rtol=1e-5, atol=1e-5)


def test_load_balancing_eager_node_and_op_agree(device):
    from veomni_triton.kernels.load_balancing import load_balancing_loss

    layers = [torch.randn(24, 16, device=device, requires_grad=True) for _ in range(3)]
    mask = torch.ones(4, 6, device=device, dtype=torch.long)
    mask[:, -2:] = 0
    loss = load_balancing_loss(layers, 16, 4, mask)
    # one lean autograd node on the eager path, not the custom op's
    assert "LoadBalancingFunction" in _node(loss), _node(loss)
    grads = torch.autograd.grad(loss, layers)
    op_loss, coef = torch.ops.veomni_triton.load_balancing_loss_fwd([t.detach() for t in layers], 16, 4,
                                                                     mask.reshape(-1).float())
    torch.testing.assert_close(loss.detach(), op_loss, rtol=0, atol=0)
    dx = torch.ops.veomni_triton.load_balancing_loss_bwd(torch.ones((), device=device), [t.detach() for t in layers],
                                                         coef, mask.reshape(-1).float())
    for g, d in zip(grads, dx.unbind(0)):
        torch.testing.assert_close(g, d, rtol=0, atol=0)
    with torch.no_grad():
        assert torch.equal(load_balancing_loss(layers, 16, 4, mask), loss.detach())
