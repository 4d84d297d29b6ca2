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
explicitly (``_common.as_rows``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import as_rows, check_device, check_float, launch_device


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


def _geometry(block: int, *mats: torch.Tensor) -> tuple[bool, int, int, int]:
    """(flat, n_cols, n_col_blocks, grid) for ``[M, I]`` operands."""
    m, n = mats[0].shape
    flat = all(t.is_contiguous() for t in mats)
    if flat:
        cols = m * n
        blocks = triton.cdiv(cols, block)
        return True, cols, blocks, blocks
    blocks = triton.cdiv(n, block)
    return False, n, blocks, m * blocks


@torch.library.custom_op("veomni_triton::swiglu_fwd", mutates_args=())
def _swiglu_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if y.numel() == 0:
        return y
    block, warps = FWD_CONFIG
    flat, n_cols, n_blocks, grid = _geometry(block, gate, up, y)
    with launch_device(gate):
        _swiglu_fwd_kernel[(grid,)](
            gate, up, y, n_cols, n_blocks, gate.stride(0), up.stride(0), y.stride(0),
            FLAT=flat, BLOCK=block, num_warps=warps,
        )
    return y


@_swiglu_fwd.register_fake
def _(gate, up):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("veomni_triton::swiglu_bwd", mutates_args=())
def _swiglu_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dy = as_rows(dy, gate.shape[1])
    dg = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    du = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    if dg.numel() == 0:
        return dg, du
    block, warps = BWD_CONFIG
    flat, n_cols, n_blocks, grid = _geometry(block, dy, gate, up, dg)
    with launch_device(gate):
        _swiglu_bwd_kernel[(grid,)](
            dy, gate, up, dg, du, n_cols, n_blocks, dy.stride(0), gate.stride(0), up.stride(0), dg.stride(0),
            FLAT=flat, BLOCK=block, num_warps=warps,
        )
    return dg, du


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


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (fp32 math, output in the input dtype)."""
    op = "swiglu"
    for name, t in (("gate", gate), ("up", up)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"veomni_triton {op}: {name} must be a tensor, got {type(t).__name__}")
        check_float(op, name, t)
    check_device(op, gate, up)
    if gate.shape != up.shape:
        raise ValueError(
            f"veomni_triton {op}: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have the same shape "
            "(both are [..., intermediate_size])"
        )
    if gate.dtype != up.dtype:
        raise TypeError(
            f"veomni_triton {op}: gate is {gate.dtype} but up is {up.dtype}; cast one so that both match"
        )
    if gate.dim() == 0 or gate.shape[-1] == 0:
        raise ValueError(
            f"veomni_triton {op}: gate and up must be [..., I] with I >= 1, got {tuple(gate.shape)}"
        )
    n = gate.shape[-1]
    y = _swiglu_fwd(as_rows(gate, n), as_rows(up, n))
    return y.view(gate.shape)
