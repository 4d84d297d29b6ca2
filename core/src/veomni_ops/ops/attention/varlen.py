"""sdpa's packed rows through torch's FlashAttention varlen kernel
(``torch.nn.attention.varlen``, torch >= 2.10; see :mod:`veomni_ops.ops.attention.kernel`): each
document attends to itself alone, with no ``[S, S]`` mask, where the kernel can take the call."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from .inputs import is_causal
from .packing import _check_cu, _positions_2d, _restarts


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
