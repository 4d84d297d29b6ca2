"""Packed sequences (several documents in one row) for the core's attention kernels (the
rules: :mod:`veomni_ops.ops.attention.kernel`): ``cu_seq_lens`` checked and turned into a
block-diagonal mask, whether ``position_ids`` restart (cached per tensor; told to compiled calls
by :func:`positions_checked`), and :func:`packing_mask`, the mask with the packing honoured."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from ...kernels.checks import can_read_values, check_integer
from .inputs import _OP, _VARLEN, is_causal


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
