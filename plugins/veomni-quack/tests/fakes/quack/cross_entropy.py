"""STAND-IN of quack.cross_entropy (0.6.5): ``cross_entropy`` with the real signature, plain torch."""

from typing import Literal

import torch

from quack._layout import assert_layout, div_for

CALLS: list = []


def _row_losses(x: torch.Tensor, target: torch.Tensor, ignore_index: int):
    """Float32 per-row loss (0 where ignored) and lse, as the real forward kernel writes them."""
    xf = x.float()
    lse = torch.logsumexp(xf, dim=-1)
    valid = target != ignore_index
    # The real kernel reads x[row, target] only for counted rows; an out-of-range target is
    # an out-of-bounds read there, an IndexError here.
    safe = torch.where(valid, target, torch.zeros_like(target)).long()
    picked = xf.gather(1, safe[:, None])[:, 0]
    return torch.where(valid, lse - picked, torch.zeros_like(lse)), lse


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, target, lse_partial=None, weight=None, ignore_index=-100, inplace_backward=False):
        assert x.dim() == 2, "Input must be 2D"
        assert target.dim() == 1, "Target must be 1D"
        assert x.dtype in [torch.float16, torch.bfloat16, torch.float32], "Unsupported input dtype"
        assert target.dtype in [torch.int32, torch.int64], "Target must be int32 or int64"
        assert lse_partial is None and weight is None  # not used by the adapters
        assert_layout(x, div_for(x.shape[1], x), "x")
        loss, lse = _row_losses(x, target, ignore_index)
        ctx.save_for_backward(x, target, lse)
        ctx.ignore_index = ignore_index
        ctx.inplace_backward = inplace_backward
        return loss

    @staticmethod
    def backward(ctx, dloss):
        x, target, lse = ctx.saved_tensors
        assert dloss.dtype == torch.float32
        probs = torch.exp(x.float() - lse[:, None])
        valid = target != ctx.ignore_index
        safe = torch.where(valid, target, torch.zeros_like(target)).long()
        grad = probs.scatter_add(1, safe[:, None], -torch.ones_like(probs[:, :1]))
        grad = grad * (dloss * valid)[:, None]
        if ctx.inplace_backward:
            x.copy_(grad.to(x.dtype))
            return x, None, None, None, None, None
        return grad.to(x.dtype), None, None, None, None, None


def cross_entropy(
    x: torch.Tensor,
    target: torch.Tensor,
    lse_partial: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: Literal["none", "mean", "sum"] = "mean",
    inplace_backward: bool = False,
) -> torch.Tensor:
    CALLS.append(dict(x=x, target=target, lse_partial=lse_partial, weight=weight, ignore_index=ignore_index,
                      reduction=reduction, inplace_backward=inplace_backward))
    loss = CrossEntropyFunction.apply(x, target, lse_partial, weight, ignore_index, inplace_backward)
    if reduction == "mean":
        return loss.sum() / (target != ignore_index).sum().float()
    elif reduction == "sum":
        return loss.sum()
    elif reduction == "none":
        return loss
    raise ValueError(f"Invalid reduction mode: {reduction}. Expected one of 'none', 'mean', or 'sum'")
