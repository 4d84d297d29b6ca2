"""Rotary position embedding in Triton: q and k in one launch, full and partial rotary.

Kernel contract (``veomni_ops.hookspecs.OpHookspecs.rotary``)::

    kernel(q: Tensor[B, Hq, S, D], k: Tensor[B, Hk, S, D],
           cos: Tensor[B, S, R], sin: Tensor[B, S, R]) -> tuple[Tensor, Tensor]

The first R channels of every head are rotated in transformers' ``rotate_half`` form,
``x * cos + rotate_half(x) * sin``; the remaining ``D - R`` channels are copied through
(partial rotary, Qwen3.5 / Qwen3-Next / GLM). ``cos``/``sin`` may also have batch 1
(``[1, S, R]``, what a model with shared ``position_ids`` produces): they broadcast.

Design: one program per position ``(b, s)``. It loads that position's cos/sin once and
applies them to every head of q *and* k (one launch for both), a ``[BLOCK_H, R/2]`` tile of
heads at a time for each half, so a program moves ``(Hq + Hk) * D`` elements with
contiguous, vectorisable rows. q and k are addressed through their strides: the usual
``[B, S, H, D] -> transpose(1, 2)`` view is read in place without a copy (only a last
dimension with stride != 1 is copied, once, explicitly). Outputs take the layout of their
input (``torch.empty_like``).

Backward is the transposed rotation, ``dx1 = dy1*cos1 + dy2*sin2``,
``dx2 = dy2*cos2 - dy1*sin1`` (the rotation by ``-sin`` for the usual ``cat(freqs, freqs)``
tables), by the same kernel with ``BACKWARD=True``; it is its own op, so double backward
works too. No gradient flows to cos/sin: the model's rotary tables are computed without
grad; passing tables that require grad is refused rather than silently ignored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_device, check_float, launch_device, next_pow2


@triton.jit
def _rotate_heads(
    X, OUT, b, s, H, sx_b, sx_h, sx_s, so_b, so_h, so_s,
    c1, c2, s1, s2,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BLOCK_H: tl.constexpr, BACKWARD: tl.constexpr,
):
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    x_base = X + b * sx_b + s * sx_s
    o_base = OUT + b * so_b + s * so_s
    for h0 in range(0, H, BLOCK_H):
        hs = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
        hmask = hs < H
        m = hmask[:, None] & dmask[None, :]
        xp = x_base + hs[:, None] * sx_h + d[None, :]
        op = o_base + hs[:, None] * so_h + d[None, :]
        x1 = tl.load(xp, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(xp + HALF, mask=m, other=0.0).to(tl.float32)
        if BACKWARD:
            o1 = x1 * c1 + x2 * s2
            o2 = x2 * c2 - x1 * s1
        else:
            o1 = x1 * c1 - x2 * s1
            o2 = x2 * c2 + x1 * s2
        tl.store(op, o1.to(OUT.dtype.element_ty), mask=m)
        tl.store(op + HALF, o2.to(OUT.dtype.element_ty), mask=m)
        if PASS > 0:
            # channels R..D are not rotated: copied through, in the same program
            p = tl.arange(0, BLOCK_PASS)
            pm = hmask[:, None] & (p < PASS)[None, :]
            xq = x_base + hs[:, None] * sx_h + 2 * HALF + p[None, :]
            oq = o_base + hs[:, None] * so_h + 2 * HALF + p[None, :]
            tl.store(oq, tl.load(xq, mask=pm, other=0.0), mask=pm)


@triton.jit(do_not_specialize=["S"])
def _rotary_kernel(
    Q, K, QO, KO, COS, SIN,
    S, HQ, HK,
    sq_b, sq_h, sq_s, sk_b, sk_h, sk_s,
    sqo_b, sqo_h, sqo_s, sko_b, sko_h, sko_s,
    sc_b, sc_s, ss_b, ss_s,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BACKWARD: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // S
    s = pid % S
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    # cos/sin of this position: read once, used for every head of q and k
    cp = COS + b * sc_b + s * sc_s + d
    sp = SIN + b * ss_b + s * ss_s + d
    c1 = tl.load(cp, mask=dmask, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cp + HALF, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sp, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sp + HALF, mask=dmask, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(Q, QO, b, s, HQ, sq_b, sq_h, sq_s, sqo_b, sqo_h, sqo_s, c1, c2, s1, s2,
                  HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_HQ, BACKWARD)
    _rotate_heads(K, KO, b, s, HK, sk_b, sk_h, sk_s, sko_b, sko_h, sko_s, c1, c2, s1, s2,
                  HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_HK, BACKWARD)


def rope_config(hq: int, hk: int, d: int, r: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_HALF, BLOCK_PASS, BLOCK_HQ, BLOCK_HK, num_warps).

    Head tiles of at most ~2048 elements per half (x1 and x2 together ~4096 in flight per
    program) keep registers low enough for several programs per SM.
    """
    half = r // 2
    block_half = next_pow2(half)
    block_pass = next_pow2(d - r) if d > r else 1
    width = max(block_half, block_pass if d > r else 1)
    cap = max(1, 2048 // width)
    block_hq = min(next_pow2(hq), cap)
    block_hk = min(next_pow2(hk), cap)
    tile = block_hq * width
    warps = 4 if tile <= 2048 else 8
    return block_half, block_pass, block_hq, block_hk, warps


def _launch(q, k, cos, sin, backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    b, hq, s, d = q.shape
    hk = k.shape[1]
    r = cos.shape[-1]
    qo = torch.empty_like(q)
    ko = torch.empty_like(k)
    if b * s == 0 or (hq == 0 and hk == 0):
        return qo, ko
    block_half, block_pass, block_hq, block_hk, warps = rope_config(hq, hk, d, r)
    # a batch-1 table broadcasts: its batch stride is read as 0
    sc_b = cos.stride(0) if cos.shape[0] != 1 else 0
    ss_b = sin.stride(0) if sin.shape[0] != 1 else 0
    with launch_device(q):
        _rotary_kernel[(b * s,)](
            q, k, qo, ko, cos, sin,
            s, hq, hk,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
            sc_b, cos.stride(1), ss_b, sin.stride(1),
            HALF=r // 2, BLOCK_HALF=block_half, PASS=d - r, BLOCK_PASS=block_pass,
            BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BACKWARD=backward, num_warps=warps,
        )
    return qo, ko


@torch.library.custom_op("veomni_triton::rotary", mutates_args=())
def _rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(q, k, cos, sin, backward)


@_rotary.register_fake
def _(q, k, cos, sin, backward):
    return torch.empty_like(q), torch.empty_like(k)


def _setup_context(ctx, inputs, output):
    _q, _k, cos, sin, backward = inputs
    ctx.save_for_backward(cos, sin)
    ctx.backward = backward


def _backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    dq = _last_dim_contiguous(dq)
    dk = _last_dim_contiguous(dk)
    gq, gk = _rotary(dq, dk, cos, sin, not ctx.backward)
    return gq, gk, None, None, None


_rotary.register_autograd(_backward, setup_context=_setup_context)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # the kernel reads rows of D channels; any other stride pattern is handled in place
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first R channels of every head of ``q`` and ``k`` (R = ``cos.shape[-1]``)."""
    op = "rotary"
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"veomni_triton {op}: {name} must be a tensor, got {type(t).__name__}")
        check_float(op, name, t)
    check_device(op, q, k, cos, sin)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"veomni_triton {op}: q and k must be [B, H, S, D], got {tuple(q.shape)} and {tuple(k.shape)} "
            "(transpose a [B, S, H, D] tensor with .transpose(1, 2): no copy is needed)"
        )
    b, _hq, s, d = q.shape
    if k.shape[0] != b or k.shape[2] != s or k.shape[3] != d:
        raise ValueError(
            f"veomni_triton {op}: q {tuple(q.shape)} and k {tuple(k.shape)} must share batch, sequence and head dim"
        )
    if cos.shape != sin.shape:
        raise ValueError(f"veomni_triton {op}: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have one shape")
    if cos.dim() != 3 or cos.shape[0] not in (1, b) or cos.shape[1] != s:
        raise ValueError(
            f"veomni_triton {op}: cos/sin must be [B, S, R] with B = {b} (or 1) and S = {s}, got {tuple(cos.shape)}"
        )
    r = cos.shape[-1]
    if r % 2 or r == 0 or r > d:
        raise ValueError(
            f"veomni_triton {op}: rotary dim R = cos.shape[-1] = {r} must be even and in 2..D={d} "
            "(cos/sin are cat(freqs, freqs) of the rotated channels)"
        )
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError(
            f"veomni_triton {op}: cos/sin require grad, but this kernel gives gradients for q and k only; "
            "pass cos.detach(), sin.detach() (a model's rotary tables carry no gradient)"
        )
    cos = _last_dim_contiguous(cos)
    sin = _last_dim_contiguous(sin)
    return _rotary(_last_dim_contiguous(q), _last_dim_contiguous(k), cos, sin, False)
