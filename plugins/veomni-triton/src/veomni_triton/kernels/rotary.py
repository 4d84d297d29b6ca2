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

import functools

import torch
import triton
import triton.language as tl

from ._common import check_tensors
from .launch import eager_path, launch, next_pow2


@triton.jit
def _load_heads(X, x_base, h0, H: tl.constexpr, sx_h, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                PASS: tl.constexpr, BLOCK_PASS: tl.constexpr, BLOCK_H: tl.constexpr):
    """Heads ``h0 .. h0+BLOCK_H`` of one position: (first half, second half, pass-through)."""
    d = tl.arange(0, BLOCK_HALF)
    hs = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
    m = (hs < H)[:, None] & (d < HALF)[None, :]
    xp = x_base + hs[:, None] * sx_h + d[None, :]
    # read once, never again: do not keep q/k in L2 at the expense of the cos/sin tables
    x1 = tl.load(xp, mask=m, other=0.0, eviction_policy="evict_first")
    x2 = tl.load(xp + HALF, mask=m, other=0.0, eviction_policy="evict_first")
    if PASS > 0:
        p = tl.arange(0, BLOCK_PASS)
        pm = (hs < H)[:, None] & (p < PASS)[None, :]
        xr = tl.load(x_base + hs[:, None] * sx_h + 2 * HALF + p[None, :], mask=pm, other=0.0,
                     eviction_policy="evict_first")
    else:
        xr = x1  # unused
    return x1, x2, xr


@triton.jit
def _store_heads(OUT, o_base, h0, H: tl.constexpr, so_h, x1, x2, xr, c1, c2, s1, s2,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
                 BLOCK_H: tl.constexpr, BACKWARD: tl.constexpr):
    """Rotate the loaded heads and store them (and the pass-through channels)."""
    d = tl.arange(0, BLOCK_HALF)
    hs = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
    m = (hs < H)[:, None] & (d < HALF)[None, :]
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    if BACKWARD:
        o1 = a * c1 + b * s2
        o2 = b * c2 - a * s1
    else:
        o1 = a * c1 - b * s1
        o2 = b * c2 + a * s2
    op = o_base + hs[:, None] * so_h + d[None, :]
    tl.store(op, o1.to(OUT.dtype.element_ty), mask=m)
    tl.store(op + HALF, o2.to(OUT.dtype.element_ty), mask=m)
    if PASS > 0:
        # channels R..D are not rotated: copied through, in the same program
        p = tl.arange(0, BLOCK_PASS)
        pm = (hs < H)[:, None] & (p < PASS)[None, :]
        tl.store(o_base + hs[:, None] * so_h + 2 * HALF + p[None, :], xr, mask=pm)


