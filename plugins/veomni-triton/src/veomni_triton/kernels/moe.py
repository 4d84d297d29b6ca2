"""MoE routed experts (transformers v5 layout, SiLU-gated) as Triton grouped GEMMs.

Kernel contract (``veomni_ops.hookspecs.OpHookspecs.moe_experts``)::

    kernel(hidden_states [T, H], top_k_index [T, K], top_k_weights [T, K],
           gate_up_proj [E, 2I, H], down_proj [E, H, I]) -> [T, H]

    out_t = sum_k w_tk * down_proj[e] @ (silu(g) * u),  [g | u] = gate_up_proj[e] @ x_t,  e = top_k_index[t, k]

Forward (3 Triton launches after a device-side sort; nothing reads device memory on the host):

1. route: a stable ``torch.sort`` of the ``T*K`` expert indices gives ``perm`` (routes in
   expert order); ``searchsorted`` over ``0..E`` gives each expert's row range ``offs``.
2. ``gate_up_fwd_kernel``: grouped GEMM whose A rows are *gathered* from ``hidden`` through
   ``perm`` (no gathered copy), two accumulators (g and u columns of one tile), epilogue
   ``hw = w_r * silu(g) * u`` (the route weight folded in here, so that the down GEMM's
   output only needs summing); ``[g | u]`` is kept for backward when a gradient is needed,
   ``hw`` is not (backward recomputes it, below): ``T*K*I`` elements less held per layer.
3. ``grouped_scatter_kernel``: ``y_r = down_proj[e] @ hw_r``, each row written once to its
   route's slot of a ``[T*K, H]`` buffer.
4. ``combine_kernel``: ``out_t = sum_k y_{t,k}`` in fp32, k in order: deterministic, no atomics.

Backward (4 GEMM launches + 1 combine):

* ``dh_bwd_kernel``: ``dhu = grad_out[token] @ down_proj[e]`` (gathered), epilogue gives
  ``d top_k_weights`` partial dot products ``<silu(g)*u, dhu>`` (per N-tile, summed after in a
  fixed order), ``d[g|u]`` through the SiLU derivative, and (when ``down_proj`` needs a
  gradient) ``hw`` again from the saved ``[g | u]``, as eager computes it from its bf16 ``g``, ``u``.
* ``wgrad_kernel`` twice: ``d down_proj[e] = sum_r grad_out[token]^T hw_r`` and
  ``d gate_up_proj[e] = sum_r d[g|u]_r^T x[token]``, one program per (expert, tile), looping over
  the expert's rows (an expert without tokens gets zeros).
* ``grouped_scatter_kernel`` + ``combine_kernel``: ``dx_r = d[g|u]_r @ gate_up_proj[e]`` per
  route, then summed over k per token.

Every tensor that crosses the Python boundary goes through ``torch.library`` custom ops
(``veomni_triton::moe_experts_fwd`` / ``_bwd``) with fake implementations and a registered
autograd formula, so ``torch.compile(fullgraph=True)`` traces through without a graph break.

Expert indices ``-1`` and ``E`` (the expert-parallel sentinels of the contract) are skipped:
such a route contributes nothing and gets zero gradient. Any other index outside ``[0, E)`` is
refused by the core's :func:`~veomni_ops.kernels.moe.check_expert_index`: a ``ValueError``
naming the index and E on CPU tensors (the interpreter) or with ``VEOMNI_OPS_CHECK_VALUES=1``;
otherwise a device-side assertion (``torch._assert_async``: one tiny reduction, no host
synchronisation, also under ``torch.compile``). The kernels themselves would skip it like a
sentinel (never read out of bounds).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
import triton

from ._common import CHECKS, check_device, interpreter_active
from .launch import as_rows, launch_device, next_pow2
from .moe_kernels import (
    combine_kernel,
    dh_bwd_kernel,
    dh_tma_kernel,
    gate_up_fwd_kernel,
    grouped_scatter_kernel,
    tile_map_kernel,
    wgrad_kernel,
    wgrad_tma_kernel,
)

_OP = "moe_experts"


# ---------------------------------------------------------------- launch configuration
@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch parameters of one grouped GEMM kernel."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    #: weight gradients and dh: copy a gathered operand into sorted-row order once and read the
    #: operands through Hopper's TMA (``wgrad_tma_kernel``, ``dh_tma_kernel``); only for 16-bit
    #: operands whose rows are whole 16-byte units (see ``_tma_rows``, ``_dh_tma_ok``), else the
    #: gathering kernel runs
    tma: bool = False


#: Configurations at training shapes (hundreds of rows per expert). sm90: the fastest of a
#: per-kernel sweep on an H100 at Qwen3-30B-A3B's expert shapes, T=8192, top-8
#: (benchmarks/results/h100-2026-11-25-moe: 8-warp 128x(2*128) gate_up tiles, 4 stages for the
#: wide down/dx tiles, 32-row reduction steps and 5 stages for the weight gradients;
#: fwd+bwd 5.95 -> 5.30 ms, moe_prof's final.json; 5.35 ms beside grouped_mm's 7.03 in one run,
#: h100-2026-11-25-quack-moe); sm80: offline compiles (no register spills, software pipelining on),
#: not measured yet.
#: ``gate_up`` holds two accumulators (g and u), i.e. a 128x(2*block_n) output tile;
#: ``wgrad``'s block_k is the number of token rows reduced per step.
_TABLE_SM90: dict[str, GemmConfig] = {
    "gate_up": GemmConfig(128, 128, 64, 8, 4),
    "down": GemmConfig(128, 256, 64, 8, 4),
    "dh": GemmConfig(128, 128, 64, 8, 4),
    "dx": GemmConfig(128, 256, 64, 8, 4),
    "wgrad": GemmConfig(128, 128, 32, 4, 5),
}
#: Ampere/Ada: mma.sync keeps the accumulators in registers, so smaller tiles.
_TABLE_SM80: dict[str, GemmConfig] = {
    "gate_up": GemmConfig(128, 64, 32, 8, 3),
    "down": GemmConfig(128, 128, 32, 8, 3),
    "dh": GemmConfig(128, 64, 32, 8, 3),
    "dx": GemmConfig(128, 128, 32, 8, 3),
    "wgrad": GemmConfig(128, 128, 32, 8, 3),
}
#: fp32 operands: IEEE fp32 dots run on FMA units (no tensor cores), whose accumulators
#: live in registers; larger tiles spill heavily (seen in sm90 compiles). Correct, not fast.
_FP32_CONFIG = GemmConfig(64, 64, 32, 4, 3)
_TABLE = _TABLE_SM90

#: Small tiles for Triton's CPU interpreter: several tiles per expert even at test shapes,
#: and uneven edges at the odd sizes the tests use.
_INTERPRET_TABLE: dict[str, GemmConfig] = {k: GemmConfig(32, 64, 32, 4, 1) for k in _TABLE}

#: The two weight-gradient GEMMs (``d down_proj``: I columns, ``d gate_up_proj``: 2I rows) may
#: have their own entries; without one they use ``wgrad``.
_WGRAD_KINDS = ("wgrad_down", "wgrad_gate_up")
KINDS = (*_TABLE, *_WGRAD_KINDS)

_OVERRIDE: dict[str, GemmConfig] = {}


@contextlib.contextmanager
def override_configs(**configs: GemmConfig) -> Iterator[None]:
    """Use the given :class:`GemmConfig` per kernel (``gate_up``, ``down``, ``dh``, ``dx``,
    ``wgrad`` for both weight gradients, or ``wgrad_down`` / ``wgrad_gate_up`` for one).

    For benchmarks (config sweeps) and tests; not thread-safe.
    """
    unknown = set(configs) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown moe kernel(s) {sorted(unknown)}; known: {sorted(_TABLE)}")
    saved = dict(_OVERRIDE)
    _OVERRIDE.update(configs)
    try:
        yield
    finally:
        _OVERRIDE.clear()
        _OVERRIDE.update(saved)


@functools.cache
def _max_shared_mem(index: int) -> int:
    props = triton.runtime.driver.active.utils.get_device_properties(index)
    return int(props["max_shared_mem"])


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _smem_bytes(kind: str, cfg: GemmConfig, elt: int) -> int:
    b_tiles = 2 if kind == "gate_up" else 1
    return cfg.num_stages * (cfg.block_m * cfg.block_k + b_tiles * cfg.block_k * cfg.block_n) * elt


def _config(kind: str, device: torch.device, dtype: torch.dtype, rows_per_expert: float) -> GemmConfig:
    if kind in _OVERRIDE:
        return _OVERRIDE[kind]
    if kind in _WGRAD_KINDS and "wgrad" in _OVERRIDE:
        return _OVERRIDE["wgrad"]
    if device.type != "cuda" or interpreter_active():
        return _INTERPRET_TABLE.get(kind, _INTERPRET_TABLE["wgrad"])
    index = device.index if device.index is not None else torch.cuda.current_device()
    if dtype == torch.float32:
        cfg = _FP32_CONFIG
    else:
        table = _TABLE_SM90 if _capability(index) >= (9, 0) else _TABLE_SM80
        cfg = table.get(kind) or table["wgrad"]
    if kind in _WGRAD_KINDS:
        kind = "wgrad"
    if rows_per_expert < 96:
        # few tokens per expert (small batch, many experts): half-height tiles waste less
        if kind == "wgrad" and cfg.block_k > 32:
            cfg = replace(cfg, block_k=32)
        elif kind != "wgrad" and cfg.block_m > 64:
            cfg = replace(cfg, block_m=64)
    # fit the software pipeline into this GPU's shared memory (sm86/89 have ~100 KiB,
    # fp32 operands take twice the room): fewer stages first, then thinner K steps
    elt = dtype.itemsize
    budget = _max_shared_mem(index) - 8192
    while _smem_bytes(kind, cfg, elt) > budget:
        if cfg.num_stages > 2:
            cfg = replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.block_k > 32:
            cfg = replace(cfg, block_k=cfg.block_k // 2)
        elif cfg.block_n > 32:
            cfg = replace(cfg, block_n=cfg.block_n // 2)
        else:
            break
    return cfg


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 operands follow PyTorch's matmul setting: IEEE fp32 unless the user allowed TF32.
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"


def _e_pow2(num_experts: int) -> int:
    return max(16, next_pow2(num_experts))


def _m_tiles_bound(tk: int, num_experts: int, block_m: int) -> int:
    # sum_e cdiv(count_e, BM) <= cdiv(TK, BM) + (number of non-empty experts): known on the host
    return triton.cdiv(tk, block_m) + min(num_experts, tk)


def _route(flat_idx: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Routes sorted by expert (stable) and each expert's [offs[e], offs[e+1]) range, on the device."""
    sorted_e, perm = torch.sort(flat_idx, stable=True)
    bounds = torch.arange(num_experts + 1, device=flat_idx.device, dtype=flat_idx.dtype)
    offs = torch.searchsorted(sorted_e, bounds)
    return perm, offs


