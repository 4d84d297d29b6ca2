"""``flex_attention_kernel``: PyTorch's FlexAttention (``torch.nn.attention.flex_attention``)
under the attention contract (see :mod:`veomni_ops.ops.attention.kernel`): the mask as a
``BlockMask``, a ``mask_mod`` or an additive ``score_mod``, soft-capping as a ``score_mod``,
compiled on CUDA outside ``torch.compile``."""

from __future__ import annotations

from typing import Any

import torch

from .inputs import _OP, _check, _check_unsupported, is_causal
from .packing import packing_mask

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
