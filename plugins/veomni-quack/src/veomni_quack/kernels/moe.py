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

Every GEMM runs with ``tuned=False`` (:data:`TUNED`): Quack's default tile configuration, no
autotuning pass at the first call of each shape.

Backward (4 GEMMs):

1. ``gemm_dgated(grad_out, down_proj, preact, activation="swiglu", colvec_scale=w, colvec_reduce=True,
   cu_seqlens_m=cu, A_idx=tok)``: ``dact = (grad_out[tok] @ down_proj[e]) * w`` (grad rows
   gathered in the GEMM), through SwiGLU's derivative to ``dpreact [TK, 2I]`` (interleaved);
   also ``w * act [TK, I]`` (recomputed from preact) and ``sum_n act * (grad_out[tok] @ down_proj[e])``
   = ``d top_k_weights`` per route (float32).
2. ``gemm(grad_out.T, w * act, cu_seqlens_k=cu, A_idx=tok)`` -> ``d down_proj [E, H, I]``: a
   varlen-K grouped GEMM (each expert's rows are its contraction range; an expert with no rows
   gets zeros: Quack fills the accumulator with 0 when a group has no K tile).
3. ``dpreact`` de-interleaved to ``[dg | du]`` (one torch copy); ``gemm([dg | du].T, x[tok],
   cu_seqlens_k=cu)`` -> ``d gate_up_proj [E, 2I, H]`` in place, the x rows gathered into a
   sorted copy first (Quack gathers A only); :data:`WGRAD_GATE_UP` has two alternatives.
4. ``gemm([dg | du], gate_up_proj, cu_seqlens_m=cu)`` -> ``dx`` per route, summed over the K
   routes of each token token-major (fixed order, float32 accumulation, no atomics).

Forward and backward are ``torch.library`` custom ops (``veomni_quack::moe_experts_fwd`` /
``_bwd``) with fake implementations and a registered autograd formula, so
``torch.compile(fullgraph=True)`` traces the kernel as two opaque calls.

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
from .dsl_fingerprint import fingerprint_installed_dsl

# gemm_gated / gemm_dgated build their epilogues through quack.epilogue.library (imported at their
# first call), whose fingerprinting fails for a DSL installed outside site-packages (see there).
fingerprint_installed_dsl()
_gi = import_quack("quack.gemm_interface")

_OP = "moe_experts"
_FIX = "set moe_implementation: triton (or grouped_mm / eager)"
_DTYPES = (torch.bfloat16, torch.float16)

#: Let Quack autotune each GEMM at its first call per shape (``tuned=True``, Quack's default) or
#: take its default tile configuration (False: no benchmarking pass at the first step; the GPU
#: script measures both).
TUNED = False

#: Read ``gate_up_proj`` as Quack's interleaved (gate, up) pairs through ``concat_layout=("B",)``
#: (no copy). False: an interleaved copy of the weight at every forward (the fallback if Quack's
#: concat layout misbehaves on a GPU).
GATE_UP_CONCAT = True

#: Gather the token rows inside the weight-gradient (varlen-K) GEMMs through ``A_idx``. False:
#: gather them into a sorted copy first (the fallback if the varlen-K gather misbehaves).
WGRAD_GATHER = True

