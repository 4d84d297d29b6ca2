"""Stand-ins for the flash-attention packages, for CPU tests.

The real kernels need a GPU; these functions have the real packages' keyword signatures
and input checks (half dtypes, [B, S, H, D] / [T, H, D] layouts, int32 cu_seqlens, host-int
max lengths, Hq % Hk) and compute attention in float64, so the veomni-flash adapters can be
checked numerically on a CPU. Every call is logged in CALLS for the tests to inspect.

Semantics follow the flash-attention docs: causal masks are aligned to the bottom-right
corner; a window (left, right) keeps keys j with i + Sk - Sq - left <= j <= i + Sk - Sq + right;
softcap computes ``softcap * tanh(scale * q.k / softcap)``; a query with no key gets 0.
"""

from __future__ import annotations

import math

import torch

CALLS: list[dict] = []

_HALF = (torch.float16, torch.bfloat16)


def _check_common(api: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ndim: int) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert t.dim() == ndim, f"{api}: {name} must be {ndim}-D, got {tuple(t.shape)}"
        assert t.dtype in _HALF, f"{api}: FlashAttention only supports fp16 and bf16, got {t.dtype} for {name}"
        assert t.stride(-1) == 1, f"{api}: {name} must have contiguous last dimension"
    assert q.dtype == k.dtype == v.dtype, f"{api}: query and key/value must have the same dtype"
    hq, hk = q.shape[-2], k.shape[-2]
    assert hq % hk == 0, f"{api}: number of heads in key/value must divide number of heads in query"
    assert k.shape[-1] == q.shape[-1] == v.shape[-1], f"{api}: head dims must match"


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None,
    causal: bool,
    left: int | None,
    right: int | None,
    softcap: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """One [B, S, H, D] attention in float64, cast back to q.dtype. left/right None = unlimited."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qd, kd, vd = q.double(), k.double(), v.double()
    rep = hq // hk
    kd = kd.repeat_interleave(rep, dim=2)
    vd = vd.repeat_interleave(rep, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        right = 0 if right is None else min(right, 0)
    if left is not None:
        keep &= j >= i - left
    if right is not None:
        keep &= j <= i + right
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # rows with no key: flash writes zeros
    if dropout_p:
        p = torch.nn.functional.dropout(p, p=dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vd)
    return out.to(q.dtype)


def attend_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw) -> torch.Tensor:
    assert isinstance(cu_q, torch.Tensor) and cu_q.dtype == torch.int32 and cu_q.dim() == 1, "cu_seqlens_q int32 1-D"
    assert isinstance(cu_k, torch.Tensor) and cu_k.dtype == torch.int32 and cu_k.dim() == 1, "cu_seqlens_k int32 1-D"
    assert cu_q.numel() == cu_k.numel(), "cu_seqlens_q/k must have the same number of sequences"
    assert int(cu_q[-1]) == q.shape[0] and int(cu_k[-1]) == k.shape[0], "cu_seqlens must end at the token count"
    assert isinstance(max_q, int) and isinstance(max_k, int), "max_seqlen must be a host int"
    lq, lk = (cu_q[1:] - cu_q[:-1]), (cu_k[1:] - cu_k[:-1])
    assert int(lq.max()) <= max_q and int(lk.max()) <= max_k, "max_seqlen smaller than a sequence"
    outs = []
    for n in range(cu_q.numel() - 1):
        a, z = int(cu_q[n]), int(cu_q[n + 1])
        ak, zk = int(cu_k[n]), int(cu_k[n + 1])
        if z == a:
            continue
        outs.append(attend(q[None, a:z], k[None, ak:zk], v[None, ak:zk], **kw)[0])
    return torch.cat(outs, 0) if outs else q.new_zeros(q.shape)


def _neg_to_none(x):
    return None if x is None or x < 0 else int(x)


# ---- FA2: flash_attn ----------------------------------------------------------------------


def fa2_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
             alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _check_common("fa2", q, k, v, 4)
    CALLS.append({"api": "fa2.func", "dropout_p": dropout_p, "window_size": window_size, "causal": causal,
                  "softcap": softcap, "deterministic": deterministic})
    return attend(q, k, v, scale=softmax_scale, causal=causal, left=_neg_to_none(window_size[0]),
                  right=_neg_to_none(window_size[1]), softcap=softcap, dropout_p=dropout_p)


def fa2_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
               deterministic=False, return_attn_probs=False, block_table=None):
    _check_common("fa2.varlen", q, k, v, 3)
    CALLS.append({"api": "fa2.varlen", "dropout_p": dropout_p, "window_size": window_size, "causal": causal,
                  "softcap": softcap, "cu_seqlens_q": cu_seqlens_q.tolist()})
    return attend_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=softmax_scale,
                         causal=causal, left=_neg_to_none(window_size[0]), right=_neg_to_none(window_size[1]),
                         softcap=softcap, dropout_p=dropout_p)


# ---- FA3: flash_attn_interface (hopper/) ----------------------------------------------------


def fa3_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None, v_descale=None,
             window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None,
             deterministic=False, sm_margin=0, return_attn_probs=False):
    _check_common("fa3", q, k, v, 4)
    CALLS.append({"api": "fa3.func", "window_size": window_size, "causal": causal, "softcap": softcap})
    return attend(q, k, v, scale=softmax_scale, causal=causal, left=_neg_to_none(window_size[0]),
                  right=_neg_to_none(window_size[1]), softcap=softcap)


def fa3_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None, seqused_k=None,
               softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None, v_descale=None,
               window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None,
               deterministic=False, sm_margin=0, return_attn_probs=False):
    _check_common("fa3.varlen", q, k, v, 3)
    CALLS.append({"api": "fa3.varlen", "window_size": window_size, "causal": causal, "softcap": softcap,
                  "cu_seqlens_q": cu_seqlens_q.tolist()})
    return attend_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=softmax_scale,
                         causal=causal, left=_neg_to_none(window_size[0]), right=_neg_to_none(window_size[1]),
                         softcap=softcap)


# ---- FA4: flash_attn.cute ------------------------------------------------------------------


def _fa4_window(window_size):
    left, right = window_size
    if left is not None and right is not None and left < 0 and right < 0:
        return None, None
    return left, right


def _lse_like(q: torch.Tensor, varlen: bool) -> torch.Tensor:
    # Shape only: (B, H, S) or (H, total); the adapters must drop it.
    if varlen:
        return torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32)
    return torch.zeros(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)


def fa4_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False, window_size=(None, None),
             learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, score_mod=None,
             score_mod_bwd=None, mask_mod=None, aux_tensors=None, aux_scalars=None, block_sparse_tensors=None,
             block_sparse_tensors_bwd=None, return_lse=False, gather_bwd_recompute_p=False,
             gather_bwd_token_chunk=None):
    _check_common("fa4", q, k, v, 4)
    assert softcap is not None, "fa4: softcap must be a float (0.0 = none); None breaks its backward"
    CALLS.append({"api": "fa4.func", "window_size": window_size, "causal": causal, "softcap": softcap})
    left, right = _fa4_window(window_size)
    out = attend(q, k, v, scale=softmax_scale, causal=causal, left=left, right=right, softcap=softcap)
    return out, _lse_like(q, False)


def fa4_varlen(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
               min_seqlen_k=None, seqused_q=None, seqused_k=None, gather_kv_indices=None, page_table=None,
               softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None, softcap=0.0,
               num_splits=1, pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
               block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, return_lse=False,
               scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False,
               gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
    _check_common("fa4.varlen", q, k, v, 3)
    assert softcap is not None, "fa4: softcap must be a float (0.0 = none)"
    CALLS.append({"api": "fa4.varlen", "window_size": window_size, "causal": causal, "softcap": softcap,
                  "cu_seqlens_q": cu_seqlens_q.tolist()})
    left, right = _fa4_window(window_size)
    out = attend_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=softmax_scale,
                        causal=causal, left=left, right=right, softcap=softcap)
    return out, _lse_like(q, True)
