"""Rotary position embedding (``rotate_half`` form), full and partial.

Op for op as transformers' ``apply_rotary_pos_emb`` of qwen3 (full: R == D) and of
qwen3_next (partial: the first R channels rotate, the rest pass through), so the
results are bitwise equal in the same dtype. Autograd provides the backward.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from .checks import check_float, check_ndim, check_same_device, where

_OP = "rotary"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def check_rotary_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    backend: str | None = None,
    float_check: Callable[[torch.Tensor, str, str], None] | None = None,
) -> int:
    """Check the ``rotary`` contract's inputs; return the rotary dim R.

    Public, for backend authors: call it first in an adapter, then check only what the
    backend adds. ``float_check`` (default :func:`~veomni_ops.kernels.checks.check_float`,
    called as ``(x, name, op)``) narrows the dtypes or requires a device type; ``backend``
    tags every message (``"rotary (liger): ..."``). Shapes only: no host synchronisation.
    """
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    op = where(_OP, backend)
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        float_check(t, name, _OP)
    check_same_device(_OP, backend=backend, q=q, k=k, cos=cos, sin=sin)
    check_ndim(q, 4, "q", _OP, "[B, Hq, S, D]", backend=backend)
    check_ndim(k, 4, "k", _OP, "[B, Hk, S, D]", backend=backend)
    check_ndim(cos, 3, "cos", _OP, "[B, S, R] (as the model's rotary embedding returns it)", backend=backend)
    if cos.shape != sin.shape:
        raise ValueError(f"{op}: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have the same shape")
    b, _, s, d = q.shape
    if k.shape[0] != b or k.shape[2] != s or k.shape[3] != d:
        raise ValueError(
            f"{op}: k {tuple(k.shape)} must match q {tuple(q.shape)} in batch, sequence and head dim "
            "(layout [B, H, S, D]; transpose(1, 2) a [B, S, H, D] tensor first)"
        )
    r = cos.shape[-1]
    if r % 2 or r == 0 or r > d:
        raise ValueError(
            f"{op}: the rotary dim R = cos.shape[-1] = {r} must be even, positive and at most the head dim {d}; "
            "pass the cos/sin the model's rotary embedding returns (cat(freqs, freqs))"
        )
    if cos.shape[0] not in (1, b) or cos.shape[1] != s:
        raise ValueError(
            f"{op}: cos/sin {tuple(cos.shape)} do not fit q {tuple(q.shape)}: expected [{b} or 1, {s}, R]"
        )
    return r


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
