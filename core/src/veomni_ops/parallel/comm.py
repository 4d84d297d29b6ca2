"""Differentiable collectives over ``torch.distributed`` (gloo on CPU, NCCL on GPU).

Small ``autograd.Function`` s, each one collective forward and its adjoint backward:

* :func:`all_to_all` -- ``all_to_all_single`` of one or more tensors along dim 0 with split
  sizes (equal or not); backward is the reverse all-to-all. Several tensors go in one
  Function so that every rank runs their backward collectives in the same order.
* :func:`all_gather` -- ``all_gather_into_tensor`` along a new dim 0; backward sums every
  rank's gradient of this rank's piece (an all-reduce, then this rank's slice: gloo has no
  reduce-scatter of tensors).

They are what the Ulysses and expert-parallel wrappers use; no other communication layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def _a2a(x: torch.Tensor, out_splits: Sequence[int] | None, in_splits: Sequence[int] | None, group) -> torch.Tensor:
    x = x.contiguous()
    rows = x.shape[0] if out_splits is None else sum(out_splits)
    out = x.new_empty((rows, *x.shape[1:]))
    dist.all_to_all_single(out, x, output_split_sizes=None if out_splits is None else list(out_splits),
                           input_split_sizes=None if in_splits is None else list(in_splits), group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, in_splits, out_splits, *tensors):
        ctx.group, ctx.in_splits, ctx.out_splits = group, in_splits, out_splits
        outs = tuple(_a2a(t, out_splits, in_splits, group) for t in tensors)
        ctx.shapes = [(o.shape, o.dtype, o.device) for o in outs]
        return outs

    @staticmethod
    def backward(ctx, *grads):
        out = []
        for i, g in enumerate(grads):
            if not ctx.needs_input_grad[3 + i]:  # the same on every rank: the model's structure decides it
                out.append(None)
                continue
            if g is None:  # still communicate, so every rank runs the same collectives
                shape, dtype, device = ctx.shapes[i]
                g = torch.zeros(shape, dtype=dtype, device=device)
            out.append(_a2a(g, ctx.in_splits, ctx.out_splits, ctx.group))
        return (None, None, None, *out)


def all_to_all(group: dist.ProcessGroup | None, *tensors: torch.Tensor, in_splits: Sequence[int] | None = None,
               out_splits: Sequence[int] | None = None) -> tuple[torch.Tensor, ...]:
    """Send rows ``[sum(in_splits[:j]), ...)`` of every tensor to rank ``j`` of ``group``; receive
    ``out_splits[j]`` rows from rank ``j``. ``None`` splits: equal chunks of dim 0. Differentiable.

    While dynamo traces (a compiled decoder layer: Ulysses' exchanges), each tensor goes through
    PyTorch's functional, differentiable ``all_to_all_single_autograd`` instead of
    :class:`_AllToAll`: torch 2.11's dynamo inlines that Function's forward, where the collective
    fills a fresh buffer in place, and differentiates the traced body, in which the buffer does
    not depend on the input: the gradient through the exchange was zero (q, k, v projections and
    everything before them got none, and a compiled ``sp: 2`` job on 2 x H100 trained away from one
    process). torch 2.13 traces the Function's own backward; CI runs the layouts' compile tests
    against one process on both (``nox -s gpu_image_torch``: torch 2.11). The functional op
    returns its result and carries its adjoint."""
    if torch.compiler.is_compiling():
        return _traced_all_to_all(group, tensors, in_splits, out_splits)
    return _AllToAll.apply(group, None if in_splits is None else tuple(in_splits),
                           None if out_splits is None else tuple(out_splits), *tensors)


def _traced_all_to_all(group, tensors: Sequence[torch.Tensor], in_splits: Sequence[int] | None,
                       out_splits: Sequence[int] | None) -> tuple[torch.Tensor, ...]:
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    group = group if group is not None else dist.group.WORLD
    return tuple(all_to_all_single_autograd(t.contiguous(), None if out_splits is None else list(out_splits),
                                            None if in_splits is None else list(in_splits), group)
                 for t in tensors)


def all_to_all_nograd(group: dist.ProcessGroup | None, x: torch.Tensor, in_splits: Sequence[int] | None = None,
                      out_splits: Sequence[int] | None = None) -> torch.Tensor:
    """The same exchange for a tensor that carries no gradient (integer indices, counts)."""
    return _a2a(x, out_splits, in_splits, group)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        n = dist.get_world_size(group)
        return _gather(x, n, group)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return None, g[ctx.rank]


def all_gather(group: dist.ProcessGroup | None, x: torch.Tensor) -> torch.Tensor:
    """``[n, *x.shape]``: every rank's ``x`` in rank order. Differentiable (gradients summed)."""
    return _AllGather.apply(group, x)


def _gather(x: torch.Tensor, n: int, group) -> torch.Tensor:
    x = x.contiguous()
    flat = x.reshape(-1)  # gloo wants the output as the inputs concatenated along dim 0
    out = flat.new_empty((n * flat.numel(),))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the new name (torch 2.12+)
    gather(out, flat, group=group)
    return out.view(n, *x.shape)


def all_gather_nograd(group: dist.ProcessGroup | None, x: torch.Tensor) -> torch.Tensor:
    """``[n, *x.shape]`` as :func:`all_gather`, for a tensor that carries no gradient."""
    return _gather(x, dist.get_world_size(group), group)