#: How ``d gate_up_proj [E, 2I, H]`` is computed (one varlen-K GEMM per mode; the GPU script times all):
#:
#: * ``"sorted"``: ``[dg | du]^T @ x_sorted`` with ``x_sorted = x[tok]`` gathered into a ``[TK, H]``
#:   copy first (the GEMM's gather is on A only, and A is ``[dg | du]^T`` here); written
#:   directly in the weight's layout. The copy is ``TK * H`` elements.
#: * ``"transpose"``: ``x^T @ [dg | du]`` with x gathered in the GEMM (``A_idx``) into
#:   ``[E, H, 2I]``, then a transposing copy (``E * 2I * H`` elements: 3x the above at moe-30b).
#: * ``"in_place"``: like ``"transpose"`` but written into the ``[E, 2I, H]`` storage through an
#:   m-major ``[E, H, 2I]`` view with ``concat_layout=("out",)``, from the interleaved d preact:
#:   no copy at all, if Quack's m-major varlen-K output with a concat layout works on the GPU.
WGRAD_GATE_UP = "sorted"


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
    """The routes of one call sorted by expert (see the module docstring).

    ``cu``, ``tok``, ``order`` and ``src`` are the state (what the forward op returns for the
    backward); ``valid`` and ``in_range`` follow from them, each computed where first used.
    """

    def __init__(self, cu: torch.Tensor, tok: torch.Tensor, order: torch.Tensor, src: torch.Tensor) -> None:
        #: int32 [E + 1]: expert e's rows are cu[e]:cu[e + 1] of the sorted order.
        self.cu = cu
        #: int32 [T*K]: the token of each sorted route (Quack's A_idx).
        self.tok = tok
        #: int64 [T*K]: sorted position -> token-major route index.
        self.order = order
        #: int64 [T*K], token-major: the row to read a route's output from (T*K: the zero row, a sentinel).
        self.src = src
        self.tk = tok.shape[0]

    @functools.cached_property
    def valid(self) -> torch.Tensor:
        """Boolean [T*K], sorted: the route reaches an expert (rows < cu[E]); the backward's."""
        return torch.arange(self.tk, device=self.cu.device) < self.cu[-1]

    @functools.cached_property
    def in_range(self) -> torch.Tensor:
        """Boolean [T*K], token-major: the routes that reach an expert; the forward's."""
        return self.src < self.tk

    @classmethod
    def sort(cls, top_k_index: torch.Tensor, num_experts: int) -> _Routes:
        """Stable sort of the routes by expert; sentinel routes (-1, E) last, past ``cu[E]``."""
        flat = top_k_index.reshape(-1)
        tk = flat.numel()
        k = top_k_index.shape[1]
        device = flat.device
        in_range = routed(flat, num_experts)
        key = torch.where(in_range, flat.long(), num_experts)
        sorted_key, order = torch.sort(key, stable=True)
        experts = torch.arange(num_experts, device=device, dtype=sorted_key.dtype)
        ends = torch.searchsorted(sorted_key, experts, right=True, out_int32=True)
        cu = torch.cat([torch.zeros(1, dtype=torch.int32, device=device), ends])
        tok = torch.div(order, k, rounding_mode="floor").to(torch.int32)
        pos = torch.empty_like(order).index_copy_(0, order, torch.arange(tk, device=device, dtype=order.dtype))
        return cls(cu, tok, order, torch.where(in_range, pos, tk))


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


