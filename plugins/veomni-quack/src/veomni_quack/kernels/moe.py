"""``moe_experts`` through Quack's variable-length grouped GEMMs with gathered rows (sm 9.0+).

Kernel contract (``veomni_ops.hookspecs.OpHookspecs.moe_experts``)::

    kernel(hidden_states [T, H], top_k_index [T, K], top_k_weights [T, K],
           gate_up_proj [E, 2I, H], down_proj [E, H, I]) -> [T, H]

    out_t = sum_k w_tk * down_proj[e] @ (silu(g) * u),  [g; u] = gate_up_proj[e] @ x_t,  e = top_k_index[t, k]

Quack 0.6.5 calls (``quack.gemm_interface``; every one a CuTe-DSL grouped GEMM over the
experts, ``cu_seqlens`` int32 ``[E + 1]``, gather indices ``A_idx`` int32):

Routing (plain torch on the device, no host synchronisation): a stable sort of the ``T*K``
expert indices (routes to the sentinels ``-1`` / ``E`` sort last, past ``cu[E]``, where no
GEMM reads or writes), ``cu = [0, searchsorted(...)]``, ``tok[r]`` = the token of sorted route r.

Forward (2 GEMMs):

1. ``gemm_gated(x, gate_up_proj.mT, activation="swiglu", cu_seqlens_m=cu, A_idx=tok,
   concat_layout=("B",))`` -> ``preact [TK, 2I]`` (gate/up *interleaved* columns: Quack's
   gated epilogue pairs adjacent columns; ``concat_layout=("B",)`` makes it read our
   ``[gate rows; up rows]`` weight as that interleaving, no weight copy) and
   ``act = silu(g) * u [TK, I]``. The x rows are gathered inside the GEMM (no copy).
2. ``gemm(act, down_proj.mT, cu_seqlens_m=cu)`` -> ``y [TK, H]``, written into a buffer with one
   extra zero row.
3. Combine (torch): ``out_t = [w_t1 .. w_tK] @ [y_t1; ..; y_tK]``, the rows read token-major from
   that buffer (a sentinel route reads the zero row), one ``bmm``: float32 accumulation, one
   rounding, deterministic, no atomics.

Backward (4 GEMMs):

1. ``gemm_dgated(grad_out, down_proj, preact, activation="swiglu", colvec_scale=w, colvec_reduce=True,
   cu_seqlens_m=cu, A_idx=tok)``: ``dact = (grad_out[tok] @ down_proj[e]) * w`` (grad rows
   gathered in the GEMM), through SwiGLU's derivative to ``dpreact [TK, 2I]`` (interleaved);
   also ``w * act [TK, I]`` (recomputed from preact) and ``sum_n act * (grad_out[tok] @ down_proj[e])``
   = ``d top_k_weights`` per route (float32).
2. ``gemm(grad_out.T, w * act, cu_seqlens_k=cu, A_idx=tok)`` -> ``d down_proj [E, H, I]``: a
   varlen-K grouped GEMM (each expert's rows are its contraction range; an expert with no rows
   gets zeros: Quack fills the accumulator with 0 when a group has no K tile).
3. ``dpreact`` de-interleaved to ``[dg | du]`` (one torch copy); ``gemm(x.T, [dg | du],
   cu_seqlens_k=cu, A_idx=tok)`` -> ``[E, H, 2I]``, transposed into ``d gate_up_proj [E, 2I, H]``
   (one copy; :data:`WGRAD_INTO_TRANSPOSED` writes it in place instead, not yet run on a GPU).
4. ``gemm([dg | du], gate_up_proj, cu_seqlens_m=cu)`` -> ``dx`` per route, summed over the K
   routes of each token token-major (fixed order, float32 accumulation, no atomics).

Rows of the sorted order past ``cu[E]`` (routes to the sentinels) are never written by a
Quack GEMM: every tensor read from them is masked (the zero row; ``torch.where`` on the
weight gradient), so no uninitialised memory reaches an output or a gradient.

Constraints, refused with a message naming the fix (``moe_implementation: triton``): CUDA
tensors on sm 9.0+ (Quack's kernels are Hopper/Blackwell ones), bfloat16 or float16 (one
dtype for hidden_states and both weights; ``top_k_weights`` any float dtype), H and I
multiples of 8 (TMA needs 16-byte rows). Expert indices other than ``-1``/``E`` outside
``[0, E)`` are refused by the core's ``check_expert_index`` (CPU: ``ValueError``; CUDA: a
device-side assertion, no synchronisation).
"""

from __future__ import annotations

import functools

