"""What every attention kernel of the core shares (see :mod:`veomni_ops.ops.attention.kernel`):
the checks of a call's query, key, value and mask, the arguments no kernel of the core honours,
key/value heads repeated for GQA, whether a call is causal, and the end-aligned causal mask."""

from __future__ import annotations

from typing import Any

import torch

from ...kernels.checks import check_float, check_ndim, check_same_device

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
