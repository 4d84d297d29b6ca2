"""``attention`` contract -> ``torch_npu.npu_fusion_attention`` (Ascend's fused flash attention).

``torch_npu.npu_fusion_attention(query, key, value, head_num, input_layout, *, pse=None,
padding_mask=None, atten_mask=None, scale=1., keep_prob=1., pre_tockens=2147483647,
next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
actual_seq_kvlen=None, sparse_mode=0, ...)`` (torch_npu API reference) computes
``Dropout(Softmax(Mask(scale * q kᵀ, atten_mask)), keep_prob) @ v`` and returns a 7-tuple
whose ``[0]`` is the output, in the layout of the inputs. Autograd: op-plugin's
``derivatives.yaml`` gives ``query, key, value: npu_fusion_attention_grad(...)``. What the
docs fix, and how this adapter uses it:

* ``input_layout``: ``BNSD`` is the contract's ``[B, H, S, D]``; ``BSND`` is the model's own
  ``[B, S, H, D]``, of which transformers' q/k/v are transposed views: when all three are, they
  go as ``BSND`` (no copy) and the output comes back in the contract's ``[B, S, H, D]``;
  otherwise ``BNSD`` (``.contiguous()``) and the output is transposed once. ``TND`` is the
  varlen form (below).
* ``head_num`` is the QUERY's head count; key/value may have fewer heads if that count divides
  it (GQA, query head h reads key/value head h // (Hq / Hk), as transformers' repeat_kv): passed
  as they are, nothing is repeated. Limits: Hq <= 256, D <= 768, Dv <= Dq = Dk.
* ``atten_mask``: bool/uint8, **True = masked** (the contract's boolean mask is True = attend,
  so it goes negated), of shape BNSS, B1SS, 11SS or SS. ``sparse_mode=0`` computes everything a
  full mask allows (no mask: everything); ``pre_tockens``/``next_tockens`` narrow that to a band
  (top-left origin) the kernel may skip blocks outside of. ``sparse_mode=2`` / ``3`` are causal
  from the top-left / bottom-right corner and take the *compressed* mask
  ``triu(ones(2048, 2048), 1)`` (made once per device here) instead of an S x S one.
* ``scale`` multiplies ``q kᵀ`` (default 1, so it is always passed); ``keep_prob = 1 - dropout``
  in ``(0, 1]``.

What each call of the contract becomes (the core's ``eager``/``sdpa`` rules,
``veomni_ops.kernels.attention``):

* no mask, causal (``module.is_causal`` / ``is_causal``; more than one query): ``sparse_mode=2``,
  queries top-left aligned on the keys as eager and sdpa do; with a ``sliding_window`` shorter than
  the keys, an explicit window mask aligned to the end of the keys (``sparse_mode=0``, and the
  band ``pre_tockens = window - 1``, ``next_tockens = 0`` when queries and keys are as many);
  not causal: no mask.
* a 4-D boolean mask ``[B or 1, 1 or H, S, Sk]`` (transformers' sdpa mask builder, which the
  binding selects for this kernel): authoritative, negated, ``sparse_mode=0``. A row whose every
  key is masked (left padding) has no documented result without ``inner_precise=2`` (a slower
  mode); such rows attend to every key instead, so their output is finite: they are padding,
  nothing reads them, and they keep NaN out of the gradients. A 4-D *additive* mask is refused:
  the kernel takes no float mask.
* a 2-D ``[B, Sk]`` padding mask (the flash form, 1 = token): the boolean key mask, with the
  causal triangle (and window) aligned to the end of the keys, as flash kernels align it.
* packing (``veomni_ops.kernels.attention.packing_mask`` rules): ``cu_seq_lens_q/k`` without a
  mask or window become the varlen ``TND`` layout: the batch of one row is ``[T, H, D]``,
  ``actual_seq_qlen``/``actual_seq_kvlen`` are ``cu_seq_lens[1:]`` as Python lists (one host
  synchronisation per call: the operator takes ints), causal as ``sparse_mode=3`` (bottom-right
  within each document, as flash's varlen kernels); at most 1024 documents (the varlen limit).
  Otherwise (a mask as well, a window, restarting ``position_ids``) the core's block-diagonal
  mask, through the dense path.

Refused with a ``ValueError`` naming the argument: ``softcap`` (the kernel has no soft-capping),
attention sinks (``s_aux``), ``position_bias``, additive masks, dropout of 1 or more. float32 is
refused too: older torch_npu documents the kernel for float16/bfloat16 only. No attention
weights are returned.

NOT RUN ON AN ASCEND NPU: written from the torch_npu docs, transformers'
``integrations/npu_flash_attention.py`` and VeOmni's NPU code, tested against the stand-in.
"""