import torch
from veomni_ops.kernels.moe import routed

from ._common import CHECKS, import_quack, layout_div, to_layout

_gi = import_quack("quack.gemm_interface")

_OP = "moe_experts"
_FIX = "set moe_implementation: triton (or grouped_mm / eager)"
_DTYPES = (torch.bfloat16, torch.float16)

#: Write ``d gate_up_proj`` straight into its ``[E, 2I, H]`` storage (Quack's output given as
#: an m-major ``[E, H, 2I]`` view with ``concat_layout=("out",)``) instead of computing it
#: ``[E, H, 2I]`` interleaved and copying. Off until the GPU script has checked it.
WGRAD_INTO_TRANSPOSED = False


def _check(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> tuple[int, int, int, int, int]:
    t, h, e, i, k = CHECKS.check_moe_inputs(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
    dtype = hidden_states.dtype
    if dtype not in _DTYPES:
        raise TypeError(
            f"{_OP} (quack): hidden_states and the expert weights are {dtype}; Quack's grouped GEMMs are "
            f"registered for bfloat16 and float16 only. Train in bfloat16, or {_FIX}"
        )
    align = 16 // hidden_states.element_size()
    if h % align or i % align:
        raise ValueError(
            f"{_OP} (quack): hidden size H = {h} and expert intermediate size I = {i} must be multiples of {align} "
            f"in {dtype} (Quack's TMA loads need 16-byte rows); {_FIX}"
        )
    if hidden_states.device.type == "cuda":
        _check_capability(hidden_states.device)
    return t, h, e, i, k


@functools.cache
def _capability_problem(index: int) -> str | None:
    major, minor = torch.cuda.get_device_capability(index)
    if major >= 9:
        return None
    return (
        f"{_OP} (quack): {torch.cuda.get_device_name(index)} is compute capability {major}.{minor}; Quack's "
        f"grouped GEMMs need sm 9.0+ (Hopper/Blackwell); {_FIX}"
    )


def _check_capability(device: torch.device) -> None:
    if torch.compiler.is_compiling():
        return
    problem = _capability_problem(device.index if device.index is not None else torch.cuda.current_device())
    if problem:
        raise RuntimeError(problem)


class _Routes:
    """The routes of one call sorted by expert (see the module docstring)."""

    def __init__(self, top_k_index: torch.Tensor, num_experts: int) -> None:
        flat = top_k_index.reshape(-1)
        tk = flat.numel()
        k = top_k_index.shape[1]
        device = flat.device
        #: Boolean [T*K], token-major: the routes that reach an expert.
        self.in_range = routed(flat, num_experts)
        key = torch.where(self.in_range, flat.long(), num_experts)
        sorted_key, order = torch.sort(key, stable=True)
        #: Sorted position -> token-major route index.
        self.order = order
        experts = torch.arange(num_experts, device=device, dtype=sorted_key.dtype)
        ends = torch.searchsorted(sorted_key, experts, right=True, out_int32=True)
        #: int32 [E + 1]: expert e's rows are cu[e]:cu[e + 1] of the sorted order.
        self.cu = torch.cat([torch.zeros(1, dtype=torch.int32, device=device), ends])
        #: int32 [T*K]: the token of each sorted route (Quack's A_idx).
        self.tok = torch.div(order, k, rounding_mode="floor").to(torch.int32)
        #: Boolean [T*K], sorted: the route reaches an expert (rows < cu[E]).
        self.valid = sorted_key < num_experts
        # Token-major route -> its sorted row, or tk (an extra zero row) for a sentinel route.
        pos = torch.empty_like(order).index_copy_(0, order, torch.arange(tk, device=device, dtype=order.dtype))
        #: int64 [T*K], token-major: the row to read a route's output from.
        self.src = torch.where(self.in_range, pos, tk)
        self.tk = tk


def _zero_row_buffer(rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    """``[rows + 1, cols]`` with the last row zero (what sentinel routes read)."""
    buf = torch.empty(rows + 1, cols, dtype=like.dtype, device=like.device)
    buf[rows].zero_()
    return buf


def _token_major(buf: torch.Tensor, routes: _Routes, t: int, k: int) -> torch.Tensor:
    """``[T, K, N]``: row ``src`` of ``buf`` for every token-major route (zero for a sentinel)."""
    return buf.index_select(0, routes.src).view(t, k, buf.shape[1])


def _deinterleave(pairs: torch.Tensor) -> torch.Tensor:
    """``[M, 2I]`` with (gate, up) in adjacent columns -> ``[M, 2I]`` as ``[gate | up]``."""
    m, two_i = pairs.shape
    return pairs.view(m, two_i // 2, 2).transpose(1, 2).reshape(m, two_i)


def _wgrad_gate_up(x: torch.Tensor, dpreact: torch.Tensor, routes: _Routes, gate_up_proj: torch.Tensor) -> torch.Tensor:
    """``d gate_up_proj [E, 2I, H]`` = per expert ``[dg | du]^T @ x[tok]`` (varlen-K GEMM)."""
    if WGRAD_INTO_TRANSPOSED:
        grad = torch.empty_like(gate_up_proj, memory_format=torch.contiguous_format)
        # grad.mT is [E, H, 2I], m-major; concat_layout maps its interleaved columns to [gate; up] rows.
        _gi.gemm(x.mT, dpreact, out=grad.mT, cu_seqlens_k=routes.cu, A_idx=routes.tok, concat_layout=("out",))
        return grad
    grad_t = _gi.gemm(x.mT, _deinterleave(dpreact), cu_seqlens_k=routes.cu, A_idx=routes.tok)  # [E, H, 2I]
    return grad_t.transpose(1, 2).contiguous()


class _QuackMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, top_k_index, top_k_weights, gate_up_proj, down_proj):  # type: ignore[override]
        t, h = x.shape
        k = top_k_index.shape[1]
        num_experts = gate_up_proj.shape[0]
        routes = _Routes(top_k_index, num_experts)
        preact, act = _gi.gemm_gated(
            x, gate_up_proj.mT, activation="swiglu", cu_seqlens_m=routes.cu, A_idx=routes.tok,
            concat_layout=("B",),
        )
        ybuf = _zero_row_buffer(routes.tk, h, x)
        _gi.gemm(act, down_proj.mT, out=ybuf[: routes.tk], cu_seqlens_m=routes.cu)
        weights = torch.where(routes.in_range.view(t, k), top_k_weights, 0).to(x.dtype)
        out = torch.bmm(weights.unsqueeze(1), _token_major(ybuf, routes, t, k)).squeeze(1)
        ctx.routes = routes
        ctx.k = k
        ctx.save_for_backward(x, preact, weights, gate_up_proj, down_proj)
        ctx.weights_dtype = top_k_weights.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        x, preact, weights, gate_up_proj, down_proj = ctx.saved_tensors
        routes: _Routes = ctx.routes
        t, h = x.shape
        k = ctx.k
        need_x, _, need_w, need_gu, need_down = ctx.needs_input_grad
        g = to_layout(grad_out, layout_div(h, grad_out)).contiguous()
        # The route weight of each sorted row, at least float32 (0 on sentinel rows, which Quack never reads).
        w_sorted = torch.where(routes.valid, weights.reshape(-1)[routes.order], 0)
        w_sorted = w_sorted.to(torch.promote_types(w_sorted.dtype, torch.float32))
        dpreact, act_w, dw_sorted = _gi.gemm_dgated(
            g, down_proj, preact, activation="swiglu", colvec_scale=w_sorted, colvec_reduce=True,
            cu_seqlens_m=routes.cu, A_idx=routes.tok,
        )
        grad_x = grad_w = grad_gu = grad_down = None
        if need_down:
            grad_down = _gi.gemm(g.mT, act_w, cu_seqlens_k=routes.cu, A_idx=routes.tok)  # [E, H, I]
        if need_gu:
            grad_gu = _wgrad_gate_up(x, dpreact, routes, gate_up_proj)
        if need_x:
            dxbuf = _zero_row_buffer(routes.tk, h, x)
            _gi.gemm(_deinterleave(dpreact), gate_up_proj, out=dxbuf[: routes.tk], cu_seqlens_m=routes.cu)
            grad_x = _token_major(dxbuf, routes, t, k).sum(dim=1)
        if need_w:
            # Sorted rows past cu[E] hold whatever the partials buffer held: masked.
            dw = torch.where(routes.valid, dw_sorted, 0)
            grad_w = torch.empty_like(dw).index_copy_(0, routes.order, dw).view(t, k).to(ctx.weights_dtype)
        return grad_x, None, grad_w, grad_gu, grad_down


def moe_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """Routed SiLU-gated experts on Quack's grouped GEMMs (module docstring); ``[T, H]`` in the input dtype."""
    t, h, e, _, _ = _check(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
    CHECKS.check_expert_index(top_k_index, e)
    div = layout_div(h, hidden_states)
    x = to_layout(hidden_states, div)
    return _QuackMoE.apply(x, top_k_index, top_k_weights, gate_up_proj.contiguous(), down_proj.contiguous())
