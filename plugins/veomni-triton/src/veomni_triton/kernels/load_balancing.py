"""Switch-Transformer load-balancing loss over all MoE layers in one fused Triton pass.

Kernel contract (``veomni_ops.hookspecs.OpHookspecs.load_balancing_loss``)::

    kernel(gate_logits: Sequence[Tensor[T, E]], num_experts: int, top_k: int,
           attention_mask: Tensor[B, S] | None = None) -> Tensor[]  (float32)

Same value as transformers' ``load_balancing_loss_func``: per layer ``p = softmax(logits)``
and its top-k experts; over all layers and the tokens the mask keeps,
``f_e = routes to e / N`` and ``P_e = sum p_e / N`` with ``N = layers * kept tokens``; the loss
is ``E * sum_e f_e * P_e``. Differences, on purpose: the softmax is always computed in fp32
(transformers computes it in the logits' dtype, so for bf16 logits it sums bf16-rounded
probabilities; ours are the exact ones), and among exactly tied probabilities the top-k
takes the lowest expert index.

Launches: forward = 2 (plus a small pinned host-to-device copy of the pointer table and, with
a mask, one cast of the mask), backward = 1.

Host side (the eager path, where a call of 48 layers used to cost more than its kernels): one
pass over the layers reads what the checks and the pointer table need (dtype, shape, device,
strides, address; the detailed per-layer checks run only when that pass finds something off);
the plan it makes (the pointer table) is kept on the autograd node for backward, which only
checks that the saved layers are still where forward read them; launches go through
``launch.launch`` (its fast path skips Triton's per-launch dispatch).

* ``_lbl_partial_kernel``: the L logits tensors are read in place through a table of their
  element offsets from ``gate_logits[0]`` and row strides (no ``torch.stack`` copy of
  ``L*T*E`` values); when every layer is 16-byte aligned the kernel knows it (``VEC``) and
  loads 16 bytes a thread with each row inside one warp, so the row reductions are warp
  shuffles (without that hint the compiled layout spreads each row over all warps and every
  reduction of the top-k goes through shared memory and a barrier; the first version, built
  that way, measured 0.12 TB/s on an H100). Tiles of
  ``BLOCK_T`` rows are numbered over all layers and a fixed number of programs (8 a SM)
  each walk a strip of them. Per tile: fp32 softmax; top-k by ``TOPK`` rounds of "row max,
  drop the entries equal to it" (value-only reductions), and where exact ties made a row
  drop more than ``TOPK`` entries, the tile is redone with ``TOPK`` rounds of arg-max
  (ties: lowest index). Register accumulators of the (mask-weighted) route counts and
  probability sums; one row of each per program to a ``[programs, E]`` buffer. Nothing
  of size ``T*E`` is ever written.
* ``_lbl_reduce_kernel`` (one program): sums the partial rows in a fixed order (no atomics:
  bitwise reproducible), the mask, and produces the loss and the backward coefficient
  ``c_e = E * count_e / N**2``, centred (minus its mean over the experts: the softmax
  backward ignores a constant shift, and centred terms keep it accurate in float32). With no
  token counted (``T = 0``, or a mask that keeps none) ``N`` is taken as 1: the loss is 0 and
  the gradients are zero, never NaN.
* backward, ``_lbl_bwd_kernel``: ``dL/dp_{t,e} = c_e * mask_t`` (the top-k counts are piecewise
  constant, so no gradient flows through them); it recomputes the softmax per row and writes
  ``dlogits = p * (g - sum(p * g))`` for every layer into one ``[L, T, E]`` buffer.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ._common import CHECKS, check_device, interpreter_active
from .launch import PLAIN_TENSORS, cdiv, eager_path, launch, next_pow2, sm_count

_OP = "load_balancing_loss"

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _lbl_partial_kernel(
    x0_ptr, table_ptr, mask_ptr, part_ptr,
    T, E, L, TILES_PER_LAYER, TOTAL_TILES, TILES_PER_PROG,
    DTYPE: tl.constexpr, TOPK: tl.constexpr, HAS_MASK: tl.constexpr, VEC: tl.constexpr,
    BLOCK_T: tl.constexpr, E_POW2: tl.constexpr,
):
    # Tiles of BLOCK_T rows are numbered over all layers (tile g: layer g // TILES_PER_LAYER);
    # program pid walks tiles [pid * TILES_PER_PROG, ...): the number of programs is chosen
    # for the GPU, whatever the number of layers, and a strip may cross into the next layer.
    pid = tl.program_id(0)
    cols = tl.arange(0, E_POW2)
    cmask = cols < E
    cnt = tl.zeros((BLOCK_T, E_POW2), dtype=tl.float32)
    psum = tl.zeros((BLOCK_T, E_POW2), dtype=tl.float32)
    g_begin = pid * TILES_PER_PROG
    g_end = tl.minimum(g_begin + TILES_PER_PROG, TOTAL_TILES)
    for g in range(g_begin, g_end):
        layer = g // TILES_PER_LAYER
        shift = tl.load(table_ptr + layer)
        row_stride = tl.load(table_ptr + L + layer)
        if VEC > 1:
            # host-checked: 16-byte aligned rows. Lets the compiler use 16-byte loads and a
            # layout whose rows lie inside one warp (without it each row spans the 4 warps and
            # every row reduction of the top-k goes through shared memory and a barrier).
            shift = tl.multiple_of(shift, VEC)
            row_stride = tl.multiple_of(row_stride, VEC)
        base = x0_ptr + shift
        rows = (g - layer * TILES_PER_LAYER) * BLOCK_T + tl.arange(0, BLOCK_T)
        rmask = rows < T
        x = tl.load(
            base + rows[:, None].to(tl.int64) * row_stride + cols[None, :],
            mask=rmask[:, None] & cmask[None, :], other=float("-inf"),
        ).to(tl.float32)
        # rows past the end become all-zero logits (finite softmax) with weight 0
        x = tl.where(rmask[:, None], x, 0.0)
        ex = tl.exp(x - tl.max(x, axis=1)[:, None])
        p = ex / tl.sum(ex, axis=1)[:, None]
        if HAS_MASK:
            wt = tl.load(mask_ptr + rows, mask=rmask, other=0.0)
        else:
            wt = rmask.to(tl.float32)
        psum += p * wt[:, None]
        # top-k, fast path: TOPK rounds of "row max, then drop every entry equal to it" (a
        # value-only reduction, half the shuffles of an arg-max). Padded columns hold -1 and
        # are never the max. Without ties this drops exactly the top-k; when a round drops
        # more than one entry (exact ties, e.g. probabilities that underflow to 0) the row
        # may have dropped more than TOPK entries, and then the tile is redone exactly below.
        q = tl.where(cmask[None, :], p, -1.0)
        for _k in tl.static_range(TOPK):
            q = tl.where(q == tl.max(q, axis=1)[:, None], -1.0, q)
        sel = (q < 0.0) & cmask[None, :]
        nsel = tl.where(rmask, tl.sum(sel.to(tl.int32), axis=1), 0)
        if tl.max(nsel, axis=0) > TOPK:
            # exact: TOPK rounds of arg-max, ties to the lowest expert index
            q = tl.where(cmask[None, :], p, -1.0)
            for _k in tl.static_range(TOPK):
                best = tl.argmax(q, axis=1)
                q = tl.where(cols[None, :] == best[:, None], -1.0, q)
            sel = (q < 0.0) & cmask[None, :]
        cnt += tl.where(sel, wt[:, None], 0.0)
    # one buffer of 2 * programs rows: the route counts, then the probability sums
    out = pid.to(tl.int64) * E_POW2 + cols
    tl.store(part_ptr + out, tl.sum(cnt, axis=0))
    tl.store(part_ptr + tl.num_programs(0).to(tl.int64) * E_POW2 + out, tl.sum(psum, axis=0))


@triton.jit
def _lbl_reduce_kernel(
    part_ptr, mask_ptr, loss_ptr, coef_ptr,
    P, T, E, L,
    HAS_MASK: tl.constexpr, BLOCK_P: tl.constexpr, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr,
):
    cols = tl.arange(0, E_POW2)
    cmask = cols < E
    acc_c = tl.zeros((BLOCK_P, E_POW2), dtype=tl.float32)
    acc_p = tl.zeros((BLOCK_P, E_POW2), dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        offs = rows[:, None].to(tl.int64) * E_POW2 + cols[None, :]
        m = (rows < P)[:, None]
        acc_c += tl.load(part_ptr + offs, mask=m, other=0.0)
        acc_p += tl.load(part_ptr + P * E_POW2 + offs, mask=m, other=0.0)
    counts = tl.sum(acc_c, axis=0)
    probs = tl.sum(acc_p, axis=0)
    if HAS_MASK:
        acc_m = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for m0 in range(0, T, BLOCK_M):
            r = m0 + tl.arange(0, BLOCK_M)
            acc_m += tl.load(mask_ptr + r, mask=r < T, other=0.0)
        kept = tl.sum(acc_m, axis=0)
    else:
        kept = T * 1.0
    n = kept * L
    # no token counted (T = 0, or the mask keeps none): counts and probs are 0, and so are the
    # loss and its gradient -- never 0 / 0
    n = tl.where(n > 0, n, 1.0)
    f = counts / n
    pm = probs / n
    loss = tl.sum(tl.where(cmask, f * pm, 0.0), axis=0) * E
    tl.store(loss_ptr, loss)
    # d loss / d p_{l,t,e} = E * count_e / n^2 (times the token's mask weight), stored centred:
    # E * (count_e - mean_e count) / n^2. The softmax backward p * (g - sum(p * g)) is unchanged
    # by a constant added to g (sum(p) = 1), but its float32 value is not: with balanced
    # routing every g_e is close to the mean, g - sum(p * g) cancels most of their digits, and
    # the roundings of the uncentred g (of E * count / n^2, and of the sum) left errors of
    # 2-3e-5 of the gradient's RMS at 8 layers x 2048 tokens x 128 experts (H100 check,
    # 2026-11-21: 42 float32 gradients over the spec's tolerance, worst 2.35 in the kit's
    # units). The counts are centred before any rounding (float64, E values: free), so the
    # stored terms are of the size of the result and carry one rounding each: the same H100
    # check (seed 20261121) now gives 0.023 / 0.037 / 0.017 (worst float32 gradient of its
    # three full cases) under the unchanged float32 tolerance.
    counts64 = tl.where(cmask, counts.to(tl.float64), 0.0)
    n64 = n.to(tl.float64)
    centred = (counts64 - tl.sum(counts64, axis=0) / E) * E / (n64 * n64)
    tl.store(coef_ptr + cols, centred.to(tl.float32), mask=cmask)


@triton.jit
def _lbl_bwd_kernel(
    x0_ptr, table_ptr, mask_ptr, coef_ptr, gout_ptr, dx_ptr,
    T, E, L,
    HAS_MASK: tl.constexpr, VEC: tl.constexpr, BLOCK_T: tl.constexpr, E_POW2: tl.constexpr,
):
    pid = tl.program_id(0)
    blocks = (T + BLOCK_T - 1) // BLOCK_T
    layer = pid // blocks
    rows = (pid % blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < T
    cols = tl.arange(0, E_POW2)
    cmask = cols < E
    shift = tl.load(table_ptr + layer)
    row_stride = tl.load(table_ptr + L + layer)
    if VEC > 1:
        shift = tl.multiple_of(shift, VEC)
        row_stride = tl.multiple_of(row_stride, VEC)
    base = x0_ptr + shift
    m2 = rmask[:, None] & cmask[None, :]
    x = tl.load(base + rows[:, None].to(tl.int64) * row_stride + cols[None, :], mask=m2, other=float("-inf"))
    x = tl.where(rmask[:, None], x.to(tl.float32), 0.0)
    ex = tl.exp(x - tl.max(x, axis=1)[:, None])
    p = ex / tl.sum(ex, axis=1)[:, None]
    gout = tl.load(gout_ptr).to(tl.float32)
    coef = tl.load(coef_ptr + cols, mask=cmask, other=0.0)
    if HAS_MASK:
        wt = tl.load(mask_ptr + rows, mask=rmask, other=0.0)
    else:
        wt = tl.full((BLOCK_T,), 1.0, tl.float32)
    g = coef[None, :] * (wt * gout)[:, None]
    dx = p * (g - tl.sum(p * g, axis=1)[:, None])
    out = dx_ptr + (layer.to(tl.int64) * T + rows[:, None]) * E + cols[None, :]
    tl.store(out, dx.to(dx_ptr.dtype.element_ty), mask=m2)


# ---------------------------------------------------------------- host side
#: Device copies of recent pointer tables, keyed by (device, element size, addresses, row
#: strides). A training loop's router logits come back at the same addresses step after step
#: (caching allocator), so most calls need no host-to-device copy; and under CUDA-graph capture
#: the table was made in the warm-up run, so no copy from a (reusable) pinned host buffer gets
#: captured.
_TABLES: OrderedDict[tuple, tuple[torch.Tensor, int]] = OrderedDict()
_TABLES_MAX = 16


def _table(dev: torch.device, elt: int, ptrs: list[int], strides: list[int]) -> tuple[torch.Tensor, int]:
    """The pointer table of layers at ``ptrs`` (each a whole number of ``elt``-byte elements
    from ``ptrs[0]``) with row strides ``strides``: see :func:`_pointer_table`."""
    key = (dev, elt, *ptrs, *strides)  # offsets are in elements: the dtype is part of the key
    hit = _TABLES.get(key)
    if hit is not None:
        _TABLES.move_to_end(key)
        return hit
    p0 = ptrs[0]
    shifts = [(p - p0) // elt for p in ptrs]
    vec = 16 // elt if p0 % 16 == 0 else 1
    while vec > 1 and any(v % vec for v in shifts + strides):
        vec //= 2
    table = torch.tensor(shifts + strides, dtype=torch.int64)
    if dev.type == "cuda":
        table = table.pin_memory().to(dev, non_blocking=True)
    _TABLES[key] = (table, vec)
    if len(_TABLES) > _TABLES_MAX:
        _TABLES.popitem(last=False)
    return table, vec


def _pointer_table(logits: Sequence[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """int64 ``[2, L]`` on the logits' device: each layer's start as an element offset from
    ``logits[0]`` and its row stride; and ``VEC``, the number of elements (up to 16 bytes)
    that divides every offset and stride when ``logits[0]`` is 16-byte aligned (else 1).

    The kernels read layer ``l`` at ``logits[0] + offset[l]``: a typed pointer argument plus
    an offset keeps the alignment facts the compiler needs for 16-byte loads (a pointer cast
    from a loaded integer carries none). Built on the host and, when not cached, sent with
    one asynchronous copy from pinned memory: the host never waits for the GPU.
    (Callers made every layer element-aligned relative to ``logits[0]``: see
    :func:`_aligned_layers`.)
    """
    return _table(logits[0].device, logits[0].element_size(), [t.data_ptr() for t in logits],
                  [t.stride(0) for t in logits])


def _aligned_layers(logits: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Unit stride along experts, and every layer's address a whole number of elements from
    the first one's (always so for real allocations; a byte-offset view gets copied)."""
    logits = [_rows_ok(x) for x in logits]
    elt = logits[0].element_size()
    p0 = logits[0].data_ptr()
    return [x if (x.data_ptr() - p0) % elt == 0 else x.clone() for x in logits]


