"""The gated activation of a SwiGLU MLP: ``silu(gate) * up``.

As transformers' MLPs compute it (``ACT2FN["silu"](gate) * up``), bitwise in the same
dtype; autograd provides the backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .checks import check_swiglu_inputs

#: Its kernels, and the input checks they use (its folder's :mod:`.checks`): what
#: ``veomni_ops.kernels.<module>`` re-exports.
__all__ = ["check_swiglu_inputs", "silu_mul"]


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` elementwise; ``gate`` and ``up`` have the same shape and dtype."""
    check_swiglu_inputs(gate, up)
    return F.silu(gate) * up
