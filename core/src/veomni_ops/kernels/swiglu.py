"""The gated activation of a SwiGLU MLP: ``silu(gate) * up``.

As transformers' MLPs compute it (``ACT2FN["silu"](gate) * up``), bitwise in the same
dtype; autograd provides the backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .checks import check_float, check_same_device, check_same_dtype

_OP = "swiglu"


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` elementwise; ``gate`` and ``up`` have the same shape and dtype."""
    check_float(gate, "gate", _OP)
    check_float(up, "up", _OP)
    check_same_device(_OP, gate=gate, up=up)
    check_same_dtype(_OP, gate=gate, up=up)
    if gate.shape != up.shape:
        raise ValueError(
            f"{_OP}: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have the same shape [..., I]"
        )
    return F.silu(gate) * up
