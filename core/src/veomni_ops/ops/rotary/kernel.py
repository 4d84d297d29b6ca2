"""Rotary position embedding (``rotate_half`` form), full and partial.

Op for op as transformers' ``apply_rotary_pos_emb`` of qwen3 (full: R == D) and of
qwen3_next (partial: the first R channels rotate, the rest pass through), so the
results are bitwise equal in the same dtype. Autograd provides the backward.

:func:`check_rotary_inputs`, the contract's input checks, is defined beside this module in
:mod:`veomni_ops.ops.rotary.checks` (so that ``BackendChecks`` binds it without importing this
module), is re-exported by :mod:`veomni_ops.kernels.checks` and is importable from here.
"""

from __future__ import annotations

import torch

from .checks import check_rotary_inputs

#: Its kernels, and the input checks they use (its folder's :mod:`.checks`): what
#: ``veomni_ops.kernels.<module>`` re-exports.
__all__ = ["apply_rotary", "check_rotary_inputs"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first R = ``cos.shape[-1]`` channels of every head of ``q`` and ``k``.

    ``q [B, Hq, S, D]``, ``k [B, Hk, S, D]``, ``cos``/``sin`` ``[B, S, R]``. Channels past R
    pass through unchanged (partial rotary). ``cos``/``sin`` of another dtype are cast to
    ``q``'s first, as the model's rotary module does, so the outputs keep q's and k's dtype.
    """
    check_rotary_inputs(q, k, cos, sin)
    if cos.dtype != q.dtype:
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    rotary_dim = cos.shape[-1]
    if rotary_dim == q.shape[-1]:
        return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = (q_rot * cos) + (_rotate_half(q_rot) * sin)
    k_embed = (k_rot * cos) + (_rotate_half(k_rot) * sin)
    return torch.cat([q_embed, q_pass], dim=-1), torch.cat([k_embed, k_pass], dim=-1)