from __future__ import annotations

from typing import Any

import torch
from veomni_ops.kernels.attention import end_aligned_mask, is_causal, packing_mask
from veomni_ops.kernels.checks import check_kernel_dtype, where

from ._common import CHECKS, torch_npu

_OP = "attention"
_WHERE = where(_OP, "npu")
DTYPES = (torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 768  # D in 1..768
MAX_QUERY_HEADS = 256  # Nq in 1..256
MAX_VARLEN_SEQUENCES = 1024  # actual_seq_qlen: at most 1K entries in the varlen layout
COMPRESSED = 2048  # the compressed causal mask of sparse modes 2 and 3 is [2048, 2048]
LEFT_UP_CAUSAL, RIGHT_DOWN_CAUSAL = 2, 3
_KW = "the model's own attention implementation, or attn_implementation: eager"

_compressed: dict[torch.device, torch.Tensor] = {}


def _causal_mask(device: torch.device) -> torch.Tensor:
    """``triu(ones(2048, 2048), 1)`` (True = masked) on ``device``: what sparse modes 2 and 3 read."""
    m = _compressed.get(device)
    if m is None:
        m = _compressed[device] = torch.ones(COMPRESSED, COMPRESSED, dtype=torch.bool, device=device).triu(1)
    return m


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        CHECKS.check_tensor(t, name, _OP)
        check_kernel_dtype(t, name, _OP, backend="npu", kernels="Ascend's npu_fusion_attention kernels",
                           dtypes=DTYPES)
        CHECKS.check_ndim(t, 4, name, _OP, "[B, H, S, D] (transpose(1, 2) a [B, S, H, D] tensor first)")
    CHECKS.check_same_device(_OP, query=query, key=key, value=value)
    CHECKS.check_same_dtype(_OP, query=query, key=key, value=value)
    b, hq, _, d = query.shape
    if key.shape[0] != b or key.shape[:3] != value.shape[:3]:
        raise ValueError(f"{_WHERE}: key {tuple(key.shape)} and value {tuple(value.shape)} must be [B, Hk, Sk, D] "
                         f"with B = {b} like query {tuple(query.shape)}")
    hk = key.shape[1]
    if hk == 0 or hq % hk:
        raise ValueError(f"{_WHERE}: {hq} query heads is not a multiple of {hk} key/value heads (GQA needs Hq % Hk == 0)")
    if key.shape[3] != d or value.shape[3] > d:
        raise ValueError(f"{_WHERE}: npu_fusion_attention needs the head dims Dq = Dk >= Dv, got query {d}, "
                         f"key {key.shape[3]}, value {value.shape[3]}")
    if d > MAX_HEAD_DIM or hq > MAX_QUERY_HEADS:
        raise ValueError(f"{_WHERE}: npu_fusion_attention takes head dims up to {MAX_HEAD_DIM} and up to "
                         f"{MAX_QUERY_HEADS} query heads, got D = {d}, Hq = {hq}; use attn_implementation: sdpa")


def _check_unsupported(softcap: float | None, kwargs: dict[str, Any]) -> None:
    if softcap is not None:
        raise ValueError(f"{_WHERE}: softcap={softcap} cannot be honoured (npu_fusion_attention has no soft-capping); "
                         f"use {_KW}")
    if kwargs.get("s_aux") is not None:
        raise ValueError(f"{_WHERE}: attention sinks (s_aux) are not supported by npu_fusion_attention; use {_KW}")
    if kwargs.get("position_bias") is not None:
        raise ValueError(f"{_WHERE}: position_bias is not supported; use transformers' own attention implementation")


def _keep_prob(module: Any, dropout: float) -> float:
    """``1 - dropout`` while the module trains (transformers passes 0.0 otherwise), 1.0 in eval."""
    p = float(dropout or 0.0) if getattr(module, "training", True) else 0.0
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{_WHERE}: dropout={p} must be in [0, 1): npu_fusion_attention keeps 1 - dropout of the "
                         "weights, and keep_prob must be in (0, 1]")
    return 1.0 - p


