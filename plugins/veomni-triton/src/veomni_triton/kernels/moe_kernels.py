"""Triton kernels of the MoE experts op (the launchers and autograd live in :mod:`.moe`).

Vocabulary shared by every kernel here:

* a *route* is one (token, k) pair, numbered ``r = t * TOPK + k`` (the flat order of
  ``top_k_index``); there are ``TK = T * TOPK`` of them.
* ``perm`` lists the route numbers sorted by expert (a stable sort, so inside one expert the
  routes keep their original order); position ``row`` of that list is a *sorted row*.
* ``offs[e] .. offs[e + 1]`` are the sorted rows of expert ``e`` (``offs`` has ``E + 1``
  entries, computed on the device). Routes whose expert index lies outside ``[0, E)`` fall
  outside every expert's range: no tile sees them and the combine kernel skips them, which is
  what the contract asks for its expert-parallel sentinels ``-1`` and ``E`` (any other such
  index is refused before the launch, see :mod:`.moe`).

M-grouped GEMMs (one row per sorted route) are launched with a grid sized from a bound that
the host knows without reading device memory: ``cdiv(TK, BLOCK_M) + min(E, TK)`` M-tiles
bounds ``sum_e cdiv(count_e, BLOCK_M)``. ``tile_map_kernel`` (a few small programs) writes, for
every tile id under that bound, its expert and first sorted row; a GEMM program reads its two
entries and exits when its tile id has no work. Programs are ordered N-tile fastest, so the
N-tiles of one M-tile run together (the gathered A rows come from HBM once) and the M-tiles
of one expert run one after another (its weights stay in L2).

``UPCAST`` (set only under ``TRITON_INTERPRET=1``): Triton's CPU interpreter computes
bf16 x bf16 ``tl.dot`` wrongly (triton 3.9); products of 16-bit floats are exact in fp32, so
upcasting the operands there computes the same mathematical result; it also makes the
output casts round to nearest even (:func:`_to_out`), as the GPU does. The GEMM main loops call
no helper ``@triton.jit`` function: the interpreter re-patches the language on every
device-function call, which made the CPU tests ~10x slower.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_map_kernel(
    offs_ptr, tile_expert_ptr, tile_start_ptr, E, NUM_TILES,
    BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr,
):
    """For every M-tile id < NUM_TILES: its expert (E when no tile has that id) and first sorted row.

    One program per CHUNK tile ids (each recomputes the E-long prefix sum: cheap, and no
    second pass). Expert e owns ``cdiv(count_e, BLOCK_M)`` consecutive tile ids; the owner of
    tile id ``i`` is the number of experts whose tiles all come before ``i``.
    """
    e = tl.arange(0, E_POW2)
    emask = e < E
    start = tl.load(offs_ptr + e, mask=emask, other=0).to(tl.int32)
    end = tl.load(offs_ptr + e + 1, mask=emask, other=0).to(tl.int32)
    tiles = (end - start + BLOCK_M - 1) // BLOCK_M
    cum = tl.cumsum(tiles, 0)  # inclusive: tiles of experts 0..e
    first = cum - tiles
    ids = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    expert = tl.sum((cum[None, :] <= ids[:, None]).to(tl.int32), axis=1)
    sel = e[None, :] == expert[:, None]
    first_tile = tl.sum(tl.where(sel, first[None, :], 0), axis=1)
    row_start = tl.sum(tl.where(sel, start[None, :], 0), axis=1) + (ids - first_tile) * BLOCK_M
    tl.store(tile_expert_ptr + ids, expert, mask=ids < NUM_TILES)
    tl.store(tile_start_ptr + ids, row_start, mask=ids < NUM_TILES)


@triton.jit
def _m_tile(tile_expert_ptr, tile_start_ptr, offs_ptr, E, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's place in an M-grouped GEMM (programs ordered N-tile fastest): its N-tile,
    the number of N-tiles, its expert (``>= E``: no work, the kernel returns), its first sorted row,
    its ``BLOCK_M`` sorted rows and which of them are the expert's."""
    pid = tl.program_id(0)
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    pid_m = pid // num_n
    expert = tl.load(tile_expert_ptr + pid_m)
    row_start = tl.load(tile_start_ptr + pid_m)
    row_end = tl.load(offs_ptr + expert + 1, mask=expert < E, other=0).to(tl.int32)
    rows = row_start + tl.arange(0, BLOCK_M)
    return pid % num_n, num_n, expert, row_start, rows, rows < row_end


