"""``swiglu``'s input checks (heavy: imports torch). Public for backend authors, who import them from
:mod:`veomni_ops.kernels.checks` (or bound to their backend, :class:`~veomni_ops.kernels.checks.BackendChecks`).
"""

from __future__ import annotations

from functools import partial

import torch

from ...kernels.tensor_checks import TensorCheck, check_float, check_same_device, check_same_dtype, where

__all__ = ["check_swiglu_inputs"]


def check_swiglu_inputs(
    gate: torch.Tensor, up: torch.Tensor, *, backend: str | None = None, float_check: TensorCheck | None = None
) -> None:
    """Check the ``swiglu`` contract's inputs: ``gate`` and ``up`` ``[..., I]`` of one shape, dtype and device."""
    op = "swiglu"
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    float_check(gate, "gate", op)
    float_check(up, "up", op)
    check_same_device(op, backend=backend, gate=gate, up=up)
    check_same_dtype(op, backend=backend, gate=gate, up=up)
    if gate.shape != up.shape:
        raise ValueError(
            f"{where(op, backend)}: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have the same shape [..., I]"
        )
