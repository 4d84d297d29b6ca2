"""``rms_norm``'s input checks (heavy: imports torch). Public for backend authors, who import them from
:mod:`veomni_ops.kernels.checks` (or bound to their backend, :class:`~veomni_ops.kernels.checks.BackendChecks`).
"""

from __future__ import annotations

from functools import partial

import torch

from ...kernels.tensor_checks import TensorCheck, check_eps, check_float, check_same_device, where

__all__ = ["check_rms_norm_inputs"]


def check_rms_norm_inputs(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    backend: str | None = None,
    float_check: TensorCheck | None = None,
) -> float:
    """Check the ``rms_norm`` contract's inputs: ``hidden_states [..., H]``, ``weight [H]``, ``eps``.

    Dtypes by ``float_check`` (default :func:`check_float`), one device, the shapes, then
    ``eps`` (:func:`check_eps`, whose float is returned). Shapes only: no host synchronisation.
    """
    op = "rms_norm"
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    float_check(hidden_states, "hidden_states", op)
    float_check(weight, "weight", op)
    check_same_device(op, backend=backend, hidden_states=hidden_states, weight=weight)
    if hidden_states.dim() < 1:
        raise ValueError(f"{where(op, backend)}: hidden_states must have at least one dimension [..., H], got a scalar")
    h = hidden_states.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != h:
        raise ValueError(
            f"{where(op, backend)}: weight must have shape [H] = [{h}] (the last dimension of hidden_states "
            f"{tuple(hidden_states.shape)}), got {tuple(weight.shape)}"
        )
    return check_eps(eps, op, backend=backend)
