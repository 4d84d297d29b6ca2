"""``residual_rms_norm``'s input checks (heavy: imports torch). Public for backend authors, who import them
from :mod:`veomni_ops.kernels.checks` (or bound to their backend, :class:`~veomni_ops.kernels.checks.BackendChecks`).
"""

from __future__ import annotations

from functools import partial

import torch

from ...kernels.tensor_checks import TensorCheck, check_eps, check_float, check_same_device, check_same_dtype, where

__all__ = ["check_residual_rms_norm_inputs"]


def check_residual_rms_norm_inputs(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    backend: str | None = None,
    float_check: TensorCheck | None = None,
) -> float:
    """Check the ``residual_rms_norm`` contract's inputs: ``x`` and ``residual [..., H]`` of one shape,
    dtype and device, ``weight [H]``, ``eps`` (:func:`check_eps`, whose float is returned).
    Shapes only: no host synchronisation."""
    op = "residual_rms_norm"
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    float_check(x, "x", op)
    float_check(residual, "residual", op)
    float_check(weight, "weight", op)
    check_same_device(op, backend=backend, x=x, residual=residual, weight=weight)
    check_same_dtype(op, backend=backend, x=x, residual=residual)
    if x.shape != residual.shape:
        raise ValueError(f"{where(op, backend)}: x {tuple(x.shape)} and residual {tuple(residual.shape)} must have "
                         "the same shape [..., H]")
    if x.dim() < 1:
        raise ValueError(f"{where(op, backend)}: x must have at least one dimension [..., H], got a scalar")
    h = x.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != h:
        raise ValueError(f"{where(op, backend)}: weight must have shape [H] = [{h}] (the last dimension of x "
                         f"{tuple(x.shape)}), got {tuple(weight.shape)}")
    return check_eps(eps, op, backend=backend)
