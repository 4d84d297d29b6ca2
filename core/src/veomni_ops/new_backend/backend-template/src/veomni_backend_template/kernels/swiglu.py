"""``silu(gate) * up`` with a hand-written backward, per the ``swiglu`` kernel contract.

Contract (``veomni_ops.hookspecs.OpHookspecs.swiglu``)::

    kernel(gate: Tensor[..., I], up: Tensor[..., I]) -> Tensor[..., I]

Output in the input dtype; backward gives gradients for ``gate`` and ``up``.

Why a custom ``autograd.Function``: eager PyTorch runs ``silu`` and ``mul`` as two ops and
its backward as several more, each a pass over memory. Here the forward is computed in
float32 and rounded once, and the backward computes both gradients from the saved inputs
in one expression each:

    s = sigmoid(g);  silu(g) = g * s;  silu'(g) = s * (1 + g * (1 - s))
    d gate = dout * up * silu'(g);     d up = dout * silu(g)

(A production backend would fuse these into one kernel — Triton, CUDA — behind the same
Function; the contract, the spec and the tests stay as they are.)
"""

from __future__ import annotations

import torch

from ._common import CHECKS


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # float32 math for half inputs; float64 stays float64 (so it can be gradchecked).
    return torch.float64 if dtype == torch.float64 else torch.float32


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(gate, up)
        c = _compute_dtype(gate.dtype)
        g = gate.to(c)
        return (g * torch.sigmoid(g) * up.to(c)).to(gate.dtype)

    @staticmethod
    def backward(ctx, dout: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:  # type: ignore[override]
        gate, up = ctx.saved_tensors
        c = _compute_dtype(gate.dtype)
        g, u, d = gate.to(c), up.to(c), dout.to(c)
        s = torch.sigmoid(g)
        dgate = dup = None
        if ctx.needs_input_grad[0]:
            dgate = (d * u * s * (1.0 + g * (1.0 - s))).to(gate.dtype)
        if ctx.needs_input_grad[1]:
            dup = (d * g * s).to(up.dtype)
        return dgate, dup


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` elementwise; any leading shape, any strides; differentiable."""
    # The contract's input checks are the core's (types, dtypes, one device, one dtype, one shape).
    CHECKS.check_swiglu_inputs(gate, up)
    return _SiluMul.apply(gate, up)