def _from_padding(mask: torch.Tensor, sq: int, sk: int, causal: bool, window: int | None) -> torch.Tensor:
    """A 2-D ``[B, Sk]`` padding mask (1 = token) as the boolean ``[B, 1, Sq, Sk]`` mask it means."""
    if mask.shape[1] != sk:
        raise ValueError(f"{_WHERE}: the 2-D attention_mask {tuple(mask.shape)} must be [B, Sk] with Sk = {sk}")
    allowed = mask.bool()[:, None, None, :]
    if causal and sq > 1:
        return allowed & end_aligned_mask(sq, sk, window, mask.device)
    return allowed.expand(-1, -1, sq, -1)


def _cu_ends(cu: Any, name: str, length: int) -> list[int]:
    """``cu_seq_lens`` (0, ends...) as the cumulative ends npu_fusion_attention takes (no leading 0)."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2 or cu.is_floating_point():
        raise ValueError(f"{_WHERE}: {name} must be a 1-D integer tensor (0, ends...), got "
                         f"{tuple(cu.shape) if isinstance(cu, torch.Tensor) else type(cu).__name__}")
    vals = [int(v) for v in cu.tolist()]  # the operator takes Python ints: one host synchronisation
    if vals[0] != 0 or vals[-1] != length or any(b < a for a, b in zip(vals, vals[1:])):
        raise ValueError(f"{_WHERE}: {name} = {vals[:8]}{'...' if len(vals) > 8 else ''} must start at 0, never "
                         f"decrease and end at the packed length {length}")
    if len(vals) - 1 > MAX_VARLEN_SEQUENCES:
        raise ValueError(f"{_WHERE}: {name} describes {len(vals) - 1} sequences; npu_fusion_attention's varlen layout "
                         f"takes at most {MAX_VARLEN_SEQUENCES} (coalesce padding into one sequence, or pack fewer)")
    return vals[1:]


def _varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kwargs: dict[str, Any], causal: bool,
            scale: float, keep_prob: float) -> torch.Tensor:
    """Packed documents of a batch of one row through the ``TND`` layout; returns ``[1, S, Hq, Dv]``."""
    b, hq, sq, _ = query.shape
    if b != 1:
        raise ValueError(f"{_WHERE}: cu_seq_lens_q/k describe a packed batch of one row [1, total], but query has "
                         f"batch size {b}; flatten the batch into one row (as the packing collator does)")
    ends_q = _cu_ends(kwargs["cu_seq_lens_q"], "cu_seq_lens_q", sq)
    ends_k = _cu_ends(kwargs["cu_seq_lens_k"], "cu_seq_lens_k", key.shape[2])
    if len(ends_q) != len(ends_k):
        raise ValueError(f"{_WHERE}: cu_seq_lens_q has {len(ends_q)} documents, cu_seq_lens_k {len(ends_k)}; "
                         "they must describe the same documents")
    if causal:
        lens = [(bq - aq, bk - ak) for aq, bq, ak, bk in zip([0, *ends_q], ends_q, [0, *ends_k], ends_k)]
        if any(nq > nk for nq, nk in lens):
            # bottom-right causal would mask whole rows, which the varlen layout does not take
            raise ValueError(f"{_WHERE}: a causal packed document has more queries than keys ({lens[:4]}...); "
                             "npu_fusion_attention's varlen layout takes no fully masked rows")
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # [T, H, D]
    out = torch_npu.npu_fusion_attention(
        q, k, v, hq, "TND", atten_mask=_causal_mask(q.device) if causal else None, scale=scale,
        keep_prob=keep_prob, actual_seq_qlen=ends_q, actual_seq_kvlen=ends_k,
        sparse_mode=RIGHT_DOWN_CAUSAL if causal else 0,
    )[0]
    return out[None]


def _as_kernel_mask(allowed: torch.Tensor, b: int, hq: int, sq: int, sk: int) -> torch.Tensor:
    """A boolean True = attend ``[B or 1, H or 1, Sq, Sk]`` mask as the kernel's True = masked one,
    in a documented shape (BNSS, B1SS, 11SS); rows with no key to attend to attend to all."""
    mb, mh, mq, mk = allowed.shape
    if mb not in (1, b) or mh not in (1, hq) or (mq, mk) != (sq, sk):
        raise ValueError(f"{_WHERE}: attention_mask {tuple(allowed.shape)} must be [B or 1, 1 or H, S, Sk] "
                         f"with B = {b}, H = {hq}, S = {sq}, Sk = {sk}")
    if mh == hq > 1 and mb != b:
        allowed = allowed.expand(b, -1, -1, -1)  # 1NSS is not a documented mask shape; BNSS is
    empty = ~allowed.any(dim=-1, keepdim=True)
    return (~(allowed | empty)).contiguous()


def _given_mask(mask: Any, sq: int, sk: int, causal: bool, window: int | None) -> torch.Tensor | None:
    """The call's mask as a boolean 4-D one (True = attend), or None; an additive mask is refused."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 4):
        raise TypeError(f"{_WHERE}: attention_mask must be a 4-D boolean mask, a 2-D [B, Sk] padding mask or None, "
                        f"got {getattr(mask, 'shape', type(mask).__name__)}")
    if mask.dim() == 2:
        return _from_padding(mask, sq, sk, causal, window)
    if mask.dtype != torch.bool:
        raise ValueError(f"{_WHERE}: a 4-D additive ({mask.dtype}) attention_mask cannot be honoured: "
                         "npu_fusion_attention takes a boolean mask. Let transformers build the boolean one (its "
                         "sdpa mask builder, which veomni-ops binds for this kernel), or use attn_implementation: eager")
    return mask