# One function per Quack GEMM of the kernel (the GPU script times each alone).
def gate_up_gemm(x: torch.Tensor, gate_up_proj: torch.Tensor, routes: _Routes) -> tuple[torch.Tensor, torch.Tensor]:
    """``(preact [TK, 2I] interleaved, silu(g) * u [TK, I])``, x rows gathered by ``routes.tok``."""
    if GATE_UP_CONCAT:
        weight, concat = gate_up_proj.mT, ("B",)
    else:
        e, two_i, h = gate_up_proj.shape
        weight = gate_up_proj.view(e, 2, two_i // 2, h).transpose(1, 2).reshape(e, two_i, h).mT
        concat = None
    return _gi.gemm_gated(
        x, weight, activation="swiglu", cu_seqlens_m=routes.cu, A_idx=routes.tok, concat_layout=concat, tuned=TUNED,
    )


def _wgrad(rows: torch.Tensor, b: torch.Tensor, routes: _Routes, **kw) -> torch.Tensor:
    """Per expert ``rows[tok]^T @ b`` (varlen-K GEMM): ``[E, rows.shape[1], b.shape[1]]``."""
    if WGRAD_GATHER:
        return _gi.gemm(rows.mT, b, cu_seqlens_k=routes.cu, A_idx=routes.tok, tuned=TUNED, **kw)
    return _gi.gemm(rows[routes.tok.long()].mT, b, cu_seqlens_k=routes.cu, tuned=TUNED, **kw)


def down_gemm(act: torch.Tensor, down_proj: torch.Tensor, routes: _Routes) -> torch.Tensor:
    """``[TK + 1, H]``: row r = ``down_proj[e_r] @ act_r``; the last row zero."""
    ybuf = _zero_row_buffer(routes.tk, down_proj.shape[1], act)
    _gi.gemm(act, down_proj.mT, out=ybuf[: routes.tk], cu_seqlens_m=routes.cu, tuned=TUNED)
    return ybuf


def dgated_gemm(
    grad_out: torch.Tensor, down_proj: torch.Tensor, preact: torch.Tensor, w_sorted: torch.Tensor, routes: _Routes
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(d preact [TK, 2I] interleaved, w * act [TK, I], d w per sorted route [TK] float32)``."""
    dpreact, act_w, dw_sorted = _gi.gemm_dgated(
        grad_out, down_proj, preact, activation="swiglu", colvec_scale=w_sorted, colvec_reduce=True,
        cu_seqlens_m=routes.cu, A_idx=routes.tok, tuned=TUNED,
    )
    return dpreact, act_w, dw_sorted


def wgrad_down_gemm(grad_out: torch.Tensor, act_w: torch.Tensor, routes: _Routes) -> torch.Tensor:
    """``d down_proj [E, H, I]`` = per expert ``grad_out[tok]^T @ (w * act)`` (varlen-K GEMM)."""
    return _wgrad(grad_out, act_w, routes)


def wgrad_gate_up_gemm(
    x: torch.Tensor,
    dpreact: torch.Tensor,
    routes: _Routes,
    gate_up_proj: torch.Tensor,
    dpreact_concat: torch.Tensor | None = None,
) -> torch.Tensor:
    """``d gate_up_proj [E, 2I, H]`` = per expert ``[dg | du]^T @ x[tok]`` (varlen-K GEMM; :data:`WGRAD_GATE_UP`).

    ``dpreact`` is Quack's interleaved layout; ``dpreact_concat``, its ``[dg | du]`` form if the
    caller has it already."""
    if WGRAD_GATE_UP == "in_place":
        grad = torch.empty_like(gate_up_proj, memory_format=torch.contiguous_format)
        # grad.mT is [E, H, 2I], m-major; concat_layout maps its interleaved columns to [gate; up] rows.
        _wgrad(x, dpreact, routes, out=grad.mT, concat_layout=("out",))
        return grad
    if dpreact_concat is None:
        dpreact_concat = _deinterleave(dpreact)
    if WGRAD_GATE_UP == "sorted":
        x_sorted = x.index_select(0, routes.tok)
        return _gi.gemm(dpreact_concat.mT, x_sorted, cu_seqlens_k=routes.cu, tuned=TUNED)
    if WGRAD_GATE_UP != "transpose":
        raise ValueError(f"{_OP} (quack): WGRAD_GATE_UP is {WGRAD_GATE_UP!r}; one of 'sorted', 'transpose', 'in_place'")
    return _wgrad(x, dpreact_concat, routes).transpose(1, 2).contiguous()


def dx_gemm(dpreact_concat: torch.Tensor, gate_up_proj: torch.Tensor, routes: _Routes) -> torch.Tensor:
    """``[TK + 1, H]``: row r = ``[dg | du]_r @ gate_up_proj[e_r]``; the last row zero."""
    dxbuf = _zero_row_buffer(routes.tk, gate_up_proj.shape[2], dpreact_concat)
    _gi.gemm(dpreact_concat, gate_up_proj, out=dxbuf[: routes.tk], cu_seqlens_m=routes.cu, tuned=TUNED)
    return dxbuf


def sorted_weights(weights: torch.Tensor, routes: _Routes) -> torch.Tensor:
    """The route weight of each sorted row, at least float32 (0 on sentinel rows, which Quack never reads)."""
    w_sorted = torch.where(routes.valid, weights.reshape(-1)[routes.order], 0)
    return w_sorted.to(torch.promote_types(w_sorted.dtype, torch.float32))


# ----------------------------------------------------------------- the custom ops
# Forward and backward are torch.library custom ops with fake implementations and a registered
# autograd formula: torch.compile(fullgraph=True) traces the kernel as two opaque calls (Quack's
# Python, the pointer checks and the sort run inside them, eagerly).
_LIB = "veomni_quack"


@torch.library.custom_op(f"{_LIB}::moe_experts_fwd", mutates_args=())
def _fwd(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, preact, weights, cu, tok, order, src)``: the output and what the backward needs."""
    t, h = hidden_states.shape
    k = top_k_index.shape[1]
    x = to_layout(hidden_states.contiguous(), layout_div(h, hidden_states))
    routes = _Routes.sort(top_k_index, gate_up_proj.shape[0])
    preact, act = gate_up_gemm(x, gate_up_proj, routes)
    ybuf = down_gemm(act, down_proj, routes)
    weights = torch.where(routes.in_range.view(t, k), top_k_weights, 0).to(x.dtype)
    out = torch.bmm(weights.unsqueeze(1), _token_major(ybuf, routes, t, k)).squeeze(1)
    return out, preact, weights, routes.cu, routes.tok, routes.order, routes.src


@_fwd.register_fake
def _(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj):
    t, h = hidden_states.shape
    k = top_k_index.shape[1]
    e, two_i, _ = gate_up_proj.shape
    tk = t * k
    dev = hidden_states.device
    return (
        hidden_states.new_empty(t, h),
        hidden_states.new_empty(tk, two_i),
        hidden_states.new_empty(t, k),
        torch.empty(e + 1, dtype=torch.int32, device=dev),
        torch.empty(tk, dtype=torch.int32, device=dev),
        torch.empty(tk, dtype=torch.int64, device=dev),
        torch.empty(tk, dtype=torch.int64, device=dev),
    )


@torch.library.custom_op(f"{_LIB}::moe_experts_bwd", mutates_args=())
def _bwd(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    preact: torch.Tensor,
    weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    cu: torch.Tensor,
    tok: torch.Tensor,
    order: torch.Tensor,
    src: torch.Tensor,
    needs: list[bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(d hidden_states, d weights (float32), d gate_up_proj, d down_proj)``; an unneeded one is empty."""
    t, h = hidden_states.shape
    k = weights.shape[1]
    need_x, need_w, need_gu, need_down = needs
    routes = _Routes(cu, tok, order, src)
    x = to_layout(hidden_states.contiguous(), layout_div(h, hidden_states))
    g = to_layout(grad_out.contiguous(), layout_div(h, grad_out))
    dpreact, act_w, dw_sorted = dgated_gemm(g, down_proj, preact, sorted_weights(weights, routes), routes)
    # An unneeded gradient is a fresh empty tensor (a custom op's outputs may not alias each other).
    grad_x, grad_w, grad_gu, grad_down = (x.new_empty(0) for _ in range(4))
    # Each [TK, .] intermediate is dropped as soon as its last GEMM has been queued (peak memory).
    if need_down:
        grad_down = wgrad_down_gemm(g, act_w, routes)
    del act_w
    dpreact_concat = _deinterleave(dpreact) if need_x or (need_gu and WGRAD_GATE_UP != "in_place") else None
    if need_gu:
        grad_gu = wgrad_gate_up_gemm(x, dpreact, routes, gate_up_proj, dpreact_concat)
    del dpreact
    if need_x:
        assert dpreact_concat is not None
        dxbuf = dx_gemm(dpreact_concat, gate_up_proj, routes)
        del dpreact_concat
        grad_x = _token_major(dxbuf, routes, t, k).sum(dim=1)
    if need_w:
        # Sorted rows past cu[E] hold whatever the partials buffer held: masked.
        dw = torch.where(routes.valid, dw_sorted, 0)
        grad_w = torch.empty_like(dw).index_copy_(0, routes.order, dw).view(t, k)
    return grad_x, grad_w, grad_gu, grad_down


@_bwd.register_fake
def _(grad_out, hidden_states, preact, weights, gate_up_proj, down_proj, cu, tok, order, src, needs):
    need_x, need_w, need_gu, need_down = needs
    w_dtype = torch.promote_types(weights.dtype, torch.float32)
    return (
        hidden_states.new_empty(hidden_states.shape if need_x else (0,)),
        weights.new_empty(weights.shape if need_w else (0,), dtype=w_dtype if need_w else hidden_states.dtype),
        gate_up_proj.new_empty(gate_up_proj.shape if need_gu else (0,)),
        down_proj.new_empty(down_proj.shape if need_down else (0,)),
    )


def _setup_context(ctx, inputs, output) -> None:
    hidden_states, _, top_k_weights, gate_up_proj, down_proj = inputs
    _, preact, weights, cu, tok, order, src = output
    ctx.save_for_backward(hidden_states, preact, weights, gate_up_proj, down_proj, cu, tok, order, src)
    ctx.weights_dtype = top_k_weights.dtype
    ctx.mark_non_differentiable(*output[1:])


def _backward(ctx, grad_out, *_):
    need_x, _, need_w, need_gu, need_down = ctx.needs_input_grad
    grads = _bwd(grad_out, *ctx.saved_tensors, [need_x, need_w, need_gu, need_down])
    grad_x, grad_w, grad_gu, grad_down = (g if need else None for g, need in zip(grads, (need_x, need_w, need_gu,
                                                                                         need_down)))
    if grad_w is not None:
        grad_w = grad_w.to(ctx.weights_dtype)
    return grad_x, None, grad_w, grad_gu, grad_down


_fwd.register_autograd(_backward, setup_context=_setup_context)


def moe_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """Routed SiLU-gated experts on Quack's grouped GEMMs (module docstring); ``[T, H]`` in the input dtype."""
    _, _, e, _, _ = _check(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
    CHECKS.check_expert_index(top_k_index, e)
    return _fwd(hidden_states, top_k_index, top_k_weights, gate_up_proj.contiguous(), down_proj.contiguous())[0]
