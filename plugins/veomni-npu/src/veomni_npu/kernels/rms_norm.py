"""``rms_norm`` contract -> ``torch_npu.npu_rms_norm``.

``torch_npu.npu_rms_norm(self, gamma, epsilon=1e-6) -> (y, rstd)`` (torch_npu API reference)
computes ``y = x / sqrt(mean(x², -1) + eps) * gamma`` over the trailing ``gamma.dim()``
dimensions; ``y`` has x's shape and dtype, ``rstd`` is float32. CANN's golden reference for
the kernel (``hicann/ops-nn``, ``norm/rms_norm/tests/assets/golden.py``) upcasts x and gamma
to float32, forms ``x * rstd * gamma`` in float32 and casts to x's dtype once. Autograd:
op-plugin's ``derivatives.yaml`` gives ``self, gamma: npu_rms_norm_backward(grad, self,
gamma, rstd)`` (dgamma comes back in float32; autograd casts it to the weight's dtype).

* ``standard``: ``gamma = weight``. The contract rounds ``x̂`` to x's dtype before the
  multiply; the kernel rounds once at the end, which differs by at most one rounding of
  the output (covered by the declared tolerance; no worse than the reference's own error).
* ``offset``: ``gamma = 1 + weight`` formed in float32, exactly as the reference forms it.
  With a float32 gamma the kernel computes ``x̂ * (1 + w)`` in float32 and casts once: the
  offset contract, same order of roundings.

Supported ``(x, gamma)`` dtype pairs on Atlas A2/A3 (torch_npu docs): (fp16, fp32),
(bf16, fp32), (fp16, fp16), (bf16, bf16), (fp32, fp32); older Atlas training/inference
parts take only the same-dtype fp16/fp32 pairs. A weight whose dtype differs from x's is
therefore passed upcast to float32 (exact), which is always one of the pairs.
"""

from __future__ import annotations

import torch

from ._common import CHECKS, torch_npu

_OP = "rms_norm"


def _npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    # torch_npu documents 2-8-D inputs; any other rank goes through a [rows, H] view.
    flat = not 2 <= x.dim() <= 8
    y, _rstd = torch_npu.npu_rms_norm(x.reshape(-1, x.shape[-1]) if flat else x, gamma, epsilon=eps)
    return y.reshape(x.shape) if flat else y


def rms_norm_standard(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x̂`` with float32 statistics (``standard`` variant), via ``npu_rms_norm``.

    ``hidden_states [..., H]``, ``weight [H]``; returns ``hidden_states``' shape and dtype.
    """
    eps = CHECKS.check_rms_norm_inputs(hidden_states, weight, eps)
    gamma = weight if weight.dtype == hidden_states.dtype else weight.to(torch.float32)
    return _npu_rms_norm(hidden_states, gamma, eps)


def rms_norm_offset(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``cast(x̂ * (1 + weight))`` entirely in float32 (``offset`` variant), via ``npu_rms_norm``.

    ``hidden_states [..., H]``, ``weight [H]`` (stored as an offset from one, zeros at init).
    """
    eps = CHECKS.check_rms_norm_inputs(hidden_states, weight, eps)
    gamma = 1.0 + weight.to(torch.float32)
    return _npu_rms_norm(hidden_states, gamma, eps)