@triton.jit(do_not_specialize=["S"])
def _rotary_kernel(
    Q, K, QO, KO, COS, SIN,
    S,
    sq_b, sq_h, sq_s, sk_b, sk_h, sk_s,
    sqo_b, sqo_h, sqo_s, sko_b, sko_h, sko_s,
    sc_b, sc_s, ss_b, ss_s,
    HQ: tl.constexpr, HK: tl.constexpr,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BACKWARD: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // S
    s = pid % S
    q_base = Q + b * sq_b + s * sq_s
    k_base = K + b * sk_b + s * sk_s
    qo_base = QO + b * sqo_b + s * sqo_s
    ko_base = KO + b * sko_b + s * sko_s
    # Head counts are compile-time constants (a model has one pair), so the head loops unroll.
    # In the common case (every head of q and of k in one tile each) all loads of the program
    # are issued before the first store: q, k and the tables are in flight together.
    if HQ <= BLOCK_HQ and HK <= BLOCK_HK:
        q1, q2, qr = _load_heads(Q, q_base, 0, HQ, sq_h, HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_HQ)
        k1, k2, kr = _load_heads(K, k_base, 0, HK, sk_h, HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_HK)
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    # cos/sin of this position: read once, used for every head of q and k
    cp = COS + b * sc_b + s * sc_s + d
    sp = SIN + b * ss_b + s * ss_s + d
    c1 = tl.load(cp, mask=dmask, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cp + HALF, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sp, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sp + HALF, mask=dmask, other=0.0).to(tl.float32)[None, :]
    if HQ <= BLOCK_HQ and HK <= BLOCK_HK:
        _store_heads(QO, qo_base, 0, HQ, sqo_h, q1, q2, qr, c1, c2, s1, s2,
                     HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_HQ, BACKWARD)
        _store_heads(KO, ko_base, 0, HK, sko_h, k1, k2, kr, c1, c2, s1, s2,
                     HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_HK, BACKWARD)
    else:
        for h0 in tl.static_range(0, HQ, BLOCK_HQ):
            x1, x2, xr = _load_heads(Q, q_base, h0, HQ, sq_h, HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_HQ)
            _store_heads(QO, qo_base, h0, HQ, sqo_h, x1, x2, xr, c1, c2, s1, s2,
                         HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_HQ, BACKWARD)
        for h0 in tl.static_range(0, HK, BLOCK_HK):
            x1, x2, xr = _load_heads(K, k_base, h0, HK, sk_h, HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_HK)
            _store_heads(KO, ko_base, h0, HK, sko_h, x1, x2, xr, c1, c2, s1, s2,
                         HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_HK, BACKWARD)


@functools.lru_cache(maxsize=1024)
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


# ---------------------------------------------------------------- launcher
# A plain function on validated 4-D q, k (last stride 1) and cos/sin; ``index`` is the CUDA
# device (-1 on the CPU under the interpreter). The body of both the eager
# ``autograd.Function`` and the ``torch.library`` custom op.
def _launch(q, k, cos, sin, backward: bool, index: int) -> tuple[torch.Tensor, torch.Tensor]:
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
    sq, sk, sqo, sko = q.stride(), k.stride(), qo.stride(), ko.stride()
    launch(
        index, _rotary_kernel, (b * s,),
        q, k, qo, ko, cos, sin,
        s,
        sq[0], sq[1], sq[2], sk[0], sk[1], sk[2],
        sqo[0], sqo[1], sqo[2], sko[0], sko[1], sko[2],
        sc_b, cos.stride(1), ss_b, sin.stride(1),
        HQ=hq, HK=hk, HALF=r // 2, BLOCK_HALF=block_half, PASS=d - r, BLOCK_PASS=block_pass,
        BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BACKWARD=backward, num_warps=warps,
    )
    return qo, ko


# ---------------------------------------------------------------- eager autograd
class _RotaryFunction(torch.autograd.Function):
    """The eager path: a lean autograd node around the launcher (no ``torch.library``
    dispatch; see ``apply_rotary``). Its backward applies this same function with the
    rotation reversed, so double backward works."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, backward, index):
        ctx.save_for_backward(cos, sin)
        ctx.backward = backward
        ctx.index = index
        return _launch(q, k, cos, sin, backward, index)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq = _last_dim_contiguous(dq)
        dk = _last_dim_contiguous(dk)
        if torch.is_grad_enabled() and (dq.requires_grad or dk.requires_grad):
            gq, gk = _RotaryFunction.apply(dq, dk, cos, sin, not ctx.backward, ctx.index)
        else:
            gq, gk = _launch(dq, dk, cos, sin, not ctx.backward, ctx.index)
        return gq, gk, None, None, None, None


# ---------------------------------------------------------------- custom op (torch.compile)
@torch.library.custom_op("veomni_triton::rotary", mutates_args=())
def _rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(q, k, cos, sin, backward, q.get_device())


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


# ---------------------------------------------------------------- public kernel
_NAMES = ("q", "k", "cos", "sin")


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first R channels of every head of ``q`` and ``k`` (R = ``cos.shape[-1]``)."""
    op = "rotary"
    index = check_tensors(op, _NAMES, (q, k, cos, sin))
    qs, ks, cs = q.shape, k.shape, cos.shape
    if len(qs) != 4 or len(ks) != 4:
        raise ValueError(
            f"{op} (triton): q and k must be [B, H, S, D], got {tuple(qs)} and {tuple(ks)} "
            "(transpose a [B, S, H, D] tensor with .transpose(1, 2): no copy is needed)"
        )
    b, _hq, s, d = qs
    if ks[0] != b or ks[2] != s or ks[3] != d:
        raise ValueError(
            f"{op} (triton): q {tuple(qs)} and k {tuple(ks)} must share batch, sequence and head dim"
        )
    if cs != sin.shape:
        raise ValueError(f"{op} (triton): cos {tuple(cs)} and sin {tuple(sin.shape)} must have one shape")
    if len(cs) != 3 or (cs[0] != b and cs[0] != 1) or cs[1] != s:
        raise ValueError(
            f"{op} (triton): cos/sin must be [B, S, R] with B = {b} (or 1) and S = {s}, got {tuple(cs)}"
        )
    r = cs[2]
    if r % 2 or r == 0 or r > d:
        raise ValueError(
            f"{op} (triton): rotary dim R = cos.shape[-1] = {r} must be even and in 2..D={d} "
            "(cos/sin are cat(freqs, freqs) of the rotated channels)"
        )
    grad = torch.is_grad_enabled()
    if grad and (cos.requires_grad or sin.requires_grad):
        raise ValueError(
            f"{op} (triton): cos/sin require grad, but this kernel gives gradients for q and k only; "
            "pass cos.detach(), sin.detach() (a model's rotary tables carry no gradient)"
        )
    cos = _last_dim_contiguous(cos)
    sin = _last_dim_contiguous(sin)
    q2 = _last_dim_contiguous(q)
    k2 = _last_dim_contiguous(k)
    if eager_path(q, k, cos, sin):
        # eager: the launcher directly, through a lean autograd node only when a gradient is due
        if grad and (q.requires_grad or k.requires_grad):
            return _RotaryFunction.apply(q2, k2, cos, sin, False, index)
        return _launch(q2, k2, cos, sin, False, index)
    # torch.compile (and tensor subclasses): the custom op, which Dynamo traces without a break
    return _rotary(q2, k2, cos, sin, False)
