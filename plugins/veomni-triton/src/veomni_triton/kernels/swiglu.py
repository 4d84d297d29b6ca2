"""SwiGLU activation in Triton: ``silu(gate) * up``, one fused kernel forward, one backward.

Kernel contract (``veomni_ops.hookspecs.OpHookspecs.swiglu``)::

    kernel(gate: Tensor[..., I], up: Tensor[..., I]) -> Tensor[..., I]

Math in fp32, output in the input dtype. Backward recomputes ``sigmoid(gate)`` instead of
saving it, and produces both gradients in one pass over ``(dy, gate, up)``::

    du = dy * silu(g)                      silu(g) = g * sigmoid(g)
    dg = dy * u * sigmoid(g) * (1 + g * (1 - sigmoid(g)))

Layout: when every operand is contiguous the tensors are walked as one flat array
(``FLAT``: no row arithmetic, ``BLOCK``-element vectorised chunks); otherwise as rows
``[M, I]`` with a row stride each, which covers ``gate, up = gate_up.chunk(2, -1)`` of a
fused projection without a copy. Only a last dimension with stride != 1 is copied, once,
explicitly (``launch.as_rows``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._common import check_tensors
from .launch import as_rows, cdiv, eager_path, launch


@triton.jit
def _swiglu_fwd_kernel(
    G, U, Y, n_cols, n_col_blocks, stride_g, stride_u, stride_y,
    FLAT: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    if FLAT:
        cols = pid * BLOCK + tl.arange(0, BLOCK)
        g_ptr, u_ptr, y_ptr = G + cols, U + cols, Y + cols
    else:
        row = pid // n_col_blocks
        cols = (pid % n_col_blocks) * BLOCK + tl.arange(0, BLOCK)
        g_ptr, u_ptr, y_ptr = G + row * stride_g + cols, U + row * stride_u + cols, Y + row * stride_y + cols
    mask = cols < n_cols
    g = tl.load(g_ptr, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    u = tl.load(u_ptr, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(y_ptr, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    DY, G, U, DG, DU, n_cols, n_col_blocks, stride_dy, stride_g, stride_u, stride_out,
    FLAT: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    if FLAT:
        cols = pid * BLOCK + tl.arange(0, BLOCK)
        dy_ptr, g_ptr, u_ptr = DY + cols, G + cols, U + cols
        dg_ptr, du_ptr = DG + cols, DU + cols
    else:
        row = pid // n_col_blocks
        cols = (pid % n_col_blocks) * BLOCK + tl.arange(0, BLOCK)
        dy_ptr, g_ptr, u_ptr = DY + row * stride_dy + cols, G + row * stride_g + cols, U + row * stride_u + cols
        dg_ptr, du_ptr = DG + row * stride_out + cols, DU + row * stride_out + cols
    mask = cols < n_cols
    dy = tl.load(dy_ptr, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    g = tl.load(g_ptr, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    u = tl.load(u_ptr, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    sig = tl.sigmoid(g)
    silu = g * sig
    du = dy * silu
    dg = dy * u * sig * (1.0 + g * (1.0 - sig))
    tl.store(dg_ptr, dg.to(DG.dtype.element_ty), mask=mask)
    tl.store(du_ptr, du.to(DU.dtype.element_ty), mask=mask)


#: (BLOCK, num_warps): 16 (forward) / 8 (backward, three inputs) elements a thread, i.e.
#: 16-byte bf16 vectors, small programs so that many are resident per SM.
FWD_CONFIG = (2048, 4)
BWD_CONFIG = (1024, 4)


@functools.lru_cache(maxsize=4096)
def _geometry(block: int, m: int, n: int, flat: bool) -> tuple[int, int, int]:
    """(n_cols, n_col_blocks, grid) for ``[M, I]`` operands, walked flat or by rows."""
    if flat:
        cols = m * n
        blocks = cdiv(cols, block)
        return cols, blocks, blocks
    blocks = cdiv(n, block)
    return n, blocks, m * blocks


# ---------------------------------------------------------------- launchers
# Plain functions on ``[..., I]`` operands of one shape, validated by the caller; ``index`` is
# the CUDA device (-1 on the CPU under the interpreter). They are the bodies of both the eager
# ``autograd.Function`` and the ``torch.library`` custom ops. Contiguous operands are used as
# they are (walked flat); others are viewed as rows. Outputs take the operands' shape.
def _launch_fwd(gate: torch.Tensor, up: torch.Tensor, index: int) -> torch.Tensor:
    shape = gate.shape
    n = shape[-1]
    flat = gate.is_contiguous() and up.is_contiguous()
    if not flat:
        gate, up = as_rows(gate, n), as_rows(up, n)
    m = gate.numel() // n
    y = gate.new_empty(shape)
    if m == 0:
        return y
    block, warps = FWD_CONFIG
    n_cols, n_blocks, grid = _geometry(block, m, n, flat)
    launch(
        index, _swiglu_fwd_kernel, (grid,),
        gate, up, y, n_cols, n_blocks, 0 if flat else gate.stride(0), 0 if flat else up.stride(0), n,
        FLAT=flat, BLOCK=block, num_warps=warps,
    )
    return y


def _launch_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = gate.shape
    n = shape[-1]
    flat = dy.is_contiguous() and gate.is_contiguous() and up.is_contiguous()
    if not flat:
        dy, gate, up = as_rows(dy, n), as_rows(gate, n), as_rows(up, n)
    m = gate.numel() // n
    dg = gate.new_empty(shape)
    du = up.new_empty(shape)
    if m == 0:
        return dg, du
    block, warps = BWD_CONFIG
    n_cols, n_blocks, grid = _geometry(block, m, n, flat)
    launch(
        index, _swiglu_bwd_kernel, (grid,),
        dy, gate, up, dg, du, n_cols, n_blocks,
        0 if flat else dy.stride(0), 0 if flat else gate.stride(0), 0 if flat else up.stride(0), n,
        FLAT=flat, BLOCK=block, num_warps=warps,
    )
    return dg, du


# ---------------------------------------------------------------- eager autograd
class _SwiGLUFunction(torch.autograd.Function):
    """The eager path: a lean autograd node around the launchers (no ``torch.library``
    dispatch, no view nodes around it; see ``silu_mul``)."""

    @staticmethod
    def forward(ctx, gate, up, index):
        ctx.save_for_backward(gate, up)
        ctx.index = index
        return _launch_fwd(gate, up, index)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        dg, du = _launch_bwd(dy, gate, up, ctx.index)
        return (dg if ctx.needs_input_grad[0] else None, du if ctx.needs_input_grad[1] else None, None)


# ---------------------------------------------------------------- custom ops (torch.compile)
@torch.library.custom_op("veomni_triton::swiglu_fwd", mutates_args=())
def _swiglu_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _launch_fwd(gate, up, gate.get_device())


@_swiglu_fwd.register_fake
def _(gate, up):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("veomni_triton::swiglu_bwd", mutates_args=())
def _swiglu_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_bwd(dy, gate, up, gate.get_device())


@_swiglu_bwd.register_fake
def _(dy, gate, up):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _setup_context(ctx, inputs, output):
    gate, up = inputs
    ctx.save_for_backward(gate, up)


def _backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dg, du = _swiglu_bwd(dy, gate, up)
    return (dg if ctx.needs_input_grad[0] else None, du if ctx.needs_input_grad[1] else None)


_swiglu_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- public kernel
_NAMES = ("gate", "up")


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (fp32 math, output in the input dtype)."""
    op = "swiglu"
    index = check_tensors(op, _NAMES, (gate, up))
    shape = gate.shape
    if shape != up.shape:
        raise ValueError(
            f"{op} (triton): gate {tuple(gate.shape)} and up {tuple(up.shape)} must have the same shape "
            "(both are [..., intermediate_size])"
        )
    if gate.dtype != up.dtype:
        raise TypeError(
            f"{op} (triton): gate is {gate.dtype} but up is {up.dtype}; cast one so that both match"
        )
    if not shape or shape[-1] == 0:
        raise ValueError(
            f"{op} (triton): gate and up must be [..., I] with I >= 1, got {tuple(gate.shape)}"
        )
    if eager_path(gate, up):
        # eager: the launchers directly, through a lean autograd node only when a gradient is due
        if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
            return _SwiGLUFunction.apply(gate, up, index)
        return _launch_fwd(gate, up, index)
    # torch.compile (and tensor subclasses): the custom op, which Dynamo traces without a break
    n = shape[-1]
    y = _swiglu_fwd(as_rows(gate, n), as_rows(up, n))
    return y if len(shape) == 2 else y.view(shape)
