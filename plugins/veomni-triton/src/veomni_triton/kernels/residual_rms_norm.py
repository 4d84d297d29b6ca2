"""The residual add and the RMSNorm after it in Triton: one read of ``x`` and ``residual``.

Kernel contract (``veomni_ops.hookspecs.OpHookspecs.residual_rms_norm``)::

    kernel(x: Tensor[..., H], residual: Tensor[..., H], weight: Tensor[H], eps: float)
        -> (normed: Tensor[..., H], summed: Tensor[..., H])

``summed = residual + x`` rounded once to the input dtype (as eager's add), then the standard
norm of the rounded sum: ``x̂`` in fp32, cast to the input dtype, ``weight * x̂``.

Forward: :mod:`.rms_norm`'s forward with the add in front (one program a ``[ROWS, BLOCK_N]``
tile, its launch configuration, the fp32 ``rstd`` stored for backward); ``summed`` is written
beside ``normed``. Backward is :mod:`.rms_norm`'s standard backward on ``summed`` with the
gradient that reached ``summed`` directly added to ``dx`` before its one rounding; that ``dx``
is the gradient of both ``x`` and ``residual``. No host synchronisation; zero rows launch
nothing. Eager only (an ``autograd.Function``): the spec says ``supports_compile=False``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_tensors
from .launch import cdiv, eager_path, launch, sm_count
from .rms_norm import fwd_config, launch_bwd, norm_args, rows_of


@triton.jit(do_not_specialize=["M"])
def _residual_rms_norm_fwd_kernel(
    X, R, W, Y, S, RSTD,
    M, stride_x, stride_r, eps,
    N: tl.constexpr, STORE_RSTD: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + rows64[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    # the sum rounded once to the input dtype, as eager's add; the norm reads the rounded sum
    s = (r + x).to(S.dtype.element_ty)
    tl.store(S + rows64[:, None] * N + cols[None, :], s, mask=mask)
    s = s.to(tl.float32)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=1) / N + eps)
    # the contract rounds x̂ to the input dtype before the weight multiply
    y = (s * rstd[:, None]).to(Y.dtype.element_ty).to(tl.float32) * w[None, :]
    tl.store(Y + rows64[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    if STORE_RSTD:  # for backward only
        tl.store(RSTD + rows, rstd, mask=rmask)


def _launch_fwd(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, index: int,
                store_rstd: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(normed and summed in x's shape, rstd [M] fp32 (``normed`` itself when not stored))."""
    shape = x.shape
    n = shape[-1]
    x, stride_x = rows_of(x, n)
    residual, stride_r = rows_of(residual, n)
    m = x.numel() // n
    y = x.new_empty(shape)
    summed = x.new_empty(shape)
    rstd = x.new_empty((m,), dtype=torch.float32) if store_rstd else y
    if m == 0:
        return y, summed, rstd
    block_n, rows, warps = fwd_config(m, n, False, sm_count(index))
    launch(
        index, _residual_rms_norm_fwd_kernel, (cdiv(m, rows),),
        x, residual, weight, y, summed, rstd, m, stride_x, stride_r, eps,
        N=n, STORE_RSTD=store_rstd, ROWS=rows, BLOCK_N=block_n, num_warps=warps,
    )
    return y, summed, rstd


class _ResidualRMSNormFunction(torch.autograd.Function):
    """The lean autograd node around the launchers: saves ``summed`` (what the norm read), the
    weight and ``rstd``; backward gives ``x`` and ``residual`` the same gradient."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps, index):
        y, summed, rstd = _launch_fwd(x, residual, weight, eps, index, store_rstd=True)
        ctx.save_for_backward(summed, weight, rstd)
        ctx.index = index
        return y, summed

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, dsummed):
        summed, weight, rstd = ctx.saved_tensors
        dx, dw = launch_bwd(dy, summed, weight, rstd, False, ctx.index, summed.shape, dres=dsummed)
        need_x, need_r, need_w = ctx.needs_input_grad[:3]
        return (dx if need_x else None, dx if need_r else None, dw if need_w else None, None, None)


_NAMES = ("x", "residual", "weight")


def residual_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight * cast(rms_norm(residual + x)), residual + x)``: a decoder layer's residual add
    and its ``post_attention_layernorm`` in one kernel."""
    op = "residual_rms_norm"
    index = check_tensors(op, _NAMES, (x, residual, weight))
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError(f"{op} (triton): x {tuple(x.shape)} {x.dtype} and residual {tuple(residual.shape)} "
                         f"{residual.dtype} must have one shape and dtype [..., H]")
    weight, eps = norm_args(op, "x", x.shape, weight, eps)
    if not eager_path(x, residual, weight):
        raise NotImplementedError(f"{op} (triton): this kernel runs eagerly only (not under torch.compile, nor on "
                                  "tensor subclasses); use residual_rms_norm_implementation: eager there")
    if torch.is_grad_enabled() and (x.requires_grad or residual.requires_grad or weight.requires_grad):
        return _ResidualRMSNormFunction.apply(x, residual, weight, eps, index)
    y, summed, _ = _launch_fwd(x, residual, weight, eps, index, store_rstd=False)
    return y, summed
