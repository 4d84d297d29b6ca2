"""Padding and packing bookkeeping for the varlen flash entry points.

Flash kernels take no mask. A padded batch is *unpadded* (the valid tokens of all rows are
gathered into one ``[total, H, D]`` stream with cumulative lengths ``cu_seqlens``), run through
``flash_attn_varlen_func`` and scattered back; a packed row (several documents in one
sequence, marked by position ids that restart) is cut into documents the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def unpad(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``[B, S, ...] -> [len(indices), ...]``: the rows of the flattened ``B*S`` axis at ``indices``."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]).index_select(0, indices)


def pad(x: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of :func:`unpad`: ``[N, ...] -> [batch, seqlen, ...]``, zeros where no index points."""
    out = x.new_zeros((batch * seqlen, *x.shape[1:]))
    # Out-of-place index_copy keeps autograd: the gradient flows back to x at `indices`.
    out = out.index_copy(0, indices, x)
    return out.view(batch, seqlen, *x.shape[1:])


def seqlens_to_cu(seqlens: torch.Tensor) -> torch.Tensor:
    """Per-sequence lengths ``[N]`` -> cumulative offsets ``[N+1]`` (int32, starts at 0), as flash wants."""
    return F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))


def padding_metadata(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """From a ``[B, S]`` padding mask (1/True = token, 0/False = padding): the flat indices of the
    tokens, the int32 ``cu_seqlens`` of the rows, and the longest row (a host int: flash needs it).

    Padding may sit anywhere in a row (left, right, or holes): the kept tokens of a row form
    one sequence in their original order, which is exactly what a masked causal attention
    over that row computes for its valid queries.
    """
    keep = mask.to(torch.bool)
    seqlens = keep.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(keep.reshape(-1), as_tuple=False).reshape(-1)
    return indices, seqlens_to_cu(seqlens), int(seqlens.max().item()) if seqlens.numel() else 0


def sequence_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """Boolean ``[S]``: where a new document starts in a packed row of position ids.

    A document starts at index 0 and wherever the position does not continue the previous one
    by +1 (position ids that restart at 0 in VeOmni's packing; any restart counts). This is the
    rule transformers' mask builder uses for packed sequences under eager/sdpa
    (``masking_utils.find_packed_sequence_indices``), so flash and eager agree.
    """
    pos = position_ids.reshape(-1)
    starts = torch.ones_like(pos, dtype=torch.bool)
    if pos.numel() > 1:
        starts[1:] = pos[1:] != pos[:-1] + 1
    return starts


def cu_seqlens_from_starts(starts: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Document starts ``[S]`` -> (int32 ``cu_seqlens``, longest document as a host int)."""
    total = starts.numel()
    idx = torch.nonzero(starts, as_tuple=False).reshape(-1).to(torch.int32)
    cu = torch.cat([idx, torch.tensor([total], dtype=torch.int32, device=starts.device)])
    return cu, int((cu[1:] - cu[:-1]).max().item())


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Packed position ids of one row (``[S]`` or ``[1, S]``) -> (int32 ``cu_seqlens``, max length)."""
    return cu_seqlens_from_starts(sequence_starts(position_ids))


def packed_starts(position_ids: torch.Tensor | None, batch: int, seqlen: int) -> torch.Tensor | None:
    """The document starts if ``position_ids`` marks a packed batch of size 1, else None.

    Only ``[1, S]`` / ``[S]`` position ids of the query length count (packing flattens the
    batch to one row). Other shapes, e.g. the ``[3, B, S]`` multimodal rotary positions of
    Qwen2-VL, describe no packing: models that pack such inputs pass ``cu_seq_lens_q/k``.
    One host sync (does any document start after index 0?), like transformers' own check.
    """
    if position_ids is None or batch != 1:
        return None
    if position_ids.dim() not in (1, 2) or position_ids.shape[-1] != seqlen or position_ids.numel() != seqlen:
        return None
    starts = sequence_starts(position_ids)
    if not bool(starts[1:].any()):
        return None
    return starts