def _rows_ok(t: torch.Tensor) -> torch.Tensor:
    # the kernels need unit stride along experts; any row stride is fine
    return t if t.stride(1) == 1 or t.shape[1] == 1 else t.contiguous()


class _Plan:
    """What the launches of one call read: the layers' addresses and row strides, their pointer
    table (kept from forward for backward), and the shapes. Built once per call."""

    __slots__ = ("ptrs", "strides", "in_place", "table", "vec", "t", "e", "num_layers", "index")

    def __init__(self, layers: Sequence[torch.Tensor], ptrs: list[int], strides: list[int], in_place: bool) -> None:
        x0 = layers[0]
        self.ptrs = ptrs
        self.in_place = in_place  # the layers are the caller's tensors (none copied)
        self.strides = strides
        self.t, self.e = x0.shape
        self.num_layers = len(layers)
        self.index = x0.get_device()
        self.table, self.vec = _table(x0.device, x0.element_size(), ptrs, strides)

    def reads(self, layers: Sequence[torch.Tensor]) -> bool:
        """``layers`` are where (and as) this plan read them: its table still holds for them."""
        for x, p, s in zip(layers, self.ptrs, self.strides):
            if x.data_ptr() != p or x.stride(0) != s:
                return False
        return True


def _plan(layers: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], _Plan]:
    """The general case: layers copied where the kernels cannot read them in place."""
    aligned = _aligned_layers(layers)
    in_place = all(a is x for a, x in zip(aligned, layers))
    return aligned, _Plan(aligned, [x.data_ptr() for x in aligned], [x.stride(0) for x in aligned], in_place)


