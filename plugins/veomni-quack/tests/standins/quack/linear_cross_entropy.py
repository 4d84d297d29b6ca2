"""STAND-IN of quack.linear_cross_entropy (0.6.5): ``chunked_linear_cross_entropy``, plain torch.

The base (non-scaled-exp) pipeline: per chunk ``logits = x_chunk @ W.T`` in the input dtype,
float32 per-row losses, dlogits in the input dtype, dX and a float32 dW filled in the forward,
scaled in place by the incoming gradient in backward.
"""

from typing import Literal

import torch
from torch import Tensor

from quack._layout import assert_layout
from quack.cross_entropy import _row_losses

CALLS: list = []


def _chunk(x_chunk, weight, target_chunk, ignore_index, need_grad):
    logits = x_chunk @ weight.mT  # input dtype, as torch.mm(out=logits_chunk)
    loss, lse = _row_losses(logits, target_chunk, ignore_index)
    if not need_grad:
        return loss, None
    valid = target_chunk != ignore_index
    safe = torch.where(valid, target_chunk, torch.zeros_like(target_chunk)).long()
    probs = torch.exp(logits.float() - lse[:, None])
    g = probs.scatter_add(1, safe[:, None], -torch.ones_like(probs[:, :1])) * valid[:, None]
    return loss, g.to(x_chunk.dtype)  # dlogits overwrite the (input-dtype) logits buffer


def chunked_linear_cross_entropy_fwd(x, weight, target, chunk_size=4096, ignore_index=-100, tuned=True,
                                     need_dx=True, need_dw=True):
    b_l, d = x.shape
    assert chunk_size % 8 == 0, "chunk_size must be multiple of 8"
    assert b_l % 8 == 0
    assert_layout(x, 8, "x")
    assert_layout(weight, 8, "weight")
    assert d % 8 == 0 and weight.shape[0] % 8 == 0, "TMA needs 16-byte rows"
    loss = torch.empty(b_l, dtype=torch.float32, device=x.device)
    dx = torch.empty_like(x) if need_dx else None
    dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if need_dw else None
    for s in range(0, b_l, chunk_size):
        e = min(s + chunk_size, b_l)
        loss[s:e], g = _chunk(x[s:e], weight, target[s:e], ignore_index, need_dx or need_dw)
        if need_dx:
            dx[s:e] = g @ weight
        if need_dw:
            dw += (g.mT @ x[s:e]).float()
    return loss, dx, dw


class ChunkedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, target, ignore_index=-100, reduction="mean", chunk_size=4096, tuned=True):
        ctx.weight_dtype = weight.dtype
        need_dx, need_dw = x.requires_grad, weight.requires_grad
        loss, dx, dw = chunked_linear_cross_entropy_fwd(x, weight, target, chunk_size, ignore_index, tuned,
                                                        need_dx, need_dw)
        loss_scale = None if reduction == "sum" else 1.0 / (target != ignore_index).sum().float()
        ctx.save_for_backward(dx, dw, loss_scale)
        loss_sum = loss.sum()
        return loss_sum if loss_scale is None else loss_sum * loss_scale

    @staticmethod
    def backward(ctx, dloss):
        dx, dw, loss_scale = ctx.saved_tensors
        if loss_scale is not None:
            dloss = dloss * loss_scale
        if dx is not None:
            dx.mul_(dloss)  # in place, as the real one
        if dw is not None:
            dw = dw.mul_(dloss).to(ctx.weight_dtype)
        return dx, dw, None, None, None, None, None


def chunked_linear_cross_entropy(
    x: Tensor,
    weight: Tensor,
    target: Tensor,
    chunk_size: int = 4096,
    ignore_index: int = -100,
    reduction: Literal["mean", "sum"] = "mean",
    tuned: bool = True,
    use_scaled_exp: bool | None = None,
) -> Tensor:
    CALLS.append(dict(x=x, weight=weight, target=target, chunk_size=chunk_size, ignore_index=ignore_index,
                      reduction=reduction, tuned=tuned, use_scaled_exp=use_scaled_exp))
    if reduction not in ["mean", "sum"]:
        raise ValueError(f"Invalid reduction: {reduction}")
    if not torch.is_grad_enabled() or not (x.requires_grad or weight.requires_grad):
        loss, _, _ = chunked_linear_cross_entropy_fwd(x, weight, target, chunk_size, ignore_index, tuned,
                                                      False, False)
        loss_sum = loss.sum()
        return loss_sum if reduction == "sum" else loss_sum / (target != ignore_index).sum().float()
    return ChunkedLinearCrossEntropyFunction.apply(x, weight, target, ignore_index, reduction, chunk_size, tuned)