@triton.jit
def _to_out(x, DT: tl.constexpr, UPCAST: tl.constexpr):
    """fp32 -> output dtype with round-to-nearest-even.

    The GPU casts round to nearest even; Triton's interpreter truncates fp32 -> bf16, a bias
    that made CPU results several times less accurate than GPU ones. Under the interpreter
    (UPCAST) we round the fp32 bits first, so the cast after it is exact.
    """
    if UPCAST:
        if DT == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
    return x.to(DT)


@triton.jit
def gate_up_fwd_kernel(
    x_ptr, perm_ptr, rw_ptr, w_ptr, offs_ptr, tile_expert_ptr, tile_start_ptr, gu_ptr, hw_ptr,
    E, INTER, H,
    stride_xt, stride_xh, stride_we, stride_wn, stride_wh,
    TOPK: tl.constexpr, SAVE_GU: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """hw[row] = w_r * silu(g) * u with [g | u] = W_gate_up[e] @ x[token(r)]; optionally gu[row] = [g | u].

    The A rows are gathered from ``x`` through ``perm`` (no gathered copy). One program owns
    BLOCK_N columns of both g and u (two accumulators), so the SiLU·up epilogue is local.
    """
    pid_n, num_n, expert, row_start, rows, rmask = _m_tile(tile_expert_ptr, tile_start_ptr, offs_ptr, E, INTER,
                                                           BLOCK_M, BLOCK_N)
    if expert >= E:
        return
    # rows past the expert's end read route 0: valid memory, never stored
    route = tl.load(perm_ptr + rows, mask=rmask, other=0)
    tok = (route // TOPK).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < INTER
    a_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :] * stride_xh
    bg_ptrs = w_ptr + expert.to(tl.int64) * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wh
    bu_ptrs = bg_ptrs + INTER * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            if EVEN_N:
                bg = tl.load(bg_ptrs)
                bu = tl.load(bu_ptrs)
            else:
                bg = tl.load(bg_ptrs, mask=nmask[None, :], other=0.0)
                bu = tl.load(bu_ptrs, mask=nmask[None, :], other=0.0)
        else:
            kmask = offs_k < H - k0
            a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
            bg = tl.load(bg_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
            bu = tl.load(bu_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
        if UPCAST:
            acc_g = tl.dot(a.to(tl.float32), bg.to(tl.float32), acc_g, input_precision="ieee")
        else:
            acc_g = tl.dot(a, bg, acc_g, input_precision=PREC)
        if UPCAST:
            acc_u = tl.dot(a.to(tl.float32), bu.to(tl.float32), acc_u, input_precision="ieee")
        else:
            acc_u = tl.dot(a, bu, acc_u, input_precision=PREC)
        a_ptrs += BLOCK_K * stride_xh
        bg_ptrs += BLOCK_K * stride_wh
        bu_ptrs += BLOCK_K * stride_wh
    rw = tl.load(rw_ptr + route, mask=rmask, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-acc_g))
    hw = acc_g * sig * acc_u * rw[:, None]
    rows64 = rows.to(tl.int64)
    smask = rmask[:, None] & nmask[None, :]
    out_dtype = hw_ptr.dtype.element_ty
    if SAVE_GU:
        gu_ptrs = gu_ptr + rows64[:, None] * (2 * INTER) + offs_n[None, :]
        tl.store(gu_ptrs, _to_out(acc_g, out_dtype, UPCAST), mask=smask)
        tl.store(gu_ptrs + INTER, _to_out(acc_u, out_dtype, UPCAST), mask=smask)
    tl.store(hw_ptr + rows64[:, None] * INTER + offs_n[None, :], _to_out(hw, out_dtype, UPCAST), mask=smask)


@triton.jit
def grouped_scatter_kernel(
    a_ptr, perm_ptr, w_ptr, offs_ptr, tile_expert_ptr, tile_start_ptr, out_ptr,
    E, N, KD,
    stride_am, stride_ak, stride_we, stride_wk, stride_wn, stride_om, stride_on,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[perm[row]] = A[row] @ B_e with B_e[k, n] = w[e, k*stride_wk + n*stride_wn]; A in sorted rows.

    Forward down projection (A = w·h, B = down_proj[e]^T) and backward dx (A = d[g|u],
    B = gate_up_proj[e]). Each sorted row is written once, to its route's slot: no atomics.
    """
    pid_n, num_n, expert, row_start, rows, rmask = _m_tile(tile_expert_ptr, tile_start_ptr, offs_ptr, E, N,
                                                           BLOCK_M, BLOCK_N)
    if expert >= E:
        return
    # rows past the expert's end re-read the tile's first row: valid memory, never stored
    safe_rows = tl.where(rmask, rows, row_start).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    a_ptrs = a_ptr + safe_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = w_ptr + expert.to(tl.int64) * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KD, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            if EVEN_N:
                b = tl.load(b_ptrs)
            else:
                b = tl.load(b_ptrs, mask=nmask[None, :], other=0.0)
        else:
            kmask = offs_k < KD - k0
            a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
        if UPCAST:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc, input_precision=PREC)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_wk
    dest = tl.load(perm_ptr + rows, mask=rmask, other=0).to(tl.int64)
    out_ptrs = out_ptr + dest[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, _to_out(acc, out_ptr.dtype.element_ty, UPCAST), mask=rmask[:, None] & nmask[None, :])


@triton.jit
def _dh_epilogue(acc, rows, rmask, route, offs_n, nmask, rw_ptr, gu_ptr, dgu_ptr, dwp_ptr, hw_ptr, INTER, num_n,
                 pid_n, STORE_HW: tl.constexpr, UPCAST: tl.constexpr):
    """The SiLU·up backward of one ``dhu`` tile ``acc`` (see ``dh_bwd_kernel``): ``dwp[route, pid_n]``
    and ``dgu[row] = [dg | du]``; with ``STORE_HW`` also the forward's ``hw[row] = w_r * silu(g) * u``
    recomputed from the saved ``g`` and ``u`` (``d down_proj``'s operand, so the forward need not keep
    it). Called once per program, after the main loop."""
    rows64 = rows.to(tl.int64)
    smask = rmask[:, None] & nmask[None, :]
    gu_ptrs = gu_ptr + rows64[:, None] * (2 * INTER) + offs_n[None, :]
    # ordered so that few [BLOCK_M, BLOCK_N] fp32 temporaries are live at once (an sm90 compile
    # of the straightforward order spilled); masked entries have g = u = 0 and add nothing
    g = tl.load(gu_ptrs, mask=smask, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-g))
    sacc = acc * sig
    rw = tl.load(rw_ptr + route, mask=rmask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptrs + INTER, mask=smask, other=0.0).to(tl.float32)
    hacc = sacc * g  # silu(g) * dhu
    dwp = tl.sum(hacc * u, axis=1)  # this tile's share of <silu(g)*u, dhu> = <y_r, grad_out_t>
    tl.store(dwp_ptr + route.to(tl.int64) * num_n + pid_n, dwp, mask=rmask)
    du = hacc * rw[:, None]  # w_r * dhu * silu(g)
    dg = sacc * rw[:, None] * u * (1.0 + g * (1.0 - sig))  # w_r * dhu * u * silu'(g)
    out_dtype = dgu_ptr.dtype.element_ty
    dgu_ptrs = dgu_ptr + rows64[:, None] * (2 * INTER) + offs_n[None, :]
    tl.store(dgu_ptrs, _to_out(dg, out_dtype, UPCAST), mask=smask)
    tl.store(dgu_ptrs + INTER, _to_out(du, out_dtype, UPCAST), mask=smask)
    if STORE_HW:
        hw = g * sig * u * rw[:, None]
        tl.store(hw_ptr + rows64[:, None] * INTER + offs_n[None, :], _to_out(hw, out_dtype, UPCAST), mask=smask)


@triton.jit
def dh_bwd_kernel(
    go_ptr, perm_ptr, rw_ptr, wd_ptr, offs_ptr, tile_expert_ptr, tile_start_ptr, gu_ptr, dgu_ptr, dwp_ptr, hw_ptr,
    E, INTER, H,
    stride_gt, stride_gh, stride_we, stride_wh, stride_wi,
    TOPK: tl.constexpr, STORE_HW: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Backward through down_proj and the SiLU·up gate, one tile of [sorted rows, I columns].

    ``dhu = grad_out[token(r)] @ down_proj[e]`` (A gathered by token), then in the epilogue:
    ``d_w partial = sum_cols(silu(g)*u * dhu)`` (this program's share of ``<y_r, grad_out_t>``,
    written to ``dwp[r, pid_n]``), ``dh = w_r * dhu``, ``dg = dh*u*silu'(g)``, ``du = dh*silu(g)``
    stored as ``dgu[row] = [dg | du]``; with ``STORE_HW``, ``hw[row] = w_r * silu(g) * u`` too.
    """
    pid_n, num_n, expert, row_start, rows, rmask = _m_tile(tile_expert_ptr, tile_start_ptr, offs_ptr, E, INTER,
                                                           BLOCK_M, BLOCK_N)
    if expert >= E:
        return
    route = tl.load(perm_ptr + rows, mask=rmask, other=0)
    tok = (route // TOPK).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < INTER
    a_ptrs = go_ptr + tok[:, None] * stride_gt + offs_k[None, :] * stride_gh
    b_ptrs = wd_ptr + expert.to(tl.int64) * stride_we + offs_k[:, None] * stride_wh + offs_n[None, :] * stride_wi
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            if EVEN_N:
                b = tl.load(b_ptrs)
            else:
                b = tl.load(b_ptrs, mask=nmask[None, :], other=0.0)
        else:
            kmask = offs_k < H - k0
            a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
        if UPCAST:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc, input_precision=PREC)
        a_ptrs += BLOCK_K * stride_gh
        b_ptrs += BLOCK_K * stride_wh
    _dh_epilogue(acc, rows, rmask, route, offs_n, nmask, rw_ptr, gu_ptr, dgu_ptr, dwp_ptr, hw_ptr, INTER, num_n, pid_n,
                 STORE_HW, UPCAST)


@triton.jit
def dh_tma_kernel(
    a_desc, b_desc, perm_ptr, rw_ptr, offs_ptr, tile_expert_ptr, tile_start_ptr, gu_ptr, dgu_ptr, dwp_ptr, hw_ptr,
    E, INTER, H, STORE_HW: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """``dh_bwd_kernel`` with TMA loads: A = ``grad_out`` rows already gathered into sorted-row
    order ``[TK, H]``, B = ``down_proj`` as ``[E*H, I]`` (H a multiple of BLOCK_K, so a block never
    reaches into the next expert). Rows of a tile past its expert's end compute values the
    epilogue's masks never store; the epilogue is ``dh_bwd_kernel``'s."""
    pid_n, num_n, expert, row_start, rows, rmask = _m_tile(tile_expert_ptr, tile_start_ptr, offs_ptr, E, INTER,
                                                           BLOCK_M, BLOCK_N)
    if expert >= E:
        return
    route = tl.load(perm_ptr + rows, mask=rmask, other=0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < INTER
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    b_row = expert * H
    for k0 in range(0, H, BLOCK_K):
        a = a_desc.load([row_start, k0])
        b = b_desc.load([b_row + k0, pid_n * BLOCK_N])
        if UPCAST:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    _dh_epilogue(acc, rows, rmask, route, offs_n, nmask, rw_ptr, gu_ptr, dgu_ptr, dwp_ptr, hw_ptr, INTER, num_n, pid_n,
                 STORE_HW, UPCAST)


@triton.jit
def wgrad_kernel(
    a_ptr, b_ptr, perm_ptr, offs_ptr, out_ptr,
    M, N,
    stride_ar, stride_am, stride_br, stride_bn, stride_oe, stride_om, stride_on,
    TOPK: tl.constexpr, A_GATHER: tl.constexpr, B_GATHER: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Weight gradient of one expert tile: ``out[e, m, n] = sum_{rows of e} A[row, m] * B[row, n]``.

    The reduction runs over the expert's sorted rows; ``A_GATHER``/``B_GATHER`` read that
    operand's row ``token(perm[row])`` instead of ``row``. Programs: (expert, M-tile, N-tile),
    N fastest; an expert with no rows writes zeros.
    """
    pid = tl.program_id(0)
    num_m = (M + BLOCK_M - 1) // BLOCK_M
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    per_e = num_m * num_n
    expert = pid // per_e
    rem = pid % per_e
    pid_m = rem // num_n
    pid_n = rem % num_n
    start = tl.load(offs_ptr + expert).to(tl.int32)
    end = tl.load(offs_ptr + expert + 1).to(tl.int32)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    offs_r = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(start, end, BLOCK_K):
        rows = r0 + offs_r
        rmask = rows < end
        if A_GATHER or B_GATHER:
            route = tl.load(perm_ptr + rows, mask=rmask, other=0)
            tok = (route // TOPK).to(tl.int64)
        safe_rows = tl.where(rmask, rows, start).to(tl.int64)
        if A_GATHER:
            a_rows = tok
        else:
            a_rows = safe_rows
        if B_GATHER:
            b_rows = tok
        else:
            b_rows = safe_rows
        a_ptrs = a_ptr + a_rows[None, :] * stride_ar + offs_m[:, None] * stride_am
        b_ptrs = b_ptr + b_rows[:, None] * stride_br + offs_n[None, :] * stride_bn
        # rows past the expert's end must contribute exactly zero: mask both operands
        if EVEN_M:
            a = tl.load(a_ptrs, mask=rmask[None, :], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=rmask[None, :] & mmask[:, None], other=0.0)
        if EVEN_N:
            b = tl.load(b_ptrs, mask=rmask[:, None], other=0.0)
        else:
            b = tl.load(b_ptrs, mask=rmask[:, None] & nmask[None, :], other=0.0)
        if UPCAST:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc, input_precision=PREC)
    out_ptrs = (
        out_ptr + expert.to(tl.int64) * stride_oe + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on
    )
    tl.store(out_ptrs, _to_out(acc, out_ptr.dtype.element_ty, UPCAST), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def wgrad_tma_kernel(
    a_desc, b_desc, offs_ptr, out_ptr, M, N, stride_oe, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):
    """``wgrad_kernel`` on operands already in sorted-row order, read through Hopper's TMA:
    ``out[e] = A[rows of e]^T @ B[rows of e]``, A ``[R, M]`` and B ``[R, N]`` tensor descriptors of
    blocks ``[BLOCK_K, BLOCK_M]`` and ``[BLOCK_K, BLOCK_N]``. TMA cannot gather, so a gathered
    operand is copied into row order first (:func:`.moe._wgrad`). Whole blocks of rows go from
    shared memory straight into the MMA; the expert's last, partial block is loaded whole (its
    tail rows belong to the next expert, or lie past the end, where TMA fills zeros) and those
    rows zeroed in registers. Programs: (expert, M-tile, N-tile), N fastest; an expert with no
    rows writes zeros."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    expert = pid // (num_m * num_n)
    rem = pid % (num_m * num_n)
    m0 = (rem // num_n) * BLOCK_M
    n0 = (rem % num_n) * BLOCK_N
    start = tl.load(offs_ptr + expert).to(tl.int32)
    end = tl.load(offs_ptr + expert + 1).to(tl.int32)
    full_end = start + (end - start) // BLOCK_K * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(start, full_end, BLOCK_K):  # whole blocks: straight from shared memory into the MMA
        a = a_desc.load([r0, m0])
        b = b_desc.load([r0, n0])
        if UPCAST:
            acc = tl.dot(a.to(tl.float32).T, b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a.T, b, acc)
    if full_end < end:  # the partial block: rows past the expert's end belong to the next one
        keep = (full_end + tl.arange(0, BLOCK_K)) < end
        a = a_desc.load([full_end, m0])
        b = b_desc.load([full_end, n0])
        a = tl.where(keep[:, None], a, tl.zeros_like(a))
        b = tl.where(keep[:, None], b, tl.zeros_like(b))
        if UPCAST:
            acc = tl.dot(a.to(tl.float32).T, b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a.T, b, acc)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    ptrs = out_ptr + expert.to(tl.int64) * stride_oe + offs_m[:, None].to(tl.int64) * stride_om \
        + offs_n[None, :] * stride_on
    # the shipped kernels' cast: round to nearest even under the interpreter too (it truncates)
    tl.store(ptrs, _to_out(acc, out_ptr.dtype.element_ty, UPCAST), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def combine_kernel(
    y_ptr, idx_ptr, out_ptr,
    T, N, E,
    stride_ym, stride_ot,
    TOPK: tl.constexpr, UPCAST: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """out[t] = sum_k y[t*TOPK + k] over the routes whose expert is in [0, E), k in order, fp32."""
    pid_t = tl.program_id(0)
    pid_n = tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < T
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    t64 = t.to(tl.int64)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    for k in tl.static_range(TOPK):
        e = tl.load(idx_ptr + t64 * TOPK + k, mask=tmask, other=-1)
        valid = tmask & (e >= 0) & (e < E)
        y = tl.load(
            y_ptr + (t64 * TOPK + k)[:, None] * stride_ym + n[None, :],
            mask=valid[:, None] & nmask[None, :],
            other=0.0,
        )
        acc += y.to(tl.float32)
    tl.store(out_ptr + t64[:, None] * stride_ot + n[None, :], _to_out(acc, out_ptr.dtype.element_ty, UPCAST),
             mask=tmask[:, None] & nmask[None, :])
