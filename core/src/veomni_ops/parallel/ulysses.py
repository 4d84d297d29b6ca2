"""Ulysses sequence parallelism around any attention kernel.

Every rank of an SP group of ``sp`` ranks holds ``S / sp`` consecutive tokens of each row
(rank ``s`` of the group the ``s``-th slice). Projections, norms, rotary, MLPs and the loss
are per token and run on the slice. Attention is the one place tokens meet:

1. all-to-all ``q [B, Hq, S/sp, D]``, ``k``, ``v [B, Hk, S/sp, D]`` to
   ``[B, H/sp, S, D]``: the full sequence for ``1/sp`` of the heads (rank ``s`` takes heads
   ``[s*H/sp, (s+1)*H/sp)``, so every query head keeps its GQA key/value head);
2. call the plan's kernel on that, exactly as without SP;
3. all-to-all the output ``[B, S, Hq/sp, D]`` back to ``[B, S/sp, Hq, D]``.

Positions and the mask. Rotary is applied before attention, per token, from the
``position_ids`` of the *global* sequence (the batch sharder gives each rank its slice of
them). The kernel gets ``attention_mask=None`` -- the model built its mask for the local
slice, which is not the gathered sequence's -- and the global ``position_ids`` (all-gathered
over the group), so causality (``module.is_causal``), the sliding window (``sliding_window``)
and packed documents (restarting ``position_ids``) are those of the gathered sequence, as the
attention contract defines them for a call without a mask. Padding masks are therefore
refused under SP (pack documents instead); ``cu_seq_lens_*`` describe a local slice and are
refused too. Attention sinks (``s_aux``, one per head) are sliced to the rank's heads.

Backward is the reverse all-to-alls (:mod:`.comm`). q, k and v travel in one all-to-all
(:func:`seq_to_heads`), the output in another: two collectives per layer forward, two
backward. Per attention layer and rank, forward moves ``(sp-1)/sp * B * S/sp * (2*Hq + 2*Hk) * D`` elements off-rank (q, k, v, out) and
backward the same again.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .comm import all_gather_nograd, all_to_all

#: kwargs that describe packing of the local slice: not meaningful for the gathered sequence
_LOCAL_PACKING = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def seq_to_heads(group: dist.ProcessGroup | None, sp: int, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``[B, H, S/sp, D]`` on every rank -> ``[B, H/sp, S, D]`` (heads of this rank, whole sequence).

    Tensors of one dtype, batch, length and head size (q, k and v, as a rule) travel in *one*
    all-to-all: each is laid out by destination rank ``[sp, B, H/sp, S/sp, D]`` and they are
    concatenated along the heads (the copy the layout needs anyway), then split on arrival.
    """
    packed = []
    for x in xs:
        b, h, s, d = x.shape
        packed.append(x.reshape(b, sp, h // sp, s, d).permute(1, 0, 2, 3, 4))  # [sp(dest), B, H/sp, S/sp, D]
    first = packed[0]
    if len(packed) > 1 and all(p.dtype == first.dtype and p.shape[:2] == first.shape[:2]
                               and p.shape[3:] == first.shape[3:] for p in packed):
        widths = [p.shape[2] for p in packed]
        (both,) = all_to_all(group, torch.cat(packed, dim=2))
        got = both.split(widths, dim=2)
    else:
        got = all_to_all(group, *packed)
    out = []
    for y in got:  # [sp(src = sequence slice), B, H/sp, S/sp, D]
        n, b, h, s, d = y.shape
        out.append(y.permute(1, 2, 0, 3, 4).reshape(b, h, n * s, d))
    return tuple(out)


def heads_to_seq(group: dist.ProcessGroup | None, sp: int, x: torch.Tensor) -> torch.Tensor:
    """``[B, S, H/sp, D]`` (a kernel's output) -> ``[B, S/sp, H, D]`` (this rank's slice, all heads)."""
    b, s, h, d = x.shape
    packed = x.reshape(b, sp, s // sp, h, d).permute(1, 0, 2, 3, 4)  # [sp(dest = slice), B, S/sp, H/sp, D]
    (y,) = all_to_all(group, packed)  # [sp(src = head group), B, S/sp, H/sp, D]
    return y.permute(1, 2, 0, 3, 4).reshape(b, s // sp, sp * h, d)


class _GlobalPositions:
    """All-gathers the position ids of the local slice into those of the whole sequence, once
    per tensor (the layers of one forward share it)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self._last: tuple[int, int, Any, torch.Tensor] | None = None

    def __call__(self, pos: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # identity and version checks do not trace: gather every time
            got = all_gather_nograd(self.group, pos)
            return torch.cat(list(got.unbind(0)), dim=-1)
        last = self._last
        if last is not None and last[0] == id(pos) and last[1] == pos._version and last[2]() is pos:
            return last[3]
        got = all_gather_nograd(self.group, pos)  # [sp, ..., S/sp]
        full = torch.cat(list(got.unbind(0)), dim=-1)
        try:
            self._last = (id(pos), pos._version, weakref.ref(pos), full)
        except TypeError:
            self._last = None
        return full


def ulysses_attention(kernel: Callable[..., Any], group: dist.ProcessGroup | None, sp: int, name: str = "") -> Callable[..., Any]:
    """The plan's attention ``kernel`` made sequence-parallel over ``group`` (``sp`` ranks)."""
    rank = dist.get_rank(group)
    positions = _GlobalPositions(group)
    what = f"attention '{name}' under sequence parallelism (sp={sp})" if name else f"attention under sp={sp}"

    @functools.wraps(kernel)
    def sp_attention(module, query, key, value, attention_mask, **kwargs):
        hq, hk = query.shape[1], key.shape[1]
        if hq % sp or hk % sp or value.shape[1] % sp:
            raise ValueError(f"{what}: sp={sp} must divide the query heads ({hq}) and key/value heads ({hk})")
        given = [k for k in _LOCAL_PACKING if kwargs.get(k) is not None]
        if given:
            raise ValueError(f"{what}: {', '.join(given)} describe packing of one rank's slice; under sequence "
                             "parallelism give restarting position_ids of the global sequence instead")
        pos = kwargs.get("position_ids")
        if isinstance(pos, torch.Tensor):
            kwargs["position_ids"] = positions(pos)
        sinks = kwargs.get("s_aux")
        if isinstance(sinks, torch.Tensor) and sinks.dim() == 1 and sinks.shape[0] == hq:
            kwargs["s_aux"] = sinks.reshape(sp, hq // sp)[rank]
        q, k, v = seq_to_heads(group, sp, query, key, value)
        out, _ = kernel(module, q, k, v, None, **kwargs)
        return heads_to_seq(group, sp, out), None

    return sp_attention


def pad_to_multiple(x: torch.Tensor, multiple: int, value: float) -> torch.Tensor:
    """``x`` with its last dimension padded at the end to a multiple of ``multiple``."""
    extra = (-x.shape[-1]) % multiple
    if not extra:
        return x
    return torch.nn.functional.pad(x, (0, extra), value=value)


def seq_slice(x: torch.Tensor, sp: int, index: int) -> torch.Tensor:
    """Slice ``index`` of ``sp`` of the last dimension (which ``sp`` divides)."""
    n = x.shape[-1] // sp
    return x[..., index * n:(index + 1) * n]
