"""RMS normalisation, the two variants of the ``rms_norm`` contract.

Both are written op for op as transformers writes them (``Qwen3RMSNorm`` and
``Qwen3NextRMSNorm``), so in the same dtype they give the same bits; autograd
provides the backward.
"""

from __future__ import annotations

import torch

from .checks import check_rms_norm_inputs

#: Its kernels, and the input checks they use (its folder's :mod:`.checks`): what
#: ``veomni_ops.kernels.<module>`` re-exports.
__all__ = ["check_rms_norm_inputs", "rms_norm_offset", "rms_norm_standard"]


def rms_norm_standard(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x * rsqrt(mean(x², -1) + eps)).to(x.dtype)``, statistics in float32.

    As ``Qwen3RMSNorm`` / ``LlamaRMSNorm``. The result is in ``hidden_states.dtype`` (the
    contract), also when ``weight`` has a wider dtype; with equal dtypes it is bitwise
    transformers' result.
    """
    check_rms_norm_inputs(hidden_states, weight, eps)
    input_dtype = hidden_states.dtype
    x = hidden_states.to(torch.float32) if input_dtype != torch.float64 else hidden_states
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    out = weight * x.to(input_dtype)
    # A float32 weight with bfloat16 activations would promote; the contract keeps the input dtype.
    return out if out.dtype == input_dtype else out.to(input_dtype)


def rms_norm_offset(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x̂ * (1 + weight)`` entirely in float32, cast to the input dtype at the end.

    As ``Qwen3NextRMSNorm`` (Qwen3.5, Qwen3-Next) and Gemma's norm: the weight is stored
    as an offset from one (initialised to zeros).
    """
    check_rms_norm_inputs(hidden_states, weight, eps)
    compute = torch.float64 if hidden_states.dtype == torch.float64 else torch.float32
    x = hidden_states.to(compute)
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    out = out * (1.0 + weight.to(compute))
    return out.type_as(hidden_states)
