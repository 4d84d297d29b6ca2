"""Attention with transformers' ``AttentionInterface`` signature: ``eager`` and ``sdpa``.

``eager_attention`` is transformers' ``eager_attention_forward`` (the Gemma-2 form, which
adds logit soft-capping): scores in the input dtype, softmax in float32, dropout when
``module.training``, returns the weights. ``sdpa_attention`` is transformers'
``sdpa_attention_forward``: same GQA / ``is_causal`` / key-slicing rules, dropout passed
through as given (transformers' models pass ``0.0`` when not training), no weights.

Masks: the 4-D mask transformers builds for the implementation (additive float or
boolean, ``[B or 1, 1 or H, S, Sk]``) is authoritative: it already encodes causality,
padding, packing and any sliding window. Without a mask, causality comes from
``kwargs["is_causal"]`` / ``module.is_causal`` (default True) and, if ``sliding_window`` is
given and shorter than the keys, the window is applied too. ``eager`` follows the same
rules as ``sdpa`` there (transformers' eager never receives ``None`` for a causal model).

Packed sequences (several documents in one row, no padding) are honoured by both kernels,
never ignored (:func:`packing_mask`):

* a 4-D ``attention_mask`` is authoritative: transformers builds it block-diagonal from
  packed ``position_ids`` for these implementations, so nothing else is read;
* ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (the flash-attention varlen form: a batch of one row,
  ``[1, total]``) become a block-diagonal mask (causal within each document, bottom-right
  aligned as flash's varlen kernels, with the sliding window if one is given), ANDed with the
  given mask; ``max_length_q`` / ``max_length_k`` only size a varlen launch, so they are
  accepted beside their ``cu_seq_lens`` and refused without them;
* without a mask or ``cu_seq_lens``, ``position_ids`` ``[S]`` / ``[B or 1, S]`` (``S`` = the
  query and key length) that restart within a row (a position that does not continue the
  previous one by +1: transformers' and veomni-flash's rule) become the same block mask. Telling
  whether they restart is one host synchronisation, made once per ``position_ids`` tensor
  (cached on its identity and version: the layers of a forward share one). Under
  ``torch.compile`` it cannot be made (it would break the graph), so the mask is built whenever
  ``position_ids`` are given -- unless the compiled call was told, by code running eagerly
  around it, that they do not restart (:func:`positions_checked`; ``veomni_ops.compile_layers``
  does that around each compiled decoder layer): then a row of one document keeps sdpa's flash
  path (``is_causal``, no ``[B, 1, S, S]`` mask). Position ids
  of any other shape (``[3, B, S]`` multimodal rotary positions, a sequence-parallel shard)
  carry no packing: packed batches of those come with the mask or ``cu_seq_lens``.

Refusals are ``ValueError`` naming the argument and the kernels that honour it. The block
mask is ``[B, 1, S, Sk]`` booleans, and sdpa leaves its fast kernels for it: so on CUDA (capability
>= 8.0, bf16/fp16, outside ``torch.compile``) ``sdpa`` hands a packed self-attention call with
no mask, dropout, window or soft-capping to torch's own FlashAttention varlen kernel
(``torch.nn.attention.varlen``, torch >= 2.10), which takes the documents' cumulative lengths
and needs no mask (:func:`_varlen_packed`); veomni-flash's varlen kernels are the others.

Attention sinks (GPT-OSS's ``s_aux``: one learned logit per head that joins every row's
softmax and is then dropped) are honoured by ``eager``, as GPT-OSS's own eager attention.
Arguments a kernel cannot honour raise ``ValueError``: ``softcap`` and ``s_aux`` in sdpa,
and ``position_bias`` in both.

``flex_attention_kernel`` is PyTorch's FlexAttention (``torch.nn.attention.flex_attention``)
under the same contract: the mask rules above, GQA through ``enable_gqa``, soft-capping as a
``score_mod``. The mask it is given decides the form: a ``BlockMask`` (transformers' mask
builder for ``flex_attention`` makes one, with causality, padding, packing and the window in
it) is used as it is; a boolean 4-D mask becomes a ``mask_mod``, an additive one a
``score_mod`` that adds it; without a mask, causality, the window and the packing arguments
become a ``mask_mod`` (the block mask of a plain causal or windowed call is cached per shape
and device). On CUDA, outside ``torch.compile``, the call goes through a compiled
FlexAttention (one compilation per shape, as transformers does): that is the fused kernel;
uncompiled FlexAttention is PyTorch's unfused reference. It returns no weights and has no
dropout (a dropout above zero raises), no sinks and no ``position_bias``. PyTorch's
FlexAttention has no backward on the CPU: there it runs forward only (without gradients).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from ...kernels.checks import can_read_values, check_float, check_integer, check_ndim, check_same_device

#: Its kernels, and the input checks they use (:mod:`veomni_ops.kernels.checks`): what
#: ``veomni_ops.kernels.<module>`` re-exports.
__all__ = ["FLEX_MIN_HEAD_DIM_CUDA", "can_read_values", "check_float", "check_integer", "check_ndim",
    "check_same_device", "eager_attention", "end_aligned_mask", "flex_attention_kernel", "flex_head_dim_problem",
    "is_causal", "packing_mask", "positions_checked", "sdpa_attention"]

_OP = "attention"
#: Who else honours the packing arguments, for refusals.
_VARLEN = "veomni-flash's flash_attention_2/3/4 (varlen) and eager/sdpa"


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, kind: str) -> int:
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_float(t, name, _OP)
        check_ndim(t, 4, name, _OP, "[B, H, S, D] (transpose(1, 2) a [B, S, H, D] tensor first)")
    check_same_device(_OP, query=query, key=key, value=value)
    if query.dtype != key.dtype or key.dtype != value.dtype:
        raise TypeError(
            f"{_OP} '{kind}': query/key/value dtypes differ ({query.dtype}, {key.dtype}, {value.dtype}); cast them to one"
        )
    b, hq, _, d = query.shape
    if key.shape[0] != b or value.shape[0] != b or key.shape[1] != value.shape[1] or key.shape[2] != value.shape[2]:
        raise ValueError(
            f"{_OP} '{kind}': key {tuple(key.shape)} and value {tuple(value.shape)} must be [B, Hk, Sk, D] with "
            f"B = {b} like query {tuple(query.shape)}"
        )
    if key.shape[3] != d:
        raise ValueError(f"{_OP} '{kind}': key head dim {key.shape[3]} differs from query head dim {d}")
    hk = key.shape[1]
    if hk == 0 or hq % hk:
        raise ValueError(
            f"{_OP} '{kind}': {hq} query heads is not a multiple of {hk} key/value heads (GQA needs Hq % Hk == 0)"
        )
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(
                f"{_OP} '{kind}': attention_mask must be a 4-D tensor or None, got {type(attention_mask).__name__}"
            )
        if attention_mask.dim() != 4 or attention_mask.shape[-1] != key.shape[2]:
            raise ValueError(
                f"{_OP} '{kind}': attention_mask {tuple(attention_mask.shape)} must be the 4-D mask transformers "
                f"builds, [B, 1, S, Sk] with Sk = {key.shape[2]} (a 2-D padding mask goes to the model, not here)"
            )
        if attention_mask.dtype != torch.bool and not attention_mask.dtype.is_floating_point:
            raise TypeError(
                f"{_OP} '{kind}': attention_mask has dtype {attention_mask.dtype}; it must be boolean (True = attend) "
                "or an additive float mask"
            )
    return hq // hk


def _check_unsupported(kind: str, softcap: float | None, kwargs: dict[str, Any]) -> None:
    if kwargs.get("s_aux") is not None and kind != "eager":
        raise ValueError(
            f"{_OP} '{kind}': attention sinks (s_aux) are not supported; use the model's own attention "
            "implementation or a kernel that implements sinks"
        )
    if kwargs.get("position_bias") is not None:
        raise ValueError(
            f"{_OP} '{kind}': position_bias is not supported; use transformers' own attention implementation for this model"
        )
    if softcap is not None and kind == "sdpa":
        raise ValueError(
            f"{_OP} 'sdpa': softcap={softcap} cannot be honoured by scaled_dot_product_attention; "
            "set attn_implementation: eager (or a flash kernel that supports softcap)"
        )


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def is_causal(module: Any, kwargs: dict[str, Any]) -> bool:
    """Is this call causal: the call's ``is_causal`` keyword, else the module's ``is_causal``
    attribute, else True (how transformers' attention functions read it). Public, for backends."""
    flag = kwargs.get("is_causal")
    return bool(flag) if flag is not None else bool(getattr(module, "is_causal", True))


def end_aligned_mask(q_len: int, kv_len: int, window: int | None, device: torch.device) -> torch.Tensor:
    """Boolean ``[q, kv]`` mask (True = attend): causal with the queries aligned to the end of the
    keys, within the last ``window`` keys (the query's own included) when ``window`` is given.
    Public, for backends whose kernels take an explicit mask."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    kv_pos = torch.arange(kv_len, device=device)[None, :]
    allowed = kv_pos <= q_pos
    return allowed & (kv_pos > q_pos - window) if window is not None else allowed


# --------------------------------------------------------------------------- packing
def _check_cu(cu: Any, name: str, length: int, kind: str) -> torch.Tensor:
    if not isinstance(cu, torch.Tensor):
        raise ValueError(f"{_OP} '{kind}': {name} must be a 1-D integer tensor of cumulative lengths, "
                         f"got {type(cu).__name__}")
    check_integer(cu, name, _OP, backend=kind)
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{_OP} '{kind}': {name} must be 1-D [documents + 1] (0, ends...), got shape {tuple(cu.shape)}")
    if can_read_values(cu):
        vals = cu.tolist()
        if vals[0] != 0 or vals[-1] != length or any(b < a for a, b in zip(vals, vals[1:])):
            raise ValueError(
                f"{_OP} '{kind}': {name} = {vals[:8]}{'...' if len(vals) > 8 else ''} must start at 0, never decrease "
                f"and end at the packed length {length}"
            )
    return cu.long()


def _segments_from_cu(cu: torch.Tensor, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position of a packed row: its document id and its offset inside the document."""
    pos = torch.arange(length, device=device)
    cu = cu.to(device)
    seg = torch.searchsorted(cu[1:], pos, right=True).clamp(max=cu.numel() - 2)
    return seg, pos - cu[seg]


def _cu_block_mask(cq: torch.Tensor, ck: torch.Tensor, sq: int, sk: int, causal: bool, window: int | None,
                   device: torch.device) -> torch.Tensor:
    """Boolean ``[Sq, Sk]``: same document and, if causal, key not after the query -- bottom-right
    aligned inside the document, as flash's varlen kernels -- and within ``window`` keys."""
    seg_q, off_q = _segments_from_cu(cq, sq, device)
    seg_k, off_k = _segments_from_cu(ck, sk, device)
    allowed = seg_q[:, None] == seg_k[None, :]
    if causal:
        cq, ck = cq.to(device), ck.to(device)
        shift = (ck[1:] - ck[:-1]) - (cq[1:] - cq[:-1])  # per document: keys - queries
        q_on_k = (off_q + shift[seg_q])[:, None]  # the query's position on its document's key axis
        allowed = allowed & (off_k[None, :] <= q_on_k)
        if window is not None:
            allowed = allowed & (off_k[None, :] > q_on_k - window)
    return allowed


_RESTARTS: dict[int, tuple[weakref.ref, int, bool]] = {}

#: While a compiled call runs inside :func:`positions_checked`: the shape of its ``position_ids``,
#: found (eagerly, before the call) not to restart; else None. Dynamo reads it as a constant and
#: guards on it, so a call with restarting (packed) positions compiles its own graph, with the mask.
_UNPACKED_SHAPE: tuple[int, ...] | None = None


def _restarts(position_ids: torch.Tensor) -> bool:
    """Whether ``[B', S]`` position ids restart within a row: one host synchronisation, cached
    per tensor (identity and version) so that the layers of one forward pay it once."""
    key = id(position_ids)
    hit = _RESTARTS.get(key)
    if hit is not None and hit[0]() is position_ids and hit[1] == position_ids._version:
        return hit[2]
    result = bool((position_ids[:, 1:] != position_ids[:, :-1] + 1).any()) if position_ids.shape[-1] > 1 else False
    if len(_RESTARTS) > 64:
        for k in [k for k, v in _RESTARTS.items() if v[0]() is None] or list(_RESTARTS)[:32]:
            _RESTARTS.pop(k, None)
    try:
        _RESTARTS[key] = (weakref.ref(position_ids), position_ids._version, result)
    except TypeError:  # a tensor type without weak references: no caching
        pass
    return result


def _positions_2d(pos: Any, sq: int | None = None) -> torch.Tensor | None:
    """``position_ids`` as ``[B', S]`` when they can carry packing (``[S]`` or ``[B', S]`` integers,
    ``S`` = ``sq`` where given), else None (e.g. ``[3, B, S]`` multimodal positions)."""
    if not isinstance(pos, torch.Tensor) or pos.dim() not in (1, 2) or pos.is_floating_point():
        return None
    if sq is not None and pos.shape[-1] != sq:
        return None
    return pos.reshape(-1, pos.shape[-1]) if pos.dim() == 1 else pos


@contextlib.contextmanager
def positions_checked(position_ids: Any) -> Iterator[None]:
    """Run a compiled call (a decoder layer) knowing whether the ``position_ids`` it passes to
    attention restart. Call it eagerly, outside the compiled code: it checks them (one host
    synchronisation per tensor, cached as the kernels' own check) and, where they do not
    restart, lets :func:`packing_mask` inside the call leave the mask out, as it does eagerly.
    The kernel trusts the check only for position ids of the shape checked (a sequence-parallel
    kernel sees the gathered ones, of another shape, and builds the mask as before). Nesting
    restores the outer state; anything not a ``[S]`` / ``[B', S]`` integer tensor is no check."""
    global _UNPACKED_SHAPE
    pos = _positions_2d(position_ids)
    before = _UNPACKED_SHAPE
    _UNPACKED_SHAPE = None if pos is None or _restarts(pos) else tuple(position_ids.shape)
    try:
        yield
    finally:
        _UNPACKED_SHAPE = before


def packing_mask(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sliding_window: int | None,
    kwargs: dict[str, Any],
    kind: str,
) -> torch.Tensor | None:
    """The attention mask with the packing arguments honoured (module docstring), or
    ``attention_mask`` unchanged when there is nothing to honour."""
    b, _, sq, _ = query.shape
    sk = key.shape[2]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    for m, cu, cu_name in (("max_length_q", cu_q, "cu_seq_lens_q"), ("max_length_k", cu_k, "cu_seq_lens_k")):
        if kwargs.get(m) is not None and cu is None:
            raise ValueError(
                f"{_OP} '{kind}': {m} is given without {cu_name}; it only sizes a varlen launch. Pass the packing "
                f"itself ({cu_name}), which {_VARLEN} honour"
            )
    causal = is_causal(module, kwargs)
    window = sliding_window if causal else None
    if cu_q is not None or cu_k is not None:
        if cu_q is None or cu_k is None:
            given, missing = ("cu_seq_lens_q", "cu_seq_lens_k") if cu_q is not None else ("cu_seq_lens_k", "cu_seq_lens_q")
            raise ValueError(f"{_OP} '{kind}': {given} is given without {missing}; packed attention needs both "
                             f"({_VARLEN} honour the pair)")
        if b != 1:
            raise ValueError(
                f"{_OP} '{kind}': cu_seq_lens_q/k describe a packed batch of one row [1, total], but query has batch "
                f"size {b}; flatten the batch into one row (as the packing collator does) or pass a 4-D mask"
            )
        cq = _check_cu(cu_q, "cu_seq_lens_q", sq, kind)
        ck = _check_cu(cu_k, "cu_seq_lens_k", sk, kind)
        if cq.numel() != ck.numel():
            raise ValueError(f"{_OP} '{kind}': cu_seq_lens_q has {cq.numel() - 1} documents, cu_seq_lens_k "
                             f"{ck.numel() - 1}; they must describe the same documents")
        block = _cu_block_mask(cq, ck, sq, sk, causal, window, query.device)[None, None]
    elif attention_mask is None and kwargs.get("position_ids") is not None and sq == sk:
        given = kwargs["position_ids"]
        pos = _positions_2d(given, sq)
        if pos is None or pos.shape[0] not in (1, b):
            return attention_mask  # not packing information (e.g. [3, B, S] multimodal positions)
        if torch.compiler.is_compiling():
            if _UNPACKED_SHAPE is not None and tuple(given.shape) == _UNPACKED_SHAPE:
                return attention_mask  # checked eagerly around this compiled call (positions_checked)
        elif not _restarts(pos):
            return attention_mask  # one document per row: the causal default is the packing
        pos = pos.to(query.device)
        starts = torch.ones_like(pos, dtype=torch.bool)
        starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
        seg = starts.long().cumsum(-1) - 1  # [B', S]
        idx = torch.arange(sq, device=query.device).expand_as(seg)
        first = torch.zeros_like(seg).scatter_reduce(-1, seg, idx, reduce="amin", include_self=False)
        off = idx - first.gather(-1, seg)
        allowed = seg[:, :, None] == seg[:, None, :]
        if causal:
            allowed = allowed & (off[:, None, :] <= off[:, :, None])
            if window is not None:
                allowed = allowed & (off[:, None, :] > off[:, :, None] - window)
        block = allowed[:, None]  # [B', 1, S, S]
    else:
        return attention_mask
    if attention_mask is None:
        return block
    if attention_mask.dtype == torch.bool:
        return attention_mask & block
    return attention_mask.masked_fill(~block, torch.finfo(attention_mask.dtype).min)


def eager_attention(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit ``softmax(q kᵀ * scaling [softcapped] + mask) v``; returns ``([B, S, Hq, D], weights)``."""
    n_rep = _check(query, key, value, attention_mask, "eager")
    _check_unsupported("eager", softcap, kwargs)
    attention_mask = packing_mask(module, query, key, attention_mask, sliding_window, kwargs, "eager")
    if scaling is None:
        scaling = getattr(module, "head_dim", query.shape[-1]) ** -0.5
    q_len = query.shape[2]
    if attention_mask is None and q_len > 1 and is_causal(module, kwargs):
        # The same rule as sdpa: a causal call without a mask is top-left aligned on the first q_len keys
        # (transformers slices them off for sdpa), unless a sliding window asks for its own mask.
        kv_len = key.shape[2]
        if sliding_window is not None and sliding_window < kv_len:
            attention_mask = end_aligned_mask(q_len, kv_len, sliding_window, query.device)[None, None]
        else:
            key, value = key[:, :, :q_len], value[:, :, :q_len]
            attention_mask = end_aligned_mask(q_len, q_len, None, query.device)[None, None]
    key_states = _repeat_kv(key, n_rep)
    value_states = _repeat_kv(value, n_rep)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        attn_weights = torch.tanh(attn_weights / softcap) * softcap
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            attn_weights = attn_weights.masked_fill(~attention_mask, torch.finfo(attn_weights.dtype).min)
        else:
            attn_weights = attn_weights + attention_mask
    softmax_dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        b, h, s, _ = attn_weights.shape
        if sinks.shape != (h,):
            raise ValueError(f"{_OP} 'eager': s_aux (attention sinks) must be [H] = [{h}], got {tuple(sinks.shape)}")
        col = sinks.to(attn_weights.dtype).reshape(1, h, 1, 1).expand(b, h, s, 1)
        attn_weights = F.softmax(torch.cat([attn_weights, col], dim=-1), dim=-1, dtype=softmax_dtype)[..., :-1]
        attn_weights = attn_weights.to(query.dtype)
    else:
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=softmax_dtype).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


@functools.cache
def _varlen_kernel() -> Any:
    """torch's FlashAttention varlen kernel (``torch.nn.attention.varlen.varlen_attn``, torch >=
    2.10), or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _varlen_usable(query: torch.Tensor) -> bool:
    """Can torch's varlen kernel take this query: CUDA (not ROCm) of capability >= 8.0, half precision."""
    return (query.device.type == "cuda" and torch.version.hip is None and query.dtype in (torch.float16, torch.bfloat16)
            and torch.cuda.get_device_capability(query.device)[0] >= 8 and _varlen_kernel() is not None)


def _packed_cu(kwargs: dict[str, Any], b: int, s: int) -> tuple[torch.Tensor, int] | None:
    """The documents of a packed self-attention call over the flattened ``[b * s]`` tokens: the
    cumulative lengths (int32) and the longest; None where the call is not packed (or gives
    ``cu_seq_lens`` that :func:`packing_mask` refuses or that differ for queries and keys)."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None or cu_k is not None:
        if cu_q is None or cu_k is None or b != 1 or not (cu_q is cu_k or torch.equal(cu_q, cu_k)):
            return None
        cu = _check_cu(cu_q, "cu_seq_lens_q", s, "sdpa")
        given = kwargs.get("max_length_q")
        longest = int(given) if given is not None else int((cu[1:] - cu[:-1]).max())
        return cu.to(torch.int32), longest
    pos = _positions_2d(kwargs.get("position_ids"), s)
    if pos is None or pos.shape[0] not in (1, b) or not _restarts(pos):
        return None
    pos = pos.expand(b, s)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    ends = torch.tensor([b * s], device=pos.device)
    cu = torch.cat([starts.reshape(-1).nonzero().flatten(), ends]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def _varlen_packed(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                   dropout: float, scaling: float | None, sliding_window: int | None, softcap: float | None,
                   kwargs: dict[str, Any]) -> torch.Tensor | None:
    """A packed row (``position_ids`` restarting, or ``cu_seq_lens``) through torch's varlen
    kernel, as ``[B, S, Hq, D]``: each document attends to itself alone, with no ``[S, S]`` mask
    (the mask sdpa needs for one holds S^2 booleans and leaves sdpa's fast kernels: on an H100 at
    32k tokens a row, 226 ms forward + backward against 17 ms, ``benchmarks/results/
    h100-2026-12-06-attention-long-rows/``). None where it does not apply: a mask given, dropout,
    a window, soft-capping, cross-attention, head dims over 256, not packed, or a device or dtype
    the kernel does not take; the call then goes on as before (the block mask)."""
    if (attention_mask is not None or dropout or softcap is not None or sliding_window is not None
            or torch.compiler.is_compiling() or not _varlen_usable(query)):
        return None
    b, hq, s, d = query.shape
    hk = key.shape[1]
    if key.shape[2] != s or value.shape[-1] != d or d > 256:
        return None
    packed = _packed_cu(kwargs, b, s)
    if packed is None:
        return None
    cu, longest = packed
    fn = _varlen_kernel()
    params = inspect.signature(fn).parameters
    q = query.transpose(1, 2).reshape(b * s, hq, d)
    k = key.transpose(1, 2).reshape(b * s, hk, d)
    v = value.transpose(1, 2).reshape(b * s, hk, d)
    extra: dict[str, Any] = {}
    if hk != hq:
        if "enable_gqa" in params:
            extra["enable_gqa"] = True
        else:  # query head h reads key/value head h // (hq / hk), as sdpa's enable_gqa
            k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
    causal = is_causal(module, kwargs)
    if "is_causal" in params:
        extra["is_causal"] = causal
    else:
        extra["window_size"] = (-1, 0) if causal else (-1, -1)
    out = fn(q, k, v, cu, cu, longest, longest, scale=scaling, **extra)
    return out.view(b, s, hq, d)


def sdpa_attention(
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
    """``F.scaled_dot_product_attention`` as transformers calls it; returns ``([B, S, Hq, D], None)``."""
    n_rep = _check(query, key, value, attention_mask, "sdpa")
    _check_unsupported("sdpa", softcap, kwargs)
    packed = _varlen_packed(module, query, key, value, attention_mask, dropout, scaling, sliding_window, softcap,
                            kwargs)
    if packed is not None:
        return packed, None
    attention_mask = packing_mask(module, query, key, attention_mask, sliding_window, kwargs, "sdpa")
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = q_len > 1 and attention_mask is None and is_causal(module, kwargs)
    if causal and sliding_window is not None and sliding_window < kv_len:
        attention_mask = end_aligned_mask(q_len, kv_len, sliding_window, query.device)[None, None]
        causal = False
    extra: dict[str, Any] = {}
    if n_rep > 1:
        # Native GQA only where sdpa keeps its fast kernels: no mask and head dim <= 256.
        if attention_mask is None and key.shape[-1] == value.shape[-1] <= 256:
            extra["enable_gqa"] = True
        else:
            key, value = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)
    if causal and kv_len > q_len:
        # sdpa's causal mask is top-left aligned; transformers drops the (empty) keys past q_len.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    attn_output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal, **extra
    )
    return attn_output.transpose(1, 2).contiguous(), None


# --------------------------------------------------------------------------- flex_attention
_FLEX = "flex_attention"
#: Plain causal / windowed block masks by (device, Sq, Sk, window): the same for every layer and step.
_FLEX_BLOCKS: dict[tuple[Any, ...], Any] = {}
_flex_compiled: Any = None


#: The smallest head dim compiled FlexAttention lowers on CUDA (Inductor, torch 2.11: "NYI:
#: embedding dimension of the query, key, and value must be at least 16"; seen on an H100).
FLEX_MIN_HEAD_DIM_CUDA = 16


def flex_head_dim_problem(device_type: str, head_dim: int) -> str | None:
    """Why FlexAttention cannot run this head dim on this device (``None``: it can)."""
    if device_type == "cuda" and head_dim < FLEX_MIN_HEAD_DIM_CUDA:
        return (f"{_OP} '{_FLEX}': head dim {head_dim} < {FLEX_MIN_HEAD_DIM_CUDA}, which compiled FlexAttention "
                "does not lower on CUDA; use attn_implementation: sdpa or eager for this model")
    return None


def _flex_fn(query: torch.Tensor) -> Any:
    """FlexAttention: compiled on CUDA outside torch.compile (the fused kernel), as it is elsewhere."""
    from torch.nn.attention.flex_attention import flex_attention as flex

    global _flex_compiled
    if query.device.type != "cuda" or torch.compiler.is_compiling():
        return flex
    if _flex_compiled is None:
        _flex_compiled = torch.compile(flex, dynamic=False)
    return _flex_compiled


def _causal_mod(offset: int, window: int | None) -> Any:
    """``mask_mod`` of a causal call without a mask: query ``i`` sits at key position ``i + offset``."""
    if window is None:
        def causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return kv_idx <= q_idx + offset
        return causal

    def windowed(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        q_pos = q_idx + offset
        return (kv_idx <= q_pos) & (kv_idx > q_pos - window)
    return windowed


def _dense_mod(mask: torch.Tensor) -> Any:
    """``mask_mod`` reading a boolean ``[B or 1, H or 1, S, Sk]`` mask."""
    per_batch, per_head = mask.shape[0] > 1, mask.shape[1] > 1

    def dense(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return mask[b if per_batch else 0, h if per_head else 0, q_idx, kv_idx]
    return dense


def _additive_mod(mask: torch.Tensor, inner: Any) -> Any:
    """``score_mod`` adding an additive ``[B or 1, H or 1, S, Sk]`` mask after ``inner`` (soft-capping)."""
    per_batch, per_head = mask.shape[0] > 1, mask.shape[1] > 1

    def additive(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        if inner is not None:
            score = inner(score, b, h, q_idx, kv_idx)
        return score + mask[b if per_batch else 0, h if per_head else 0, q_idx, kv_idx]
    return additive


def _softcap_mod(softcap: float) -> Any:
    def capped(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return torch.tanh(score / softcap) * softcap
    return capped


def _block_mask(mod: Any, b: int | None, h: int | None, sq: int, sk: int, device: torch.device,
                cache_key: tuple[Any, ...] | None = None) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    if cache_key is None or torch.compiler.is_compiling():
        return create_block_mask(mod, b, h, sq, sk, device=device)
    hit = _FLEX_BLOCKS.get(cache_key)
    if hit is None:
        if len(_FLEX_BLOCKS) >= 32:
            _FLEX_BLOCKS.clear()
        hit = _FLEX_BLOCKS[cache_key] = create_block_mask(mod, b, h, sq, sk, device=device)
    return hit


def flex_attention_kernel(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    *,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """PyTorch FlexAttention under the attention contract; returns ``([B, S, Hq, D], None)``."""
    from torch.nn.attention.flex_attention import BlockMask

    given_block = isinstance(attention_mask, BlockMask)
    n_rep = _check(query, key, value, None if given_block else attention_mask, _FLEX)
    _check_unsupported(_FLEX, None, kwargs)
    problem = flex_head_dim_problem(query.device.type, query.shape[-1])
    if problem:
        raise ValueError(problem)
    if dropout:
        raise ValueError(f"{_OP} '{_FLEX}': dropout={dropout} cannot be honoured (FlexAttention has no dropout); "
                         "set the model's attention dropout to 0, or attn_implementation: sdpa or eager")
    if scaling is None:
        scaling = getattr(module, "head_dim", query.shape[-1]) ** -0.5
    score_mod = _softcap_mod(float(softcap)) if softcap is not None else None
    sq, sk = query.shape[2], key.shape[2]
    block = None
    if given_block:
        if tuple(attention_mask.seq_lengths) != (sq, sk):
            raise ValueError(f"{_OP} '{_FLEX}': the BlockMask is for (queries, keys) = "
                             f"{tuple(attention_mask.seq_lengths)}, the call has ({sq}, {sk})")
        block = attention_mask
    else:
        mask = packing_mask(module, query, key, attention_mask, sliding_window, kwargs, _FLEX)
        if mask is None:
            if sq > 1 and is_causal(module, kwargs):
                # eager's and sdpa's rule: the window aligned to the end of the keys; without one,
                # a causal call sees the first Sq keys, top-left aligned
                window = sliding_window if sliding_window is not None and sliding_window < sk else None
                if window is None:
                    key, value, sk = key[:, :, :sq], value[:, :, :sq], sq
                offset = sk - sq
                block = _block_mask(_causal_mod(offset, window), None, None, sq, sk, query.device,
                                    ("causal", query.device, sq, sk, window))
        elif mask.dtype == torch.bool:
            block = _block_mask(_dense_mod(mask), mask.shape[0] if mask.shape[0] > 1 else None,
                                mask.shape[1] if mask.shape[1] > 1 else None, sq, sk, query.device)
        else:
            score_mod = _additive_mod(mask, score_mod)
    out = _flex_fn(query)(query, key, value, score_mod=score_mod, block_mask=block, scale=scaling,
                          enable_gqa=n_rep > 1)
    return out.transpose(1, 2).contiguous(), None


# Binding sets the model's mask builder to transformers' flex one: the mask comes as a BlockMask.
flex_attention_kernel.veomni_mask = "flex_attention"  # type: ignore[attr-defined]