@functools.lru_cache(maxsize=1024)
def _fwd_geometry(t: int, e: int, num_layers: int, index: int) -> tuple[int, int, int, int, int, int]:
    """(E_POW2, BLOCK_T, tiles per layer, total tiles, tiles per program, programs) of the
    partial kernel."""
    e_pow2 = max(16, next_pow2(e))
    # four [BLOCK_T, E] fp32 tiles live at once (probabilities, top-k scratch, two
    # accumulators): 1024 values at 4 warps is 56 registers in an sm90 compile (E=128,
    # BLOCK_T=8, no spill), i.e. 9 programs (36 warps) fit on an SM
    block_t = max(1, min(64, 1024 // e_pow2))
    if interpreter_active():
        block_t = min(block_t, 8)  # several tiles per layer at test shapes
    tiles_per_layer = cdiv(t, block_t)
    total = num_layers * tiles_per_layer
    # enough resident programs to hide the load latency; each walks a strip of tiles (which
    # may run on into the next layer), so the grid does not depend on the number of layers
    per_sm = 1 if interpreter_active() else 8
    programs = max(1, min(total, per_sm * sm_count(index)))
    tiles_per_prog = max(1, cdiv(total, programs))
    programs = max(1, cdiv(total, tiles_per_prog))  # T = 0: one (zeroed) partial row
    return e_pow2, block_t, tiles_per_layer, total, tiles_per_prog, programs


def _forward(x0: torch.Tensor, plan: _Plan, top_k: int, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward launches: (loss, per-expert backward coefficient)."""
    t, e, num_layers, index = plan.t, plan.e, plan.num_layers, plan.index
    dev = x0.device
    e_pow2, block_t, tiles_per_layer, total, tiles_per_prog, programs = _fwd_geometry(t, e, num_layers, index)
    loss = torch.empty((), device=dev, dtype=torch.float32)
    coef = torch.empty((e,), device=dev, dtype=torch.float32)
    part = torch.empty((2 * programs, e_pow2), device=dev, dtype=torch.float32)
    has_mask = mask is not None
    mask_arg = mask if has_mask else part  # never read without a mask
    if t > 0:
        launch(
            index, _lbl_partial_kernel, (programs,),
            x0, plan.table, mask_arg, part, t, e, num_layers, tiles_per_layer, total, tiles_per_prog,
            DTYPE=_TL_DTYPES[x0.dtype], TOPK=top_k, HAS_MASK=has_mask, VEC=plan.vec,
            BLOCK_T=block_t, E_POW2=e_pow2, num_warps=4,
        )
    else:
        part.zero_()
    launch(
        index, _lbl_reduce_kernel, (1,),
        part, mask_arg, loss, coef, programs, t, e, num_layers,
        HAS_MASK=has_mask, BLOCK_P=max(1, min(64, 8192 // e_pow2)), E_POW2=e_pow2, BLOCK_M=2048, num_warps=8,
    )
    return loss, coef


def _backward(grad: torch.Tensor, x0: torch.Tensor, plan: _Plan, coef: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The backward launch: ``[L, T, E]`` gradients of the logits."""
    t, e, num_layers = plan.t, plan.e, plan.num_layers
    dx = torch.empty((num_layers, t, e), device=x0.device, dtype=x0.dtype)
    if t == 0:
        return dx
    if grad.dim() != 0 or grad.dtype != torch.float32:
        grad = grad.reshape(()).to(torch.float32)
    e_pow2 = max(16, next_pow2(e))
    # 2048 values a program: 16-byte loads, 64 registers at 4 warps (sm90 compile, fp32, E=128)
    block_t = max(1, min(64, 2048 // e_pow2))
    has_mask = mask is not None
    launch(
        plan.index, _lbl_bwd_kernel, (num_layers * cdiv(t, block_t),),
        x0, plan.table, mask if has_mask else coef, coef, grad, dx, t, e, num_layers,
        HAS_MASK=has_mask, VEC=plan.vec, BLOCK_T=block_t, E_POW2=e_pow2, num_warps=4,
    )
    return dx


# ---------------------------------------------------------------- custom ops (torch.compile)
@torch.library.custom_op("veomni_triton::load_balancing_loss_fwd", mutates_args=())
def _lbl_fwd(
    gate_logits: list[torch.Tensor], num_experts: int, top_k: int, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    aligned, plan = _plan(gate_logits)
    return _forward(aligned[0], plan, top_k, mask)


@_lbl_fwd.register_fake
def _(gate_logits, num_experts, top_k, mask):
    x = gate_logits[0]
    return x.new_empty((), dtype=torch.float32), x.new_empty((x.shape[1],), dtype=torch.float32)


@torch.library.custom_op("veomni_triton::load_balancing_loss_bwd", mutates_args=())
def _lbl_bwd(
    grad: torch.Tensor, gate_logits: list[torch.Tensor], coef: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    aligned, plan = _plan(gate_logits)
    return _backward(grad, aligned[0], plan, coef, mask)


@_lbl_bwd.register_fake
def _(grad, gate_logits, coef, mask):
    x = gate_logits[0]
    return x.new_empty((len(gate_logits), x.shape[0], x.shape[1]))


def _setup_context(ctx, inputs, output):
    gate_logits, _num_experts, _top_k, mask = inputs
    _loss, coef = output
    ctx.num_layers = len(gate_logits)
    ctx.has_mask = mask is not None
    ctx.save_for_backward(*gate_logits, coef, *((mask,) if mask is not None else ()))
    ctx.mark_non_differentiable(coef)


def _op_backward(ctx, grad, _dcoef):
    saved = ctx.saved_tensors
    logits = list(saved[: ctx.num_layers])
    coef = saved[ctx.num_layers]
    mask = saved[ctx.num_layers + 1] if ctx.has_mask else None
    dx = _lbl_bwd(grad, logits, coef, mask)
    return list(dx.unbind(0)), None, None, None


_lbl_fwd.register_autograd(_op_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- eager autograd
class _LoadBalancingFunction(torch.autograd.Function):
    """The eager path: one lean autograd node around the launchers (no ``torch.library``
    dispatch, whose pytree handling of a 48-tensor list is most of the host time per call).
    The plan (pointer table) of forward serves backward when the saved layers come back where
    forward read them (always, unless a saved-tensor hook moved them: then it is rebuilt)."""

    @staticmethod
    def forward(ctx, mask, top_k, plan, aligned, *gate_logits):
        # ``aligned``: the layers as the kernels read them (``gate_logits`` unless some had to be
        # copied); a sequence, so not an autograd input of its own
        loss, coef = _forward(aligned[0], plan, top_k, mask)
        ctx.plan = plan
        ctx.has_mask = mask is not None
        ctx.save_for_backward(coef, *((mask,) if mask is not None else ()), *gate_logits)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        coef = saved[0]
        mask = saved[1] if ctx.has_mask else None
        logits = saved[2:] if ctx.has_mask else saved[1:]
        plan = ctx.plan
        if plan.in_place and plan.reads(logits):
            x0 = logits[0]
        else:
            aligned, plan = _plan(logits)
            x0 = aligned[0]
        dx = _backward(grad, x0, plan, coef, mask)
        return (None, None, None, None, *dx.unbind(0))


# ---------------------------------------------------------------- public kernel
def _scan(logits: Sequence[torch.Tensor]) -> tuple[list[int], list[int]] | None:
    """One pass over the layers with cheap attribute reads: their addresses and row strides
    when every layer is a plain tensor of the first one's dtype, [T, E] shape and device, with
    unit stride along experts and an address a whole number of elements from the first one's
    (what the kernels read in place); ``None`` otherwise (then the full checks run and, where
    they pass, the general path copies what it must)."""
    first = logits[0]
    if type(first) not in PLAIN_TENSORS or first.dim() != 2:
        return None
    dtype, shape, dev = first.dtype, first.shape, first.device
    elt = first.element_size()
    p0 = first.data_ptr()
    any_stride = shape[1] == 1
    ptrs, strides = [], []
    for x in logits:
        if type(x) not in PLAIN_TENSORS or x.dtype != dtype or x.shape != shape or x.device != dev:
            return None
        row, col = x.stride()
        p = x.data_ptr()
        if (col != 1 and not any_stride) or (p - p0) % elt:
            return None
        ptrs.append(p)
        strides.append(row)
    return ptrs, strides


def _check_layers(logits: list[torch.Tensor], attention_mask: torch.Tensor | None) -> None:
    """The full per-layer checks (their messages name the layer at fault)."""
    for i, x in enumerate(logits):
        CHECKS.check_tensor(x, f"gate_logits[{i}]", _OP)
    check_device(_OP, **{f"gate_logits[{i}]": x for i, x in enumerate(logits)}, attention_mask=attention_mask)
    first = logits[0]
    CHECKS.check_float(first, "gate_logits[0]", _OP)
    if first.dim() != 2:
        raise ValueError(f"{_OP} (triton): each gate_logits tensor must be [T, E], got {tuple(first.shape)}")
    for i, x in enumerate(logits):
        if x.shape != first.shape or x.dtype != first.dtype:
            raise ValueError(
                f"{_OP} (triton): gate_logits[{i}] is {tuple(x.shape)} {x.dtype} but gate_logits[0] is "
                f"{tuple(first.shape)} {first.dtype}; every layer must give [T, E] logits of one dtype"
            )


def load_balancing_loss(
    gate_logits: Sequence[torch.Tensor] | torch.Tensor,
    num_experts: int,
    top_k: int,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Auxiliary load-balancing loss over all layers (see the module docstring); fp32 scalar."""
    if isinstance(gate_logits, torch.Tensor):
        if gate_logits.dim() != 3:
            raise ValueError(
                f"{_OP} (triton): gate_logits as one tensor must be [L, T, E], got {tuple(gate_logits.shape)}"
            )
        gate_logits = gate_logits.unbind(0)
    if not isinstance(gate_logits, (list, tuple)) or not gate_logits:
        raise TypeError(
            f"{_OP} (triton): gate_logits must be a non-empty sequence of [T, E] tensors (one per MoE layer), "
            f"got {type(gate_logits).__name__}"
        )
    compiling = torch.compiler.is_compiling()
    scan = None if compiling else _scan(gate_logits)
    first = gate_logits[0]
    if scan is None:
        _check_layers(list(gate_logits), attention_mask)
    else:
        # every layer is a plain tensor of the first one's dtype, shape and device: what is left
        # to check is about the first one (and the mask's device)
        check_device(_OP, **{"gate_logits[0]": first}, attention_mask=attention_mask)
        CHECKS.check_float(first, "gate_logits[0]", _OP)
    if first.device.type == "cuda" and interpreter_active():
        raise RuntimeError(
            f"{_OP} (triton): reads the layers through a table of device addresses, which Triton's interpreter "
            "cannot follow for CUDA tensors; unset TRITON_INTERPRET, or move the logits to the CPU to debug"
        )
    t, e = first.shape
    if not isinstance(num_experts, int) or num_experts != e:
        raise ValueError(f"{_OP} (triton): num_experts={num_experts!r} but the logits have {e} experts")
    if e > 1024:
        raise ValueError(f"{_OP} (triton): {e} experts is more than this kernel holds in registers (1024)")
    if not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise ValueError(f"{_OP} (triton): top_k={top_k!r} must be an int in [1, num_experts={e}]")
    mask = None
    if attention_mask is not None:
        if attention_mask.numel() != t:
            raise ValueError(
                f"{_OP} (triton): attention_mask has {attention_mask.numel()} entries "
                f"({tuple(attention_mask.shape)}) but the logits have T={t} rows; it must be [B, S] with B*S == T"
            )
        mask = attention_mask.reshape(-1).to(torch.float32)
    if scan is not None or eager_path(*gate_logits):
        # eager: the launchers directly, through one lean autograd node when a gradient may be due
        if scan is not None:
            aligned, plan = gate_logits, _Plan(gate_logits, *scan, in_place=True)
        else:
            aligned, plan = _plan(gate_logits)
        if torch.is_grad_enabled():
            return _LoadBalancingFunction.apply(mask, top_k, plan, aligned, *gate_logits)
        return _forward(aligned[0], plan, top_k, mask)[0]
    # torch.compile (and tensor subclasses): the custom op, which Dynamo traces without a break
    loss, _coef = _lbl_fwd(list(gate_logits), num_experts, top_k, mask)
    return loss
