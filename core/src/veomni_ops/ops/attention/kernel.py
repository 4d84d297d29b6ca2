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

The kernels' parts, each a module of this folder whose names this one re-exports: the checks and
masks they share (:mod:`~veomni_ops.ops.attention.inputs`), the packing
(:mod:`~veomni_ops.ops.attention.packing`), sdpa's varlen path
(:mod:`~veomni_ops.ops.attention.varlen`) and FlexAttention (:mod:`~veomni_ops.ops.attention.flex`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...kernels.checks import can_read_values, check_float, check_integer, check_ndim, check_same_device
from . import flex as _flex
from . import packing as _packing
from .flex import (  # noqa: F401  (re-exported)
    _FLEX,
    _FLEX_BLOCKS,
    FLEX_MIN_HEAD_DIM_CUDA,
    _additive_mod,
    _block_mask,
    _causal_mod,
    _dense_mod,
    _flex_fn,
    _softcap_mod,
    flex_attention_kernel,
    flex_head_dim_problem,
)
from .inputs import (  # noqa: F401  (re-exported)
    _OP,
    _VARLEN,
    _check,
    _check_unsupported,
    _repeat_kv,
    end_aligned_mask,
    is_causal,
)
from .packing import (  # noqa: F401  (re-exported)
    _RESTARTS,
    _check_cu,
    _cu_block_mask,
    _positions_2d,
    _restarts,
    _segments_from_cu,
    packing_mask,
    positions_checked,
)
from .varlen import _packed_cu, _varlen_kernel, _varlen_packed, _varlen_usable  # noqa: F401  (re-exported)

#: Its kernels, and the input checks they use (:mod:`veomni_ops.kernels.checks`): what
#: ``veomni_ops.kernels.<module>`` re-exports.
__all__ = ["FLEX_MIN_HEAD_DIM_CUDA", "can_read_values", "check_float", "check_integer", "check_ndim",
    "check_same_device", "eager_attention", "end_aligned_mask", "flex_attention_kernel", "flex_head_dim_problem",
    "is_causal", "packing_mask", "positions_checked", "sdpa_attention"]


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



def __getattr__(name: str) -> Any:
    """The module state its parts rebind, read live there (imported here, it would keep its value
    of import time): ``_UNPACKED_SHAPE`` (:mod:`~veomni_ops.ops.attention.packing`) and
    ``_flex_compiled`` (:mod:`~veomni_ops.ops.attention.flex`)."""
    if name == "_UNPACKED_SHAPE":
        return _packing._UNPACKED_SHAPE
    if name == "_flex_compiled":
        return _flex._flex_compiled
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
