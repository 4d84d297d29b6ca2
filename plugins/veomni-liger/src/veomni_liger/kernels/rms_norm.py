"""``rms_norm`` contract -> ``liger_kernel.ops.rms_norm.LigerRMSNormFunction``.

Liger's function is ``apply(X, W, eps, offset=0.0, casting_mode="llama", in_place=True,
row_mode=None)`` and computes ``(X / RMS(X)) * (offset + W)``; the casting mode says where
the float32 math stops:

* ``standard`` = ``offset=0.0, casting_mode="llama"``: the kernel upcasts X to float32 for
  the statistics, casts ``x̂`` back to X's dtype and only then multiplies by the weight --
  transformers' ``LlamaRMSNorm``/``Qwen3RMSNorm`` and the contract's order of roundings.
* ``offset`` = ``offset=1.0, casting_mode="gemma"``: X and W are upcast to float32, the
  product ``x̂ * (1 + w)`` is formed in float32 and cast to X's dtype once at the end --
  ``Qwen3NextRMSNorm`` / Gemma.

The output is stored in X's dtype in both modes (as the contract says, also when the weight
is wider), the weight gradient is accumulated in float32 and returned in W's dtype.

``in_place=False`` always: Liger's default writes dX into the incoming gradient dY, which is
wrong whenever autograd hands the same gradient tensor to another branch -- exactly the
residual ``h + norm(x)`` of post-norm models (Liger documents this for Gemma2). The cost is
one extra gradient-sized buffer in backward.
"""

from __future__ import annotations

import torch

try:
    # Liger releases before 0.8.5 read torch.distributed.tensor.DTensor in forward, and
    # torch >= 2.12 loads that submodule lazily: bind it first (no-op where it is loaded).
    import torch.distributed.tensor  # noqa: F401
except ImportError:  # torch built without distributed support
    pass
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

from ._common import CHECKS

_OP = "rms_norm"
#: Liger processes a row in one Triton block; its block size is capped at 65536 elements.
MAX_HIDDEN = 65536


def _check(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    CHECKS.check_rms_norm_inputs(hidden_states, weight, eps)
    h = hidden_states.shape[-1]
    if h > MAX_HIDDEN:
        raise ValueError(
            f"{_OP} (liger): hidden size {h} is above Liger's limit of {MAX_HIDDEN} elements per row; "
            "use another rms_norm kernel (e.g. 'eager') for this model"
        )


def rms_norm_standard(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * cast(x̂)`` with float32 statistics (``standard`` variant), via Liger.

    ``hidden_states [..., H]``, ``weight [H]``; returns ``hidden_states``' shape and dtype.
    """
    _check(hidden_states, weight, eps)
    # Positional: (X, W, eps, offset, casting_mode, in_place); row_mode keeps Liger's default.
    return LigerRMSNormFunction.apply(hidden_states, weight, float(eps), 0.0, "llama", False)


def rms_norm_offset(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``cast(x̂ * (1 + weight))`` entirely in float32 (``offset`` variant), via Liger.

    ``hidden_states [..., H]``, ``weight [H]`` (stored as an offset from one, zeros at init).
    """
    _check(hidden_states, weight, eps)
    return LigerRMSNormFunction.apply(hidden_states, weight, float(eps), 1.0, "gemma", False)
