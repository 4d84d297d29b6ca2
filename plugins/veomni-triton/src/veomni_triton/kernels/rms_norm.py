"""RMSNorm in Triton: forward, backward, and a batch-invariant mode.

Kernel contract (``veomni_ops.hookspecs.OpHookspecs.rms_norm``)::

    kernel(hidden_states: Tensor[..., H], weight: Tensor[H], eps: float) -> Tensor[..., H]

* standard: ``x̂ = x * rsqrt(mean(x², -1) + eps)`` in fp32, cast to the input dtype, then
  ``weight * x̂`` (one more rounding to the input dtype).
* offset: ``x̂ * (1 + weight)`` in fp32, one cast at the end.

Design (memory bound: the goal is one read of x and one write of y):

* Forward: a program owns a ``[ROWS, BLOCK_N]`` tile (``BLOCK_N = next_pow2(H)``), the whole
  row lives in registers, one pass. ``ROWS > 1`` only for narrow rows (q/k norms, H=128),
  so that a program still moves a few KiB. The fp32 ``rstd`` of every row is stored (4 bytes
  a row) so that backward need not recompute the reduction.
* Backward, two launches and no atomics: (1) ``G ≈ 1-4 x #SMs`` programs each walk a
  contiguous strip of rows, write ``dx`` and keep a private fp32 partial sum of ``dw``; the
  next row is loaded before the current one is reduced, so two rows per program are in
  flight. (2) a small kernel sums the ``G`` partials column by column in a fixed order. The
  result is deterministic run to run. A batch small enough for one program (``G = 1``) takes
  one launch: that program stores ``dw`` itself.
* Batch-invariant mode (kernel name ``triton_batch_invariant``): the launch configuration
  (``ROWS``, ``num_warps``) is a function of H alone, never of the number of rows, so the
  reduction tree, hence the bits, of a row do not depend on how many rows come with it.
  The ``triton`` mode may lower ``ROWS`` for small batches to fill the GPU.
  The batch size is never a compile-time specialisation either (``do_not_specialize``).
  Triton still specialises on pointer alignment, which can change the register layout:
  the guarantee is for rows at row boundaries of 16-byte-aligned tensors (any fresh
  allocation, or a row slice of one), i.e. batches composed differently, which is what
  batch invariance is about.

Non-contiguous input: any tensor whose last dimension has stride 1 and whose leading
dimensions collapse to one stride is read in place (row stride passed to the kernel);
anything else is copied once with an explicit ``.contiguous()`` (see ``launch.as_rows``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._common import check_tensors
from .launch import (
    as_rows,
    cdiv,
    eager_path,
    launch,
    next_pow2,
    num_sms,  # noqa: F401  (re-exported: tests and the tuning script size grids with it)
    sm_count,
)

# Widest row held in registers: 64 Ki fp32 over 1024 threads is 64 values a thread.
MAX_HIDDEN = 65536


# M is never specialised: one binary for every batch size (batch invariance, fewer compiles).
# N (the hidden size) is a compile-time constant: a model has one or two, and a constant N
# spares a launch argument and lets the compiler drop the column mask when N = BLOCK_N.
# y, dx are fresh contiguous buffers: their row stride is N.
@triton.jit(do_not_specialize=["M"])
def _rms_norm_fwd_kernel(
    X, W, Y, RSTD,
    M, stride_x, eps,
    N: tl.constexpr, OFFSET: tl.constexpr, STORE_RSTD: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    xhat = x * rstd[:, None]
    if OFFSET:
        y = xhat * (1.0 + w[None, :])
    else:
        # the contract rounds x̂ to the input dtype before the weight multiply
        y = xhat.to(Y.dtype.element_ty).to(tl.float32) * w[None, :]
    tl.store(Y + rows64[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    if STORE_RSTD:  # for backward only
        tl.store(RSTD + rows, rstd, mask=rmask)


# ADD_DR: dx also gets DR, a gradient that reached the norm's input from elsewhere (the
# residual stream of residual_rms_norm), added in fp32 before the one rounding to x's dtype.
@triton.jit(do_not_specialize=["M", "blocks_per_prog"])
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DX, DWP, DR,
    M, stride_dy, stride_x, stride_dr, blocks_per_prog,
    N: tl.constexpr, OFFSET: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, ADD_DR: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    if OFFSET:
        w = w + 1.0
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    n_blocks = tl.cdiv(M, ROWS)
    first = pid * blocks_per_prog
    last = tl.minimum(first + blocks_per_prog, n_blocks)
    # rows of this program's strip: [first*ROWS, row_end); one bound covers both the batch
    # end and the strip end (and keeps the masks plain tensor comparisons)
    row_end = tl.minimum(last * ROWS, M)

    # software pipelining by hand: block i+1 is requested before block i is reduced
    rows = first * ROWS + tl.arange(0, ROWS)
    rmask = rows < row_end
    mask = rmask[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x_nxt = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    dy_nxt = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    r_nxt = tl.load(RSTD + rows, mask=rmask, other=0.0)
    for blk in range(first, last):
        x = x_nxt.to(tl.float32)
        dy = dy_nxt.to(tl.float32)
        rstd = r_nxt
        cur_rows64 = rows64
        cur_mask = mask

        rows = (blk + 1) * ROWS + tl.arange(0, ROWS)
        rmask = rows < row_end
        mask = rmask[:, None] & cmask[None, :]
        rows64 = rows.to(tl.int64)
        x_nxt = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        dy_nxt = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
        r_nxt = tl.load(RSTD + rows, mask=rmask, other=0.0)

        xhat = x * rstd[:, None]
        g = dy * w[None, :]
        if OFFSET:
            acc += dy * xhat
        else:
            # y = w * cast(x̂): dw sees the rounded x̂, exactly as autograd of the eager form
            acc += dy * xhat.to(DX.dtype.element_ty).to(tl.float32)
        c = tl.sum(g * xhat, axis=1) / N
        dx = (g - xhat * c[:, None]) * rstd[:, None]
        if ADD_DR:
            dx += tl.load(DR + cur_rows64[:, None] * stride_dr + cols[None, :], mask=cur_mask, other=0.0).to(tl.float32)
        tl.store(DX + cur_rows64[:, None] * N + cols[None, :], dx.to(DX.dtype.element_ty), mask=cur_mask)
    # a float32 partial row per program; with one program, dw itself (cast to its dtype on store)
    tl.store(DWP + pid * N + cols, tl.sum(acc, axis=0).to(DWP.dtype.element_ty), mask=cmask)


@triton.jit
def _column_sum_kernel(P, OUT, G, N: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    """OUT[c] = sum_g P[g, c] in a fixed order (deterministic second stage of dw)."""
    pid = tl.program_id(0)
    cols = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < N
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        gs = g0 + tl.arange(0, BLOCK_G)
        m = (gs < G)[:, None] & cmask[None, :]
        acc += tl.load(P + gs.to(tl.int64)[:, None] * N + cols[None, :], mask=m, other=0.0)
    tl.store(OUT + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=cmask)


# ---------------------------------------------------------------- launch configuration
def _warps_for(tile: int) -> int:
    # ~8-16 elements a thread for a single-row tile; cap at 32 warps (1024 threads)
    return max(4, min(32, tile // 512))


@functools.lru_cache(maxsize=4096)
def fwd_config(m: int, n: int, batch_invariant: bool, sms: int) -> tuple[int, int, int]:
    """(BLOCK_N, ROWS, num_warps) of the forward kernel.

    Batch-invariant: a function of ``n`` only. Otherwise ``ROWS`` shrinks when the batch is
    too small to give every SM a few programs.
    """
    block_n = next_pow2(n)
    rows = max(1, min(64, 4096 // block_n))
    if not batch_invariant:
        while rows > 1 and cdiv(m, rows) < 4 * sms:
            rows //= 2
    return block_n, rows, _warps_for(rows * block_n)


@functools.lru_cache(maxsize=4096)
def bwd_config(m: int, n: int, sms: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, ROWS, num_warps, programs) of the backward kernel.

    A program keeps its tile of x, dy, the next tile (prefetch), w and the dw accumulator
    in registers: about 6 registers per element a thread holds, plus overhead. The grid
    is sized so that every program is resident at once (no second wave: a program's
    strip of rows is sequential): with ~16 elements a thread, a 4096-element tile on 8
    warps needs ~120 registers a thread, so two such programs fit an SM's 64 Ki
    registers; an 8192-element tile on 16 warps fits once. Few programs also keep the fp32
    dw partials small (programs * N * 4 bytes, ~1-2% of the bytes moved).
    """
    block_n = next_pow2(n)
    rows = max(1, min(64, 4096 // block_n))
    tile = rows * block_n
    if tile <= 2048:
        warps, per_sm = 4, 4
    elif tile <= 4096:
        warps, per_sm = 8, 2
    else:
        warps, per_sm = 16, 1
    n_blocks = cdiv(m, rows)
    programs = max(1, min(n_blocks, per_sm * sms))
    return block_n, rows, warps, programs


@functools.lru_cache(maxsize=4096)
def _bwd_launch_config(m: int, n: int, sms: int) -> tuple[int, int, int, int, int, tuple[int, int, int]]:
    """(BLOCK_N, ROWS, num_warps, programs, blocks_per_prog, column-sum config): the grid is
    trimmed so that no program has an empty strip."""
    block_n, rows, warps, programs = bwd_config(m, n, sms)
    n_blocks = cdiv(m, rows)
    blocks_per_prog = cdiv(n_blocks, programs)
    programs = cdiv(n_blocks, blocks_per_prog)
    return block_n, rows, warps, programs, blocks_per_prog, column_sum_config(programs, n)


def column_sum_config(g: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_G, BLOCK_C, num_warps) of the dw reduction: all G partials of a column strip
    in one load round (G is ~1-4x #SMs), and enough strips to spread over the SMs."""
    block_g = min(512, next_pow2(g))
    block_c = 16 if n >= 1024 else 8
    warps = 8 if block_g * block_c >= 4096 else 4
    return block_g, block_c, warps


# ---------------------------------------------------------------- launchers
# Plain functions, validated by the caller; ``index`` is the CUDA device
# (``Tensor.get_device()``, -1 on the CPU under the interpreter). They are the bodies of both
# the eager ``autograd.Function`` and the ``torch.library`` custom ops. Outputs are allocated
# in their final shape (no ``view`` op on the way back).
def rows_of(t: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """(``t`` readable as rows of ``n``, row stride); contiguous tensors as they are."""
    if t.is_contiguous():
        return t, n
    t = as_rows(t, n)
    return t, t.stride(0)


def _launch_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool, batch_invariant: bool, index: int,
    store_rstd: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y in x's shape, rstd [M] fp32 (``y`` itself when not stored), x as the kernel read it)."""
    shape = x.shape
    n = shape[-1]
    x, stride_x = rows_of(x, n)
    m = x.numel() // n
    y = x.new_empty(shape)
    # without autograd nobody reads rstd: not allocated, not written
    rstd = x.new_empty((m,), dtype=torch.float32) if store_rstd else y
    if m == 0:
        return y, rstd, x
    block_n, rows, warps = fwd_config(m, n, batch_invariant, sm_count(index))
    launch(
        index, _rms_norm_fwd_kernel, (cdiv(m, rows),),
        x, weight, y, rstd, m, stride_x, eps,
        N=n, OFFSET=offset, STORE_RSTD=store_rstd, ROWS=rows, BLOCK_N=block_n, num_warps=warps,
    )
    return y, rstd, x


def launch_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, offset: bool, index: int,
    shape: torch.Size, dres: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx in ``shape``, dw); ``x`` as the forward read it (rows), ``rstd`` its fp32 ``rstd``.
    ``dres``: a gradient of ``x``'s shape that reached ``x`` from elsewhere, added to ``dx``."""
    n = shape[-1]
    m = rstd.shape[0]
    dy, stride_dy = rows_of(dy, n)
    x, stride_x = rows_of(x, n)
    dr, stride_dr = rows_of(dres, n) if dres is not None else (dy, stride_dy)
    dx = x.new_empty(shape)
    if m == 0:
        return dx, torch.zeros_like(weight)
    block_n, rows, warps, programs, blocks_per_prog, (block_g, block_c, warps_c) = _bwd_launch_config(
        m, n, sm_count(index)
    )
    dw = weight.new_empty((n,))
    # one program (small batches): its partial sum is dw itself, stored in the weight's dtype
    # (the same float32 sum and one rounding as the column sum of one row): one launch, no buffer
    partial = dw if programs == 1 else x.new_empty((programs, n), dtype=torch.float32)
    launch(
        index, _rms_norm_bwd_kernel, (programs,),
        dy, x, weight, rstd, dx, partial, dr, m, stride_dy, stride_x, stride_dr, blocks_per_prog,
        N=n, OFFSET=offset, ROWS=rows, BLOCK_N=block_n, ADD_DR=dres is not None, num_warps=warps,
    )
    if programs > 1:
        launch(
            index, _column_sum_kernel, (cdiv(n, block_c),),
            partial, dw, programs, N=n, BLOCK_G=block_g, BLOCK_C=block_c, num_warps=warps_c,
        )
    return dx, dw


# ---------------------------------------------------------------- eager autograd
class _RMSNormFunction(torch.autograd.Function):
    """The eager path: a lean autograd node around the launchers (no ``torch.library``
    dispatch; see ``_rms_norm``). Takes and returns tensors of any rank: the reshape to rows
    happens inside, so autograd records no view nodes around it."""

    @staticmethod
    def forward(ctx, x, weight, eps, offset, batch_invariant, index):
        y, rstd, x_rows = _launch_fwd(x, weight, eps, offset, batch_invariant, index)
        ctx.save_for_backward(x_rows, weight, rstd)
        ctx.offset = offset
        ctx.index = index
        ctx.shape = x.shape
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = launch_bwd(dy, x, weight, rstd, ctx.offset, ctx.index, ctx.shape)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        return (dx if need_x else None, dw if need_w else None, None, None, None, None)


# ---------------------------------------------------------------- custom ops (torch.compile)
@torch.library.custom_op("veomni_triton::rms_norm_fwd", mutates_args=())
def _rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool, batch_invariant: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    y, rstd, _ = _launch_fwd(x, weight, eps, offset, batch_invariant, x.get_device())
    return y, rstd


@_rms_norm_fwd.register_fake
def _(x, weight, eps, offset, batch_invariant):
    m, n = x.shape
    return x.new_empty((m, n)), x.new_empty((m,), dtype=torch.float32)


@torch.library.custom_op("veomni_triton::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, offset: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_bwd(dy, x, weight, rstd, offset, x.get_device(), x.shape)


@_rms_norm_bwd.register_fake
def _(dy, x, weight, rstd, offset):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output):
    x, weight, _eps, offset, _bi = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.offset = offset


def _backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _rms_norm_bwd(dy, x, weight, rstd, ctx.offset)
    return (
        dx if ctx.needs_input_grad[0] else None,
        dw if ctx.needs_input_grad[1] else None,
        None,
        None,
        None,
    )


_rms_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- public kernels
_NAMES = ("hidden_states", "weight")


def norm_args(op: str, name: str, shape: torch.Size, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, float]:
    """The checks every norm of this module makes on the shapes (``name``: the normalised input,
    of ``shape``), the weight (made unit-stride) and ``eps`` (a float): (weight, eps)."""
    if not shape:
        raise ValueError(f"{op} (triton): {name} must have at least one dimension, got a scalar")
    n = shape[-1]
    if weight.shape != (n,):
        raise ValueError(
            f"{op} (triton): weight has shape {tuple(weight.shape)} but {name}'s last dimension is {n}; "
            f"weight must be [{n}]"
        )
    if n == 0 or n > MAX_HIDDEN:
        raise ValueError(
            f"{op} (triton): hidden size {n} is outside what this kernel holds in registers (1..{MAX_HIDDEN}); "
            f"use another {op} implementation for this model"
        )
    if type(eps) is not float:
        if not isinstance(eps, (int, float)) or isinstance(eps, bool):
            raise ValueError(f"{op} (triton): eps must be a non-negative float, got {eps!r}")
        eps = float(eps)
    if not eps >= 0:
        raise ValueError(f"{op} (triton): eps must be a non-negative float, got {eps!r}")
    if n > 1 and weight.stride(0) != 1:
        weight = weight.contiguous()  # the kernels read w with unit stride (a strided view is rare: copy it)
    return weight, eps


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool, batch_invariant: bool) -> torch.Tensor:
    index = check_tensors("rms_norm", _NAMES, (x, weight))
    shape = x.shape
    weight, eps = norm_args("rms_norm", "hidden_states", shape, weight, eps)
    n = shape[-1]
    if eager_path(x, weight):
        # eager: the launchers directly, through a lean autograd node only when a gradient is due
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return _RMSNormFunction.apply(x, weight, eps, offset, batch_invariant, index)
        return _launch_fwd(x, weight, eps, offset, batch_invariant, index, store_rstd=False)[0]
    # torch.compile (and tensor subclasses): the custom op, which Dynamo traces without a break
    y = _rms_norm_fwd(as_rows(x, n), weight, eps, offset, batch_invariant)[0]
    return y if len(shape) == 2 else y.view(shape)


def rms_norm_standard(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``weight * cast(x * rsqrt(mean(x²) + eps))``: the Llama/Qwen2/Qwen3 RMSNorm."""
    return _rms_norm(hidden_states, weight, eps, offset=False, batch_invariant=False)


def rms_norm_offset(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``cast(x̂ * (1 + weight))`` in fp32: the Gemma/Qwen3.5/Qwen3-Next RMSNorm."""
    return _rms_norm(hidden_states, weight, eps, offset=True, batch_invariant=False)


def rms_norm_standard_batch_invariant(
    hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """As :func:`rms_norm_standard`; a row's output bits do not depend on the number of rows."""
    return _rms_norm(hidden_states, weight, eps, offset=False, batch_invariant=True)


def rms_norm_offset_batch_invariant(
    hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """As :func:`rms_norm_offset`; a row's output bits do not depend on the number of rows."""
    return _rms_norm(hidden_states, weight, eps, offset=True, batch_invariant=True)


# Convenience for callers that pick the variant at run time.
def rms_norm(
    hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, offset: bool = False,
    batch_invariant: bool = False,
) -> torch.Tensor:
    return _rms_norm(hidden_states, weight, eps, offset=offset, batch_invariant=batch_invariant)
