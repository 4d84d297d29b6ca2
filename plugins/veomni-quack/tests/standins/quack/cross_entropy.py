"""STAND-IN of quack.cross_entropy (0.6.5): ``cross_entropy`` with the real signature, plain torch."""

import math
from typing import Literal

import torch

from quack._layout import assert_copy_width, assert_layout, div_for

CALLS: list = []

#: Compute capability major the stand-in "compiles" for (the real one asks the DSL).
ARCH_MAJOR = 9


def _forward_launch(n: int, bits: int):
    """(cluster_n, threads_per_row, vecsize, tile_n) of the real 0.6.5 forward kernel
    (CrossEntropy._set_cluster_n, _threads_per_row, ReductionBase._get_tiled_copy)."""
    if ARCH_MAJOR < 9:
        cluster = 1
    else:
        wide = not (bits == 16 or (ARCH_MAJOR == 12 and bits >= 32))
        limits = [(16384, 1), (65536, 2), (131072, 4), (262144, 8)] if wide else \
            [(16384, 1), (32768, 2), (65536, 4), (131072, 8)]
        cluster = 8 if ARCH_MAJOR == 12 else 16
        for limit, c in limits:
            if n <= limit:
                cluster = c
                break
    tpr = 256
    for limit, t in [(64, 8), (128, 16), (3072, 32), (6144, 64), (16384, 128)]:
        if n <= limit:
            tpr = t
            break
    vec = math.gcd(n, 128 // bits)
    blocks = -(-(n // vec) // (tpr * cluster))
    return cluster, tpr, vec, vec * blocks * tpr


def _clustered_lse(xf: torch.Tensor, bits: int) -> torch.Tensor:
    """The real forward's online-softmax reduction, step by step: columns past N are -inf;
    each group of min(threads_per_row, 32) threads takes its max and sum(exp(x - max)) (NaN
    for a group with no column < N: exp(-inf - -inf)); the groups of the whole cluster are
    then combined as sum_g s_g * exp(m_g - M)."""
    m, n = xf.shape
    cluster, tpr, vec, tile = _forward_launch(n, bits)
    full = torch.full((m, cluster * tile), -math.inf, dtype=torch.float32)
    full[:, :n] = xf
    # column = cta * tile + block * (tpr * vec) + thread * vec + v
    t = full.view(m, cluster, tile // (tpr * vec), tpr, vec)
    group = min(tpr, 32)
    t = t.view(m, cluster, t.shape[2], tpr // group, group, vec).permute(0, 1, 3, 2, 4, 5)
    t = t.reshape(m, cluster, tpr // group, -1)
    gmax = t.amax(-1)
    gsum = torch.exp(t - gmax[..., None]).sum(-1)
    top = gmax.amax(dim=(1, 2))
    total = (gsum * torch.exp(gmax - top[:, None, None])).sum(dim=(1, 2))
    return top + torch.log(total)


def _row_losses(x: torch.Tensor, target: torch.Tensor, ignore_index: int):
    """Float32 per-row loss (0 where ignored) and lse, as the real forward kernel writes them."""
    xf = x.float()
    lse = _clustered_lse(xf, x.element_size() * 8)
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
        assert_copy_width(x.shape[1], x)
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
