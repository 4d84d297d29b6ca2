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

Attention sinks (GPT-OSS's ``s_aux``: one learned logit per head that joins every row's
softmax and is then dropped) are honoured by ``eager``, as GPT-OSS's own eager attention.
Arguments a kernel cannot honour raise ``ValueError``: ``softcap`` and ``s_aux`` in sdpa,
and ``position_bias`` in both.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .checks import check_float, check_ndim, check_same_device

_OP = "attention"


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


def _is_causal(module: Any, kwargs: dict[str, Any]) -> bool:
    flag = kwargs.get("is_causal")
    return bool(flag) if flag is not None else bool(getattr(module, "is_causal", True))


def _window_mask(q_len: int, kv_len: int, window: int, device: torch.device) -> torch.Tensor:
    """Boolean causal sliding-window mask ``[1, 1, q, kv]``, queries aligned to the end of the keys."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    kv_pos = torch.arange(kv_len, device=device)[None, :]
    return ((kv_pos <= q_pos) & (kv_pos > q_pos - window))[None, None]


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
    if scaling is None:
        scaling = getattr(module, "head_dim", query.shape[-1]) ** -0.5
    q_len = query.shape[2]
    if attention_mask is None and q_len > 1 and _is_causal(module, kwargs):
        # The same rule as sdpa: a causal call without a mask is top-left aligned on the first q_len keys
        # (transformers slices them off for sdpa), unless a sliding window asks for its own mask.
        kv_len = key.shape[2]
        if sliding_window is not None and sliding_window < kv_len:
            attention_mask = _window_mask(q_len, kv_len, sliding_window, query.device)
        else:
            key, value = key[:, :, :q_len], value[:, :, :q_len]
            attention_mask = _window_mask(q_len, q_len, q_len, query.device)
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
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = q_len > 1 and attention_mask is None and _is_causal(module, kwargs)
    if causal and sliding_window is not None and sliding_window < kv_len:
        attention_mask = _window_mask(q_len, kv_len, sliding_window, query.device)
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
