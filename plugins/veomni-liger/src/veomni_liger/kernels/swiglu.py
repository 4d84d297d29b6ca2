"""``swiglu`` contract -> Liger's ``swiglu_forward`` / ``swiglu_backward``.

These two functions are what ``LigerSiLUMulFunction`` runs (``silu(a)`` in float32, cast to
b's dtype, times ``b``). The adapter wraps them in its own autograd Function instead of
calling ``LigerSiLUMulFunction.apply`` for one reason: Liger's backward writes the
gradients **into the saved activations** (``da`` over ``gate``, ``db`` over ``up``) to save
memory, and Triton's stores do not bump autograd's version counters. With Liger's Function
a second use of those tensors -- ``backward(retain_graph=True)`` twice, or another op
that saved ``gate``/``up`` for its own backward -- silently computes with gradients in
place of activations. Here the version counters are bumped after the overwrite, so any
such use raises autograd's "modified by an inplace operation" error instead.

What remains, by design (it is where Liger's memory saving comes from, and it is what
VeOmni's Liger MLP has always done): after backward, the ``gate`` and ``up`` tensors that
were passed in hold their gradients. In an MLP they are temporaries of the projections;
callers that keep them must pass copies. Non-contiguous inputs (e.g. the two halves of a
fused ``gate_up`` projection) are copied first, so those callers' tensors are untouched.
"""

from __future__ import annotations

import torch
from liger_kernel.ops.swiglu import swiglu_backward, swiglu_forward
from torch.autograd.graph import increment_version

from ._common import CHECKS

_OP = "swiglu"
#: Liger processes a row in one Triton block (block size capped at 65536 elements).
MAX_INTERMEDIATE = 65536


class _LigerSiLUMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        a = gate.contiguous()
        b = up.contiguous()
        # silu_mul(x, x) (or two views of one buffer): backward would write da and db into
        # one buffer. The storage check is skipped while dynamo traces (it cannot trace it).
        if b is a or (
            not torch.compiler.is_compiling() and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        ):
            b = b.clone()
        _, _, out = swiglu_forward(a, b)
        ctx.save_for_backward(a, b)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        # Liger indexes a, b and the gradient with one row stride: all three must be contiguous.
        da, db = swiglu_backward(a, b, grad_out.contiguous())
        # da/db live in a's/b's storage now: make autograd see that write.
        increment_version((a, b))
        return da, db


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` via Liger; ``gate``/``up`` ``[..., I]`` of one shape and dtype.

    Backward overwrites contiguous ``gate``/``up`` with their gradients (see the module doc).
    """
    CHECKS.check_swiglu_inputs(gate, up)
    if gate.dim() < 1:
        raise ValueError(f"{_OP} (liger): gate and up must have at least one dimension [..., I], got scalars")
    if gate.shape[-1] > MAX_INTERMEDIATE:
        raise ValueError(
            f"{_OP} (liger): intermediate size {gate.shape[-1]} is above Liger's limit of {MAX_INTERMEDIATE} "
            "elements per row; use another swiglu kernel (e.g. 'eager')"
        )
    return _LigerSiLUMul.apply(gate, up)