def _causal_call(sq: int, sk: int, window: int | None, device: torch.device) -> dict[str, Any]:
    """The mask arguments of a causal call without a mask: the compressed top-left causal mask, or
    an end-aligned window mask (with its band when queries and keys are as many)."""
    if window is None or window >= sk:
        return {"atten_mask": _causal_mask(device), "sparse_mode": LEFT_UP_CAUSAL}
    call: dict[str, Any] = {"atten_mask": ~end_aligned_mask(sq, sk, int(window), device)}
    if sq == sk:  # the band the mask is, for the kernel to skip the blocks outside it
        call["pre_tockens"], call["next_tockens"] = int(window) - 1, 0
    return call


def npu_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention through ``npu_fusion_attention``; ``[B, Hq, S, D]`` query, ``[B, Hk, Sk, D]`` key/value,
    returns ``([B, S, Hq, Dv], None)`` (see the module docstring for masks, packing and windows)."""
    _check(query, key, value)
    _check_unsupported(softcap, kwargs)
    if sliding_window is not None and int(sliding_window) < 1:
        raise ValueError(f"{_WHERE}: sliding_window must be >= 1, got {sliding_window}")
    keep_prob = _keep_prob(module, dropout)
    scale = float(scaling) if scaling is not None else float(getattr(module, "head_dim", query.shape[-1]) ** -0.5)
    b, hq, sq, _ = query.shape
    sk = key.shape[2]
    if query.numel() == 0 or sk == 0:
        if sk == 0 and query.numel():
            raise ValueError(f"{_WHERE}: no keys to attend to (key {tuple(key.shape)})")
        return query.new_zeros(b, sq, hq, value.shape[-1]) + query.sum() * 0, None  # empty, still in the graph
    causal = is_causal(module, kwargs)
    attention_mask = _given_mask(attention_mask, sq, sk, causal, sliding_window)
    packed = kwargs.get("cu_seq_lens_q") is not None and kwargs.get("cu_seq_lens_k") is not None
    if packed and attention_mask is None and not (causal and sliding_window is not None):
        return _varlen(query, key, value, kwargs, causal, scale, keep_prob), None
    allowed = packing_mask(module, query, key, attention_mask, sliding_window, kwargs, "npu")
    call: dict[str, Any] = {"scale": scale, "keep_prob": keep_prob}
    if allowed is not None:
        call["atten_mask"] = _as_kernel_mask(allowed, b, hq, sq, sk)
    elif causal and sq > 1:
        call.update(_causal_call(sq, sk, sliding_window, query.device))
    if all(t.transpose(1, 2).is_contiguous() for t in (query, key, value)):
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # the model's [B, S, H, D]: no copy
        out = torch_npu.npu_fusion_attention(q, k, v, hq, "BSND", **call)[0]
        return out, None
    q, k, v = (t.contiguous() for t in (query, key, value))
    out = torch_npu.npu_fusion_attention(q, k, v, hq, "BNSD", **call)[0]
    return out.transpose(1, 2).contiguous(), None
