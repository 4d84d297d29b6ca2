"""``rotary``'s input checks (heavy: imports torch). Public for backend authors, who import them from
:mod:`veomni_ops.kernels.checks` (or bound to their backend, :class:`~veomni_ops.kernels.checks.BackendChecks`);
:mod:`veomni_ops.kernels.rotary` re-exports them too.
"""

from __future__ import annotations

from functools import partial

import torch

from ...kernels.tensor_checks import TensorCheck, check_float, check_ndim, check_same_device, where

__all__ = ["check_rotary_inputs"]

_ROTARY = "rotary"


def check_rotary_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    backend: str | None = None,
    float_check: TensorCheck | None = None,
) -> int:
    """Check the ``rotary`` contract's inputs; return the rotary dim R.

    Public, for backend authors: call it first in an adapter, then check only what the
    backend adds. ``float_check`` (default :func:`check_float`,
    called as ``(x, name, op)``) narrows the dtypes or requires a device type; ``backend``
    tags every message (``"rotary (liger): ..."``). Shapes only: no host synchronisation.
    """
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    op = where(_ROTARY, backend)
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        float_check(t, name, _ROTARY)
    check_same_device(_ROTARY, backend=backend, q=q, k=k, cos=cos, sin=sin)
    check_ndim(q, 4, "q", _ROTARY, "[B, Hq, S, D]", backend=backend)
    check_ndim(k, 4, "k", _ROTARY, "[B, Hk, S, D]", backend=backend)
    check_ndim(cos, 3, "cos", _ROTARY, "[B, S, R] (as the model's rotary embedding returns it)", backend=backend)
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
