"""The residual add and the RMSNorm after it, as a transformers decoder layer computes them.

Written op for op as ``Qwen3DecoderLayer`` and ``Qwen3RMSNorm`` do (the add in the input
dtype, then the standard norm), so in the same dtype it gives the same bits; autograd
provides the backward.
"""

from __future__ import annotations

import torch

from ..rms_norm.kernel import rms_norm_standard
from .checks import check_residual_rms_norm_inputs

#: Its kernel, and the input checks it uses (its folder's :mod:`.checks`).
__all__ = ["check_residual_rms_norm_inputs", "residual_rms_norm"]


def residual_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(residual + x) * weight, residual + x)``: the sum rounded once in the input
    dtype, the norm as :func:`~veomni_ops.ops.rms_norm.kernel.rms_norm_standard`."""
    check_residual_rms_norm_inputs(x, residual, weight, eps)
    summed = residual + x
    return rms_norm_standard(summed, weight, eps), summed
