"""The transformers ``AttentionInterface`` signature on top of any flash-attention generation.

``flash_attention_forward(backend, module, query, key, value, attention_mask, ...)`` takes
``[B, H, S, D]`` query/key/value (what transformers' attention modules produce), calls the
backend's dense or varlen entry point in flash's ``[B, S, H, D]`` layout and returns
``([B, S, Hq, D], None)``.

Which entry point, in this order:

1. ``cu_seq_lens_q`` / ``cu_seq_lens_k`` kwargs (padding-free packing prepared by the data
   collator): varlen over the flattened ``B*S`` tokens, no host sync if ``max_length_q/k``
   are given as ints.
2. a 2-D ``[B, Sk]`` padding ``attention_mask`` (what transformers' ``flash_attention_mask``
   builds; it is None when nothing is padded): unpad, varlen, re-pad with zeros.
3. ``position_ids`` of a batch of one that restart (packed documents): varlen per document.
4. otherwise the dense ``flash_attn_func``.

GQA is passed through: flash kernels take ``Hk < Hq`` keys/values natively, nothing is repeated.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from veomni_ops.kernels.checks import where

from . import varlen as _v
from ._common import FlashBackend

_OP = "attention"

_HALF = (torch.bfloat16, torch.float16)


def _fail(backend: FlashBackend, what: str) -> ValueError:
    return ValueError(f"{where(_OP, backend.name)}: {what}")


def _as_int(x: Any) -> int:
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


def _check_inputs(backend: FlashBackend, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    for n, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise _fail(backend, f"{n} must be a 4-D tensor [batch, heads, seq, head_dim], got {shape}")
    if query.dtype not in _HALF or key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(
            f"{where(_OP, backend.name)}: query/key/value must be bfloat16 or float16, all of one dtype, got "
            f"{query.dtype}/{key.dtype}/{value.dtype}: load the model with dtype=torch.bfloat16 "
            "(or run it under torch.autocast), or use attn_implementation='sdpa' for float32"
        )
    b, hq, _, d = query.shape
    if key.shape[0] != b or value.shape[0] != b:
        raise _fail(backend, f"batch sizes differ: query {b}, key {key.shape[0]}, value {value.shape[0]}")
    if key.shape[:3] != value.shape[:3]:
        raise _fail(backend, f"key {tuple(key.shape)} and value {tuple(value.shape)} must agree in batch, heads, seq")
    if key.shape[-1] != d:
        raise _fail(backend, f"query head_dim {d} != key head_dim {key.shape[-1]}")
    if value.shape[-1] > d:
        raise _fail(backend, f"value head_dim {value.shape[-1]} > query head_dim {d} is not supported")
    hk = key.shape[1]
    if hk == 0 or hq % hk:
        raise _fail(backend, f"query heads ({hq}) must be a multiple of key/value heads ({hk}) for GQA")
    if any(s == 0 for s in query.shape) or key.shape[2] == 0:
        raise _fail(backend, f"empty input: query {tuple(query.shape)}, key {tuple(key.shape)}")


def _causal(module: Any, is_causal: bool | None) -> bool:
    if is_causal is not None:
        return bool(is_causal)
    c = getattr(module, "is_causal", None)
    if c is None:
        raise ValueError(
            "flash attention cannot tell whether this attention is causal: the module has no `is_causal` "
            "attribute and no is_causal= keyword was passed; set module.is_causal or pass is_causal"
        )
    return bool(c)


def _flash_kwargs(
    backend: FlashBackend,
    *,
    causal: bool,
    scaling: float | None,
    sliding_window: int | None,
    softcap: float | None,
    dropout_p: float,
    deterministic: bool | None,
) -> dict[str, Any]:
    kw: dict[str, Any] = {"causal": causal, "softmax_scale": scaling}
    if sliding_window is not None:
        w = int(sliding_window)
        if w < 1:
            raise _fail(backend, f"sliding_window must be >= 1, got {sliding_window}")
        # transformers' sliding window of w keeps a key when q - w < k <= q (w tokens, the query's
        # own included); flash's window (left, right) keeps q - left <= k <= q + right, so
        # left = w - 1. Causal: right = 0. Bidirectional: transformers' symmetric (w-1, w-1).
        kw["window_size"] = (w - 1, 0) if causal else (w - 1, w - 1)
    if softcap is not None and softcap != 0:
        # Always a float: FA4's backward treats anything but 0.0 as a softcap value.
        kw["softcap"] = float(softcap)
    if backend.supports_dropout:
        kw["dropout_p"] = dropout_p
    if deterministic is None:
        deterministic = os.environ.get("FLASH_ATTENTION_DETERMINISTIC", "0") == "1"
    if deterministic:
        kw["deterministic"] = True
    return kw


def _first(out: Any) -> torch.Tensor:
    # FA4 returns (out, lse); FA2/FA3 return out, or (out, lse, ...) when asked for probabilities.
    return out[0] if isinstance(out, (tuple, list)) else out


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def flash_attention_forward(
    backend: FlashBackend,
    module: torch.nn.Module | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention through ``backend``; see the module docstring for the dispatch."""
    _check_inputs(backend, query, key, value)
    causal = _causal(module, is_causal)

    if kwargs.get("s_aux") is not None:
        raise _fail(backend, "attention sinks (s_aux) are not supported by veomni-flash; use eager or sdpa")

    # transformers' modules already pass dropout=0.0 in eval; checking module.training as well keeps a
    # caller that forgets from applying dropout at inference. No module: the caller asked for it.
    training = bool(getattr(module, "training", True))
    p = float(dropout or 0.0) if training else 0.0
    if p > 0.0 and not backend.supports_dropout:
        raise _fail(
            backend,
            f"FlashAttention-{backend.version} has no attention dropout, but the module is training with "
            f"dropout={p}. Set the model config's attention_dropout to 0.0, or use "
            "attn_implementation='flash_attention_2' (which has dropout), 'sdpa' or 'eager'",
        )

    flash_kw = _flash_kwargs(
        backend,
        causal=causal,
        scaling=scaling,
        sliding_window=sliding_window,
        softcap=softcap,
        dropout_p=p,
        deterministic=kwargs.get("deterministic"),
    )

    b, hq, sq, d = query.shape
    dv = value.shape[-1]
    # Flash layout [B, S, H, D]; a transposed view of [B, H, S, D] is fine (stride(-1) == 1).
    q = _last_dim_contiguous(query.transpose(1, 2))
    k = _last_dim_contiguous(key.transpose(1, 2))
    v = _last_dim_contiguous(value.transpose(1, 2))
    if dv != d:
        # MLA-style narrower values: flash wants one head_dim, so pad V and crop the output.
        v = F.pad(v, (0, d - dv))

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    position_ids = kwargs.get("position_ids")
    for m, cu, cu_name in (("max_length_q", cu_q, "cu_seq_lens_q"), ("max_length_k", cu_k, "cu_seq_lens_k")):
        if kwargs.get(m) is not None and cu is None:
            # a launch bound of a varlen call that has no packing to bound: refused, not ignored
            raise _fail(backend, f"{m} is given without {cu_name}; pass the packing itself ({cu_name}), which "
                                 "this kernel (and eager/sdpa) honour")

    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise _fail(
            backend,
            f"attention_mask must be a 2-D [batch, seq] padding mask tensor or None, got {type(attention_mask).__name__}",
        )
    if attention_mask is not None and attention_mask.dim() != 2:
        raise _fail(
            backend,
            f"got a {attention_mask.dim()}-D attention_mask {tuple(attention_mask.shape)}; flash kernels take the "
            "2-D [batch, seq] padding mask (or None). Register the attention name with transformers' flash mask "
            "builder: veomni_flash.transformers_adapter.register_attention(name, fn)",
        )
    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None  # nothing padded: the dense kernel is exact and cheaper

    if cu_q is not None or cu_k is not None:
        if attention_mask is not None:
            raise _fail(backend, "got both cu_seq_lens_q/k (packed) and a padding attention_mask; pass one")
        if cu_q is None or cu_k is None:
            raise _fail(backend, "packed attention needs both cu_seq_lens_q and cu_seq_lens_k")
        cu_q = cu_q.to(device=q.device, dtype=torch.int32)
        cu_k = cu_k.to(device=q.device, dtype=torch.int32)
        mq = kwargs.get("max_length_q")
        mk = kwargs.get("max_length_k")
        mq = _as_int(mq) if mq is not None else int((cu_q[1:] - cu_q[:-1]).max().item())
        mk = _as_int(mk) if mk is not None else int((cu_k[1:] - cu_k[:-1]).max().item())
        out = backend.flash_attn_varlen_func(
            q.reshape(-1, hq, d),
            k.reshape(-1, k.shape[2], d),
            v.reshape(-1, v.shape[2], d),
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            max_seqlen_q=mq,
            max_seqlen_k=mk,
            **flash_kw,
        )
        out = _first(out).reshape(b, sq, hq, d)
    elif attention_mask is not None:
        if attention_mask.shape[0] != b:
            raise _fail(backend, f"attention_mask batch {attention_mask.shape[0]} != query batch {b}")
        sk = attention_mask.shape[1]
        if k.shape[1] < sk:
            raise _fail(backend, f"attention_mask covers {sk} keys but key has only {k.shape[1]}")
        if k.shape[1] > sk:
            # A static cache hands longer k/v than the mask: the tail beyond the mask is unused.
            k, v = k[:, :sk], v[:, :sk]
        mask = attention_mask.to(q.device)
        idx_k, cu_k, mk = _v.padding_metadata(mask)
        if sq == sk:
            idx_q, cu_q, mq = idx_k, cu_k, mk
        else:
            # Fewer queries than keys (decoding with a cache): the queries are the last sq
            # positions, i.e. left padding, as transformers assumes.
            idx_q, cu_q, mq = _v.padding_metadata(mask[:, -sq:])
        out = backend.flash_attn_varlen_func(
            _v.unpad(q, idx_q),
            _v.unpad(k, idx_k),
            _v.unpad(v, idx_k),
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            max_seqlen_q=mq,
            max_seqlen_k=mk,
            **flash_kw,
        )
        out = _v.pad(_first(out), idx_q, b, sq)
    else:
        starts = _v.packed_starts(position_ids, b, sq) if sq == k.shape[1] else None
        if starts is not None:
            cu, mx = _v.cu_seqlens_from_starts(starts.to(q.device))
            out = backend.flash_attn_varlen_func(
                q.reshape(-1, hq, d),
                k.reshape(-1, k.shape[2], d),
                v.reshape(-1, v.shape[2], d),
                cu_seqlens_q=cu,
                cu_seqlens_k=cu,
                max_seqlen_q=mx,
                max_seqlen_k=mx,
                **flash_kw,
            )
            out = _first(out).reshape(b, sq, hq, d)
        else:
            out = _first(backend.flash_attn_func(q, k, v, **flash_kw))

    if dv != d:
        out = out[..., :dv]
    return out, None


def attention_function(backend: FlashBackend, name: str, module_name: str):
    """The transformers attention function for one flash generation, bound to ``backend``.

    ``[B, Hq, S, D]`` query, ``[B, Hk, Sk, D]`` key/value -> (``[B, S, Hq, D]``, None); see
    :func:`flash_attention_forward` for masks, packing, windows and GQA. ``name`` and
    ``module_name`` are what the function reports (transformers' registries show them).
    """

    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        return flash_attention_forward(
            backend, module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            sliding_window=sliding_window, softcap=softcap, **kwargs,
        )

    attention.__name__ = attention.__qualname__ = name
    attention.__module__ = module_name
    attention.__doc__ = (
        "``[B, Hq, S, D]`` query, ``[B, Hk, Sk, D]`` key/value -> (``[B, S, Hq, D]``, None); "
        "see veomni_flash.kernels.attention for masks, packing, windows and GQA."
    )
    return attention
