"""STAND-IN of quack.gemm_interface (0.6.5): ``gemm``, ``gemm_act``/``gemm_gated`` and
``gemm_dact``/``gemm_dgated`` with the real signatures, plain torch, CPU.

What the veomni-quack MoE adapter relies on, modelled on the real code (gemm_interface.py's
``gemm_ref`` / ``gemm_act_ref`` / ``gemm_dact_ref``, gemm.py's asserts, the SM90 kernel and
quack.epilogue.library's ``linear_act_mod`` / ``dgated_mod``):

* ``B`` is ``(K, N)`` or ``(L, K, N)``; ``varlen_m`` (``cu_seqlens_m`` int32 ``[L + 1]``): group i
  is rows ``cu[i]:cu[i+1]`` of A (or of ``A[A_idx]`` with ``A_idx`` int32 ``[total_m]``, the
  gather) times ``B[i]``; ``varlen_k`` (``cu_seqlens_k``): ``out[i] = A[:, cols_i] @ B[rows_i]``
  with the same gather on A's columns; a group with no K gives zeros (the kernel fills its
  accumulator with 0).
* float32 accumulation (float64 only when :data:`ALLOW_FLOAT64` is set by a test), one rounding
  to the output dtype; the gated epilogue computes ``act(g, u)`` from the float32 accumulator.
* Rows of a varlen_m output past ``cu[-1]`` are never written by the real kernel: here they are
  filled with NaN (what uninitialised memory may hold), so a caller that reads them fails.
  The same for the per-row reduction (``colvec_reduce``) of those rows.
* The real layout asserts: varlen_m needs A k-major and D n-major, varlen_k A m-major and B
  n-major; gather needs varlen; int32 offsets and indices; 16-byte aligned strides and data.
* ``concat_layout``: a named tensor whose non-contiguous dimension is ``[first; second]`` is
  read (written, for ``"out"``) as the interleaving ``[f0, s0, f1, s1, ...]`` of that dimension.
* Gated activations pair adjacent columns: ``g = preact[..., ::2]``, ``u = preact[..., 1::2]``.

Not the real Quack: no tuning, no CuTe, nothing runs on a GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

#: Every call (function name, keyword arguments), for the adapter's translation tests.
CALLS: list = []

#: Tests may set this to run the same code paths in float64 (the real kernels take 16-bit and fp32 inputs).
ALLOW_FLOAT64 = False

_GATED = {"swiglu": lambda g, u: F.silu(g) * u}


def _dtypes() -> tuple:
    base = (torch.bfloat16, torch.float16, torch.float32)
    return base + ((torch.float64,) if ALLOW_FLOAT64 else ())


def _acc_dtype(*ts: Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def _check_operand(t: Tensor, name: str) -> None:
    assert t.dtype in _dtypes(), f"stand-in quack: {name} dtype {t.dtype} not supported"
    assert t.device.type == "cpu" or t.is_cuda, f"stand-in quack: {name} on {t.device}"
    if t.numel() == 0:
        return
    # TMA: one of the last two dimensions contiguous, the other strides 16-byte multiples, 16-byte aligned.
    assert t.stride(-1) == 1 or (t.dim() >= 2 and t.stride(-2) == 1), (
        f"stand-in quack: {name} needs a unit stride in one of its last two dimensions, got {t.stride()}"
    )
    div = 16 // t.element_size()
    unit = t.dim() - 1 if t.stride(-1) == 1 else t.dim() - 2
    for d, s in enumerate(t.stride()):
        if d != unit and t.shape[d] > 1:
            assert s % div == 0, f"stand-in quack: {name} stride {s} (dim {d}) not a multiple of 16 bytes"
    assert t.data_ptr() % 16 == 0, f"stand-in quack: {name} is not 16-byte aligned"


def _check_int32(t: Tensor | None, name: str) -> None:
    if t is not None:
        assert t.dtype == torch.int32 and t.dim() == 1, f"stand-in quack: {name} must be a 1-D int32 tensor"


def _interleave(t: Tensor) -> Tensor:
    """Quack's ``_concat_interleave``: [first; second] along the non-contiguous dim -> interleaved."""
    dim = -2 if t.stride(-1) == 1 else -1
    return t.unflatten(dim, (2, t.shape[dim] // 2)).transpose(dim - 1, dim).flatten(dim - 1, dim)


def _write_concat(out: Tensor, value: Tensor) -> None:
    """Store the logical interleaved ``value`` into ``out`` laid out [first; second] along its non-contiguous dim."""
    dim = out.dim() - 2 if out.stride(-1) == 1 else out.dim() - 1
    half = out.shape[dim] // 2
    even = torch.arange(0, 2 * half, 2, device=out.device)
    out.narrow(dim, 0, half).copy_(value.index_select(dim, even))
    out.narrow(dim, half, half).copy_(value.index_select(dim, even + 1))


def _groups(cu: Tensor) -> list[tuple[int, int]]:
    c = cu.tolist()
    assert c[0] == 0 and all(a <= b for a, b in zip(c, c[1:])), f"stand-in quack: cu_seqlens {c} not non-decreasing from 0"
    return list(zip(c, c[1:]))


def _matmul(
    A: Tensor, B: Tensor, cu_seqlens_m: Tensor | None, cu_seqlens_k: Tensor | None, A_idx: Tensor | None,
    acc: torch.dtype,
) -> tuple[Tensor, list | None]:
    """The float accumulator of the (grouped) product, and for varlen_m the covered row ranges."""
    varlen_m, varlen_k = cu_seqlens_m is not None, cu_seqlens_k is not None
    assert not (varlen_m and varlen_k), "Only one of cu_seqlens_m and cu_seqlens_k"
    if A_idx is not None:
        assert varlen_m or varlen_k, "gather_A requires varlen"
    _check_int32(cu_seqlens_m, "cu_seqlens_m")
    _check_int32(cu_seqlens_k, "cu_seqlens_k")
    _check_int32(A_idx, "A_idx")
    if varlen_m:
        assert A.stride(-1) == 1, "varlen_m requires A to be k-major"
        groups = _groups(cu_seqlens_m)
        assert B.dim() == 3 and B.shape[0] == len(groups), "stand-in quack: varlen_m needs B (L, K, N)"
        total_m = A_idx.shape[0] if A_idx is not None else A.shape[0]
        assert groups[-1][1] <= total_m
        res = torch.full((total_m, B.shape[-1]), float("nan"), dtype=acc, device=A.device)
        for i, (s, e) in enumerate(groups):
            rows = A[A_idx[s:e].long()] if A_idx is not None else A[s:e]
            res[s:e] = rows.to(acc) @ B[i].to(acc)
        return res, groups
    if varlen_k:
        assert A.stride(-2) == 1, "varlen_k requires A to be m-major"
        assert B.stride(-1) == 1, "varlen_k requires B to be n-major"
        groups = _groups(cu_seqlens_k)
        res = torch.zeros((len(groups), A.shape[0], B.shape[-1]), dtype=acc, device=A.device)
        for i, (s, e) in enumerate(groups):
            cols = A[:, A_idx[s:e].long()] if A_idx is not None else A[:, s:e]
            res[i] = cols.to(acc) @ B[s:e].to(acc)
        return res, None
    return A.to(acc) @ B.to(acc), None


def gemm(
    A: Tensor,
    B: Tensor,
    out: Tensor | None = None,
    bias: Tensor | None = None,
    alpha: float | Tensor = 1.0,
    out_dtype: torch.dtype | None = None,
    out_quant_dim: int = -1,
    out_transposed: bool = False,
    out_per_tensor_scale: float | Tensor | None = None,
    cu_seqlens_m: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    A_idx: Tensor | None = None,
    batch_idx_permute: Tensor | None = None,
    dynamic_scheduler: bool = False,
    tuned: bool = True,
    rounding_mode: int = 0,
    sr_seed: int | Tensor = 0,
    concat_layout: tuple | None = None,
    split_k: int | None = 1,
    split_k_mode: int = 0,
) -> Tensor:
    """GEMM with optional output tensor (varlen_m / varlen_k / gather_A as the real one)."""
    CALLS.append(("gemm", dict(A=A, B=B, out=out, cu_seqlens_m=cu_seqlens_m, cu_seqlens_k=cu_seqlens_k, A_idx=A_idx,
                               concat_layout=concat_layout, tuned=tuned)))
    assert bias is None and alpha == 1.0 and out_quant_dim == -1 and not out_transposed and out_per_tensor_scale is None
    assert batch_idx_permute is None and split_k in (1, None), "stand-in quack: feature not modelled"
    assert A.dtype == B.dtype, "stand-in quack: A and B must share a dtype"
    concat = set(concat_layout or ())
    assert concat <= {"A", "B", "out"}, f"stand-in quack: concat_layout {concat_layout} not modelled"
    _check_operand(A, "A")
    _check_operand(B, "B")
    if "A" in concat:
        A = _interleave(A)
    if "B" in concat:
        B = _interleave(B)
    varlen_m, varlen_k = cu_seqlens_m is not None, cu_seqlens_k is not None
    if varlen_m:
        total_m = A_idx.shape[0] if A_idx is not None else A.shape[0]
        out_shape = (total_m, B.shape[-1])
    elif varlen_k:
        out_shape = (cu_seqlens_k.shape[0] - 1, A.shape[0], B.shape[-1])
    else:
        out_shape = (*A.shape[:-1], B.shape[-1])
    if out is None:
        out = torch.empty(out_shape, dtype=out_dtype or A.dtype, device=A.device)
    assert tuple(out.shape) == out_shape, f"out shape mismatch: {tuple(out.shape)} vs {out_shape}"
    if varlen_m:
        assert out.stride(-1) == 1, "varlen_m requires D to be n-major"
    _check_operand(out, "out")
    res, _ = _matmul(A, B, cu_seqlens_m, cu_seqlens_k, A_idx, _acc_dtype(A, B))
    res = res.to(out.dtype)
    if "out" in concat:
        _write_concat(out, res)
    else:
        out.copy_(res)
    return out


def gemm_act(
    A: Tensor,
    B: Tensor,
    C: Tensor | None = None,
    bias: Tensor | None = None,
    activation: str | None = None,
    alpha: float | Tensor = 1.0,
    preact_out: Tensor | None = None,
    postact_out: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    postact_dtype: torch.dtype | None = None,
    cu_seqlens_m: Tensor | None = None,
    A_idx: Tensor | None = None,
    store_preact: bool = True,
    dynamic_scheduler: bool = False,
    tuned: bool = True,
    config: object = None,
    concat_layout: tuple | None = None,
    split_k: int | None = 1,
    split_k_mode: int = 0,
) -> tuple[Tensor | None, Tensor]:
    """GEMM with (gated) activation: ``preact = A @ B``, ``postact = act(preact)`` (from the fp32 accumulator)."""
    CALLS.append(("gemm_act", dict(A=A, B=B, activation=activation, cu_seqlens_m=cu_seqlens_m, A_idx=A_idx,
                                   concat_layout=concat_layout, tuned=tuned)))
    assert C is None and bias is None and alpha == 1.0 and config is None and split_k in (1, None)
    assert activation in _GATED, f"stand-in quack: activation {activation!r} not modelled"
    concat = set(concat_layout or ())
    assert concat <= {"B"}, f"stand-in quack: concat_layout {concat_layout} not modelled for gemm_act"
    assert A.dtype == B.dtype
    _check_operand(A, "A")
    _check_operand(B, "B")
    if "B" in concat:
        B = _interleave(B)
    assert B.shape[-1] % 2 == 0, "gated activation needs an even N"
    acc, groups = _matmul(A, B, cu_seqlens_m, None, A_idx, _acc_dtype(A, B))
    post = _GATED[activation](acc[..., ::2], acc[..., 1::2])
    out_dtype = out_dtype or A.dtype
    postact_dtype = postact_dtype or A.dtype
    if preact_out is None and store_preact:
        preact_out = torch.empty(acc.shape, dtype=out_dtype, device=A.device)
    if postact_out is None:
        postact_out = torch.empty(post.shape, dtype=postact_dtype, device=A.device)
    if preact_out is not None:
        preact_out.copy_(acc.to(preact_out.dtype))
    postact_out.copy_(post.to(postact_out.dtype))
    return preact_out, postact_out


gemm_gated = gemm_act


def gemm_dact(
    A: Tensor,
    B: Tensor,
    PreAct: Tensor,
    activation: str | None = None,
    dx_out: Tensor | None = None,
    postact_out: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    postact_dtype: torch.dtype | None = None,
    colvec_scale: Tensor | None = None,
    colvec_reduce: bool = False,
    cu_seqlens_m: Tensor | None = None,
    A_idx: Tensor | None = None,
    dynamic_scheduler: bool = True,
    tuned: bool = True,
    config: object = None,
    split_k: int | None = 1,
    split_k_mode: int = 0,
):
    """Gated-activation gradient (``dgated_mod``): ``acc = A @ B`` is dout per (gate, up) pair,
    ``c = PreAct`` the interleaved preactivation. ``dout = acc * colvec_scale``;
    ``D = pack(dgate, dup)`` of ``act(g, u)`` w.r.t. g and u times dout; ``postact = act(g, u) * colvec_scale``;
    ``colvec_reduce``: ``sum_n act(g, u) * acc`` (unscaled, float32), one value per row."""
    CALLS.append(("gemm_dact", dict(A=A, B=B, PreAct=PreAct, activation=activation, colvec_scale=colvec_scale,
                                    colvec_reduce=colvec_reduce, cu_seqlens_m=cu_seqlens_m, A_idx=A_idx,
                                    tuned=tuned)))
    assert config is None and split_k in (1, None)
    assert activation in _GATED, f"stand-in quack: activation {activation!r} not modelled"
    assert A.dtype == B.dtype
    _check_operand(A, "A")
    _check_operand(B, "B")
    _check_operand(PreAct, "PreAct")
    acc_dtype = _acc_dtype(A, B, PreAct)
    acc, groups = _matmul(A, B, cu_seqlens_m, None, A_idx, acc_dtype)
    assert PreAct.shape[-1] == 2 * acc.shape[-1] and PreAct.shape[:-1] == acc.shape[:-1]
    if colvec_scale is not None:
        assert colvec_scale.shape == acc.shape[:-1], "stand-in quack: colvec_scale must be (total_M,)"
    scale = colvec_scale.to(acc_dtype).unsqueeze(-1) if colvec_scale is not None else None
    g = PreAct[..., ::2].to(acc_dtype)
    u = PreAct[..., 1::2].to(acc_dtype)
    dout = acc * scale if scale is not None else acc
    sig = torch.sigmoid(g)
    silu = g * sig
    act = silu * u
    dg = dout * u * sig * (1 + g * (1 - sig))
    du = dout * silu
    dx = torch.stack([dg, du], dim=-1).reshape(PreAct.shape)
    post = act * scale if scale is not None else act
    out_dtype = out_dtype or A.dtype
    postact_dtype = postact_dtype or PreAct.dtype
    if dx_out is None:
        dx_out = torch.empty(dx.shape, dtype=out_dtype, device=A.device)
    if postact_out is None:
        postact_out = torch.empty(post.shape, dtype=postact_dtype, device=A.device)
    dx_out.copy_(dx.to(dx_out.dtype))
    postact_out.copy_(post.to(postact_out.dtype))
    results = [dx_out, postact_out]
    if colvec_reduce:
        red = (act * acc).sum(-1).to(torch.float32 if acc_dtype == torch.float32 else acc_dtype)
        if groups is not None:  # rows no group covers: the partials buffer is never written
            red[groups[-1][1]:] = float("nan")
        results.append(red)
    return tuple(results)


gemm_dgated = gemm_dact