class _Tiles:
    """Per-BLOCK_M tile maps of one routing, built on first use (one tiny launch each)."""

    def __init__(self, offs: torch.Tensor, tk: int, num_experts: int) -> None:
        self.offs, self.tk, self.num_experts = offs, tk, num_experts
        self._maps: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}

    def get(self, block_m: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        if block_m not in self._maps:
            n = _m_tiles_bound(self.tk, self.num_experts, block_m)
            tile_expert = torch.empty((n,), device=self.offs.device, dtype=torch.int32)
            tile_start = torch.empty((n,), device=self.offs.device, dtype=torch.int32)
            chunk = min(64, next_pow2(n))
            tile_map_kernel[(triton.cdiv(n, chunk),)](
                self.offs, tile_expert, tile_start, self.num_experts, n,
                BLOCK_M=block_m, E_POW2=_e_pow2(self.num_experts), CHUNK=chunk, num_warps=4,
            )
            self._maps[block_m] = (tile_expert, tile_start, n)
        return self._maps[block_m]


def _combine(y: torch.Tensor, idx: torch.Tensor, out: torch.Tensor, num_experts: int) -> None:
    t, k = idx.shape
    n = out.shape[1]
    block_n = min(1024, next_pow2(n))
    block_t = max(1, 4096 // block_n)
    grid = (triton.cdiv(t, block_t), triton.cdiv(n, block_n))
    combine_kernel[grid](
        y, idx, out, t, n, num_experts, y.stride(0), out.stride(0),
        TOPK=k, UPCAST=interpreter_active(), BLOCK_T=block_t, BLOCK_N=block_n, num_warps=4,
    )


def _grouped_scatter(
    a: torch.Tensor, perm: torch.Tensor, tiles: _Tiles, w: torch.Tensor, out: torch.Tensor,
    n: int, kd: int, stride_wk: int, stride_wn: int, cfg: GemmConfig,
) -> None:
    num_experts = tiles.num_experts
    tile_expert, tile_start, m_tiles = tiles.get(cfg.block_m)
    grid = (m_tiles * triton.cdiv(n, cfg.block_n),)
    grouped_scatter_kernel[grid](
        a, perm, w, tiles.offs, tile_expert, tile_start, out, num_experts, n, kd,
        a.stride(0), a.stride(1), w.stride(0), stride_wk, stride_wn, out.stride(0), out.stride(1),
        EVEN_K=kd % cfg.block_k == 0, EVEN_N=n % cfg.block_n == 0,
        PREC=_dot_precision(a.dtype), UPCAST=interpreter_active(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def _gate_up(
    hidden: torch.Tensor, perm: torch.Tensor, weights: torch.Tensor, gate_up_proj: torch.Tensor, tiles: _Tiles,
    gu: torch.Tensor, hw: torch.Tensor, topk: int, save: bool, cfg: GemmConfig,
) -> None:
    """hw[row] = w * silu(g) * u with [g | u] = gate_up_proj[e] @ x[token]; gu[row] = [g | u] when ``save``."""
    num_experts, two_i, h = gate_up_proj.shape
    inter = two_i // 2
    tile_expert, tile_start, m_tiles = tiles.get(cfg.block_m)
    grid = (m_tiles * triton.cdiv(inter, cfg.block_n),)
    gate_up_fwd_kernel[grid](
        hidden, perm, weights, gate_up_proj, tiles.offs, tile_expert, tile_start, gu, hw,
        num_experts, inter, h,
        hidden.stride(0), hidden.stride(1),
        gate_up_proj.stride(0), gate_up_proj.stride(1), gate_up_proj.stride(2),
        TOPK=topk, SAVE_GU=save, EVEN_K=h % cfg.block_k == 0, EVEN_N=inter % cfg.block_n == 0,
        PREC=_dot_precision(hidden.dtype), UPCAST=interpreter_active(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def _dh(
    go: torch.Tensor, perm: torch.Tensor, weights: torch.Tensor, down_proj: torch.Tensor, tiles: _Tiles,
    gu: torch.Tensor, dgu: torch.Tensor, dwp: torch.Tensor, topk: int, cfg: GemmConfig,
    hw: torch.Tensor | None = None, go_rows: torch.Tensor | None = None,
) -> None:
    """dgu[row] = d[g | u] and dwp[route, n-tile] partials of d top_k_weights (see ``dh_bwd_kernel``);
    ``hw[row] = w_r * silu(g) * u`` too when ``hw`` is given. With ``go_rows`` (``grad_out``
    already gathered into sorted-row order, see :func:`_dh_tma_ok`) the TMA kernel runs."""
    num_experts, h, inter = down_proj.shape
    num_n = triton.cdiv(inter, cfg.block_n)
    tile_expert, tile_start, m_tiles = tiles.get(cfg.block_m)
    if go_rows is not None:
        from triton.tools.tensor_descriptor import TensorDescriptor

        dh_tma_kernel[(m_tiles * num_n,)](
            TensorDescriptor.from_tensor(go_rows, [cfg.block_m, cfg.block_k]),
            TensorDescriptor.from_tensor(down_proj.view(num_experts * h, inter), [cfg.block_k, cfg.block_n]),
            perm, weights, tiles.offs, tile_expert, tile_start, gu, dgu, dwp, dgu if hw is None else hw,
            num_experts, inter, h, STORE_HW=hw is not None, UPCAST=interpreter_active(),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return
    dh_bwd_kernel[(m_tiles * num_n,)](
        go, perm, weights, down_proj, tiles.offs, tile_expert, tile_start, gu, dgu, dwp,
        dgu if hw is None else hw, num_experts, inter, h,
        go.stride(0), go.stride(1), down_proj.stride(0), down_proj.stride(1), down_proj.stride(2),
        TOPK=topk, STORE_HW=hw is not None, EVEN_K=h % cfg.block_k == 0, EVEN_N=inter % cfg.block_n == 0,
        PREC=_dot_precision(go.dtype), UPCAST=interpreter_active(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def _tma_rows(t: torch.Tensor) -> bool:
    """Whether TMA can read ``t`` as a row-major 2-D operand: 16-bit, unit last stride, rows of
    whole 16-byte units on a 16-byte aligned base (the tensor-descriptor rules)."""
    return (t.dtype in (torch.bfloat16, torch.float16) and t.dim() == 2 and t.stride(1) == 1
            and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0)


def _dh_tma_ok(go: torch.Tensor, down_proj: torch.Tensor, cfg: GemmConfig) -> bool:
    """Whether the dh GEMM can take its TMA kernel: ``cfg.tma``, 16-bit rows TMA can read, and
    ``down_proj`` one contiguous ``[E*H, I]`` whose H is whole K-blocks (no block spans two experts)."""
    num_experts, h, inter = down_proj.shape
    return (cfg.tma and _tma_rows(go) and down_proj.is_contiguous() and h % cfg.block_k == 0
            and _tma_rows(down_proj.view(num_experts * h, inter)))


def _wgrad(
    a: torch.Tensor, a_gather: bool, b: torch.Tensor, b_gather: bool, perm: torch.Tensor, offs: torch.Tensor,
    out: torch.Tensor, topk: int, cfg: GemmConfig,
) -> None:
    """out[e] = A_e^T @ B_e over the rows of expert e (A: [rows, M], B: [rows, N])."""
    num_experts, m, n = out.shape
    grid = (num_experts * triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    if cfg.tma and _tma_rows(a) and _tma_rows(b):
        from triton.tools.tensor_descriptor import TensorDescriptor

        a_rows, b_rows = a, b
        if a_gather or b_gather:  # TMA cannot gather: the gathered operand copied into row order
            tokens = perm // topk
            a_rows = a.index_select(0, tokens) if a_gather else a
            b_rows = b.index_select(0, tokens) if b_gather else b
        wgrad_tma_kernel[grid](
            TensorDescriptor.from_tensor(a_rows, [cfg.block_k, cfg.block_m]),
            TensorDescriptor.from_tensor(b_rows, [cfg.block_k, cfg.block_n]),
            offs, out, m, n, out.stride(0), out.stride(1), out.stride(2), UPCAST=interpreter_active(),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return
    wgrad_kernel[grid](
        a, b, perm, offs, out, m, n,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1), out.stride(2),
        TOPK=topk, A_GATHER=a_gather, B_GATHER=b_gather,
        EVEN_M=m % cfg.block_m == 0, EVEN_N=n % cfg.block_n == 0,
        PREC=_dot_precision(a.dtype), UPCAST=interpreter_active(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


# ---------------------------------------------------------------- custom ops
@torch.library.custom_op("veomni_triton::moe_experts_fwd", mutates_args=())
def _moe_fwd(
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    save: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    t, h = hidden.shape
    k = top_k_index.shape[1]
    num_experts, two_i, _ = gate_up_proj.shape
    inter = two_i // 2
    tk = t * k
    dev, dt = hidden.device, hidden.dtype
    out = torch.empty((t, h), device=dev, dtype=dt)
    gu = torch.empty((tk, two_i) if save else (0,), device=dev, dtype=dt)
    if tk == 0 or num_experts == 0:
        out.zero_()
        return (out, gu, torch.empty((tk,), device=dev, dtype=torch.int64),
                torch.zeros((num_experts + 1,), device=dev, dtype=torch.int64))
    hw = torch.empty((tk, inter), device=dev, dtype=dt)  # the down GEMM's input; backward recomputes it
    with launch_device(hidden):
        perm, offs = _route(top_k_index.reshape(-1), num_experts)
        tiles = _Tiles(offs, tk, num_experts)
        rpe = tk / num_experts
        _gate_up(hidden, perm, top_k_weights, gate_up_proj, tiles, gu if save else hw, hw, k, save,
                 _config("gate_up", dev, dt, rpe))
        y = torch.empty((tk, h), device=dev, dtype=dt)
        # y_r = hw_r @ down_proj[e]^T: B[k=i, n=h] = down_proj[e, h, i]
        _grouped_scatter(
            hw, perm, tiles, down_proj, y, h, inter, down_proj.stride(2), down_proj.stride(1),
            _config("down", dev, dt, rpe),
        )
        _combine(y, top_k_index, out, num_experts)
    return out, gu, perm, offs


@_moe_fwd.register_fake
def _(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, save):
    t, h = hidden.shape
    tk = t * top_k_index.shape[1]
    num_experts, two_i, _ = gate_up_proj.shape
    return (
        hidden.new_empty((t, h)),
        hidden.new_empty((tk, two_i) if save else (0,)),
        hidden.new_empty((tk,), dtype=torch.int64),
        hidden.new_empty((num_experts + 1,), dtype=torch.int64),
    )


@torch.library.custom_op("veomni_triton::moe_experts_bwd", mutates_args=())
def _moe_bwd(
    grad_out: torch.Tensor,
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    gu: torch.Tensor,
    perm: torch.Tensor,
    offs: torch.Tensor,
    need_hidden: bool,
    need_weights: bool,
    need_gate_up: bool,
    need_down: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    t, h = hidden.shape
    k = top_k_index.shape[1]
    num_experts, two_i, _ = gate_up_proj.shape
    inter = two_i // 2
    tk = t * k
    dev, dt = hidden.device, hidden.dtype
    # Every element of these is written by a kernel below (the weight-gradient kernels write
    # zeros for experts without tokens), so no zero-fill pass. Outputs of a custom op must not
    # alias each other: one empty placeholder each for the gradients not asked for.
    dx = torch.empty((t, h) if need_hidden else (0,), device=dev, dtype=dt)
    dw = torch.empty((t, k), device=dev, dtype=top_k_weights.dtype) if need_weights else dx.new_empty((0,))
    dgu_w = torch.empty_like(gate_up_proj) if need_gate_up else dx.new_empty((0,))
    dd_w = torch.empty_like(down_proj) if need_down else dx.new_empty((0,))
    if tk == 0 or num_experts == 0:
        for g in (dx, dw, dgu_w, dd_w):
            g.zero_()
        return dx, dw, dgu_w, dd_w
    rpe = tk / num_experts
    go = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    with launch_device(hidden):
        tiles = _Tiles(offs, tk, num_experts)
        # the dh GEMM runs whenever any gradient is asked for: its epilogue also recomputes the
        # forward's hw (not kept) for d down_proj
        cfg = _config("dh", dev, dt, rpe)
        num_n = triton.cdiv(inter, cfg.block_n)
        dgu = torch.empty((tk, two_i), device=dev, dtype=dt)
        # one fp32 partial of <y_r, grad_out_t> per (route, N-tile); routes no expert owns stay 0
        dwp = torch.zeros((tk, num_n), device=dev, dtype=torch.float32)
        hw = torch.empty((tk, inter), device=dev, dtype=dt) if need_down else None
        # TMA cannot gather: grad_out's rows copied once into sorted-row order serve both dh and d down_proj
        go_rows = go.index_select(0, perm // k) if _dh_tma_ok(go, down_proj, cfg) else None
        _dh(go, perm, top_k_weights, down_proj, tiles, gu, dgu, dwp, k, cfg, hw=hw, go_rows=go_rows)
        if hw is not None:
            # d down_proj[e][h, i] = sum_r grad_out[token(r), h] * hw[r, i]
            _wgrad(go if go_rows is None else go_rows, go_rows is None, hw, False, perm, offs, dd_w, k,
                   _config("wgrad_down", dev, dt, rpe))
            del hw
        del go_rows
        if need_weights:
            dw = dwp.sum(dim=1).view(t, k).to(top_k_weights.dtype)
        if need_gate_up:
            # d gate_up_proj[e][j, h] = sum_r d[g|u][r, j] * x[token(r), h]
            _wgrad(dgu, False, hidden, True, perm, offs, dgu_w, k, _config("wgrad_gate_up", dev, dt, rpe))
        if need_hidden:
            dx_routes = torch.empty((tk, h), device=dev, dtype=dt)
            # dx_r = d[g|u]_r @ gate_up_proj[e]: B[k=j, n=h] = gate_up_proj[e, j, h]
            _grouped_scatter(
                dgu, perm, tiles, gate_up_proj, dx_routes, h, two_i,
                gate_up_proj.stride(1), gate_up_proj.stride(2), _config("dx", dev, dt, rpe),
            )
            _combine(dx_routes, top_k_index, dx, num_experts)
    return dx, dw, dgu_w, dd_w


@_moe_bwd.register_fake
def _(grad_out, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, gu, perm, offs,
      need_hidden, need_weights, need_gate_up, need_down):
    return (
        hidden.new_empty(hidden.shape) if need_hidden else hidden.new_empty((0,)),
        top_k_weights.new_empty(top_k_weights.shape) if need_weights else hidden.new_empty((0,)),
        gate_up_proj.new_empty(gate_up_proj.shape) if need_gate_up else hidden.new_empty((0,)),
        down_proj.new_empty(down_proj.shape) if need_down else hidden.new_empty((0,)),
    )


def _setup_context(ctx, inputs, output):
    hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, _save = inputs
    _out, gu, perm, offs = output
    ctx.save_for_backward(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, gu, perm, offs)
    # gu is a saved activation, never used by the caller: without this, autograd would fill
    # a zero gradient for each ([T*K, 3I] elements, ~0.09 ms at Qwen3-30B-A3B shapes) on every backward.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, _dgu, _dperm, _doffs):
    if grad_out is None:
        return None, None, None, None, None, None
    hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, gu, perm, offs = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, dgu_w, dd_w = _moe_bwd(
        grad_out, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, gu, perm, offs,
        need[0], need[2], need[3], need[4],
    )
    return (
        dx if need[0] else None,
        None,
        dw if need[2] else None,
        dgu_w if need[3] else None,
        dd_w if need[4] else None,
        None,
    )


_moe_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- public kernel
def moe_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """Routed SiLU-gated experts (see the module docstring); returns ``[T, H]`` in ``hidden_states.dtype``."""
    for name, t in (("hidden_states", hidden_states), ("top_k_index", top_k_index),
                    ("top_k_weights", top_k_weights), ("gate_up_proj", gate_up_proj), ("down_proj", down_proj)):
        CHECKS.check_tensor(t, name, _OP)
    check_device(_OP, hidden_states=hidden_states, top_k_index=top_k_index, top_k_weights=top_k_weights,
                 gate_up_proj=gate_up_proj, down_proj=down_proj)
    CHECKS.check_float(hidden_states, "hidden_states", _OP)
    CHECKS.check_float(top_k_weights, "top_k_weights", _OP)
    for name, w in (("gate_up_proj", gate_up_proj), ("down_proj", down_proj)):
        if w.dtype != hidden_states.dtype:
            raise TypeError(
                f"{_OP} (triton): {name} is {w.dtype} but hidden_states is {hidden_states.dtype}; the grouped "
                f"GEMMs take one operand dtype: cast the activations or the weights (e.g. {name}.to({hidden_states.dtype}))"
            )
    if top_k_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{_OP} (triton): top_k_index must be int64 or int32, got {top_k_index.dtype}")
    if gate_up_proj.dim() != 3 or down_proj.dim() != 3:
        raise ValueError(
            f"{_OP} (triton): gate_up_proj must be [E, 2I, H] and down_proj [E, H, I], got "
            f"{tuple(gate_up_proj.shape)} and {tuple(down_proj.shape)}"
        )
    num_experts, two_i, h = gate_up_proj.shape
    if two_i % 2 or tuple(down_proj.shape) != (num_experts, h, two_i // 2):
        raise ValueError(
            f"{_OP} (triton): gate_up_proj {tuple(gate_up_proj.shape)} and down_proj {tuple(down_proj.shape)} do "
            f"not match the layout gate_up_proj [E, 2I, H], down_proj [E, H, I]"
        )
    if hidden_states.dim() < 1 or hidden_states.shape[-1] != h:
        raise ValueError(
            f"{_OP} (triton): hidden_states has shape {tuple(hidden_states.shape)} but the experts' hidden size is "
            f"{h}; hidden_states must be [T, {h}]"
        )
    if top_k_index.dim() < 1 or top_k_weights.shape != top_k_index.shape:
        raise ValueError(
            f"{_OP} (triton): top_k_index {tuple(top_k_index.shape)} and top_k_weights "
            f"{tuple(top_k_weights.shape)} must both be [T, K]"
        )
    x = as_rows(hidden_states, h)
    k = top_k_index.shape[-1]
    idx = top_k_index.reshape(-1, k).contiguous()
    CHECKS.check_expert_index(idx, num_experts)
    weights = top_k_weights.reshape(-1, k).contiguous()
    if idx.shape[0] != x.shape[0]:
        raise ValueError(
            f"{_OP} (triton): {x.shape[0]} tokens in hidden_states but {idx.shape[0]} rows in top_k_index; "
            "both must describe the same T tokens"
        )
    save = torch.is_grad_enabled() and (
        hidden_states.requires_grad or top_k_weights.requires_grad or gate_up_proj.requires_grad
        or down_proj.requires_grad
    )
    out = _moe_fwd(x, idx, weights, gate_up_proj, down_proj, save)[0]
    return out.view(hidden_states.shape)
