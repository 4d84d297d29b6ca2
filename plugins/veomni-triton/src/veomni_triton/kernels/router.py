"""MoE top-k softmax router in Triton: softmax, top-k and renormalisation of a block of rows
in registers, one launch forward, one backward.

Kernel contract (``veomni_ops.hookspecs.OpHookspecs.moe_router``)::

    kernel(logits: Tensor[T, E], top_k: int, normalize: bool)
        -> (weights: Tensor[T, top_k] in logits.dtype, indices: LongTensor[T, top_k])

Forward (one program per ``BLOCK_T`` rows, the whole row of ``E <= 512`` experts in registers,
padded to the next power of two): fp32 row max and exp-sum, ``p = exp(z - max) / sum``; then
``top_k <= 16`` rounds of arg-max over the experts not yet taken (among equal probabilities the
lowest expert index first: a tie of underflowed zeros, or of equal logits); with ``normalize``
the selected values divided by their sum; weights cast to the logits' dtype. It saves, beside
the int64 indices, the fp32 selected probabilities ``[T, k]`` and the row's log-sum-exp ``[T]``
(not ``p``: backward recomputes ``p = exp(z - lse)`` from the logits, which autograd keeps).

Backward, with ``g`` the weights' gradient in fp32 and S the selected experts::

    normalize:  w_i = p_i / s, s = sum_{j in S} p_j   ->  dp_i = (g_i - sum_{j in S} g_j w_j) / s  (i in S)
    otherwise:  dp_i = g_i  (i in S);   dp_i = 0 outside S
    dlogits = p * (dp - sum_i p_i dp_i)   (the softmax's backward)

No host synchronisation anywhere (shapes only), so a step that uses it can be captured in a CUDA
graph. No ``torch.library`` custom op yet: under ``torch.compile`` the spec declares no support.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import CHECKS, check_device
from .launch import cdiv, launch, next_pow2

_OP = "moe_router"

#: The widest row a program holds in registers, and the most selection rounds.
MAX_EXPERTS = 512
MAX_TOP_K = 16
#: Elements of a program's tile (BLOCK_T rows of the padded E).
_TILE = 4096


@triton.jit
def _router_fwd_kernel(
    X, W, IDX, PS, LSE, T, E, stride_x,
    TOPK: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    ks = tl.arange(0, BLOCK_K)
    rmask = rows < T
    cmask = cols < E
    z = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0)
    z = tl.where(cmask[None, :], z.to(tl.float32), float("-inf"))
    zmax = tl.max(z, axis=1)
    ez = tl.exp(z - zmax[:, None])
    total = tl.sum(ez, axis=1)
    p = ez / total[:, None]
    # p >= 0 everywhere, so -1 marks an expert already taken (or a padding column)
    cand = tl.where(cmask[None, :], p, -1.0)
    vals = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
    idxs = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.int64)
    for j in tl.static_range(TOPK):
        best = tl.max(cand, axis=1)
        # a row of NaN logits matches no column: expert E - 1 then, so an index is never out of range
        pick = tl.minimum(tl.min(tl.where(cand == best[:, None], cols[None, :], BLOCK_E), axis=1), E - 1)
        cand = tl.where(cols[None, :] == pick[:, None], -1.0, cand)
        vals = tl.where(ks[None, :] == j, best[:, None], vals)
        idxs = tl.where(ks[None, :] == j, pick[:, None].to(tl.int64), idxs)
    out = vals
    if NORMALIZE:
        out = vals / tl.sum(vals, axis=1)[:, None]
    kmask = rmask[:, None] & (ks[None, :] < TOPK)
    offs = rows[:, None] * TOPK + ks[None, :]
    tl.store(W + offs, out.to(W.dtype.element_ty), mask=kmask)
    tl.store(IDX + offs, idxs, mask=kmask)
    tl.store(PS + offs, vals, mask=kmask)
    tl.store(LSE + rows, zmax + tl.log(total), mask=rmask)


@triton.jit
def _router_bwd_kernel(
    X, LSE, PS, IDX, G, DX, T, E, stride_x, stride_dx,
    TOPK: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    ks = tl.arange(0, BLOCK_K)
    rmask = rows < T
    cmask = cols < E
    z = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0)
    lse = tl.load(LSE + rows, mask=rmask, other=0.0)
    p = tl.where(cmask[None, :], tl.exp(z.to(tl.float32) - lse[:, None]), 0.0)
    kmask = rmask[:, None] & (ks[None, :] < TOPK)
    offs = rows[:, None] * TOPK + ks[None, :]
    g = tl.load(G + offs, mask=kmask, other=0.0).to(tl.float32)
    ps = tl.load(PS + offs, mask=kmask, other=0.0)
    idx = tl.load(IDX + offs, mask=kmask, other=-1)
    dp = g
    if NORMALIZE:
        s = tl.where(rmask, tl.sum(ps, axis=1), 1.0)  # rows past T: no 0/0
        dot = tl.sum(g * ps, axis=1) / s  # sum_j g_j w_j
        dp = tl.where(kmask, (g - dot[:, None]) / s[:, None], 0.0)
    c = tl.sum(ps * dp, axis=1)  # sum_i p_i dp_i (dp is 0 outside S)
    full = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        dp_j = tl.sum(tl.where(ks[None, :] == j, dp, 0.0), axis=1)
        idx_j = tl.sum(tl.where(ks[None, :] == j, idx, 0), axis=1)
        full = tl.where(cols[None, :] == idx_j[:, None], dp_j[:, None], full)
    dz = p * (full - c[:, None])
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dz.to(DX.dtype.element_ty),
             mask=rmask[:, None] & cmask[None, :])


def _blocks(e: int, k: int) -> tuple[int, int, int]:
    block_e = next_pow2(e)
    return max(1, min(64, _TILE // block_e)), block_e, next_pow2(k)


def _launch_fwd(logits: torch.Tensor, top_k: int, normalize: bool, index: int):
    t, e = logits.shape
    weights = logits.new_empty((t, top_k))
    indices = torch.empty((t, top_k), dtype=torch.int64, device=logits.device)
    ps = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    lse = torch.empty((t,), dtype=torch.float32, device=logits.device)
    if t:
        bt, be, bk = _blocks(e, top_k)
        launch(index, _router_fwd_kernel, (cdiv(t, bt),), logits, weights, indices, ps, lse, t, e, logits.stride(0),
               TOPK=top_k, NORMALIZE=normalize, BLOCK_T=bt, BLOCK_E=be, BLOCK_K=bk, num_warps=4)
    return weights, indices, ps, lse


def _launch_bwd(dw: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor, ps: torch.Tensor, indices: torch.Tensor,
                normalize: bool, index: int) -> torch.Tensor:
    t, e = logits.shape
    top_k = indices.shape[1]
    dx = torch.empty((t, e), dtype=logits.dtype, device=logits.device)
    if t:
        bt, be, bk = _blocks(e, top_k)
        launch(index, _router_bwd_kernel, (cdiv(t, bt),), logits, lse, ps, indices, dw.contiguous(), dx, t, e,
               logits.stride(0), dx.stride(0), TOPK=top_k, NORMALIZE=normalize, BLOCK_T=bt, BLOCK_E=be, BLOCK_K=bk,
               num_warps=4)
    return dx


class _RouterFunction(torch.autograd.Function):
    """Forward and backward launches; the indices are not differentiable."""

    @staticmethod
    def forward(ctx, logits, top_k, normalize, index):
        weights, indices, ps, lse = _launch_fwd(logits, top_k, normalize, index)
        ctx.save_for_backward(logits, lse, ps, indices)
        ctx.normalize, ctx.index = normalize, index
        ctx.mark_non_differentiable(indices)
        return weights, indices

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dw, _didx):
        logits, lse, ps, indices = ctx.saved_tensors
        if dw is None:
            return torch.zeros_like(logits), None, None, None
        return _launch_bwd(dw, logits, lse, ps, indices, ctx.normalize, ctx.index), None, None, None


def moe_router(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, top_k] in logits.dtype, indices [T, top_k] int64)``: the top-k of the fp32 softmax."""
    CHECKS.check_moe_router_inputs(logits, top_k, normalize, max_experts=MAX_EXPERTS, max_top_k=MAX_TOP_K)
    check_device(_OP, logits=logits)
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    index = logits.get_device()
    if torch.is_grad_enabled() and logits.requires_grad:
        return _RouterFunction.apply(logits, top_k, normalize, index)
    weights, indices, _, _ = _launch_fwd(logits, top_k, normalize, index)
    return weights, indices
