"""``moe_experts``' input checks (heavy: imports torch): the shapes (:func:`check_moe_inputs`) and the
expert-index rule (:func:`check_expert_index`: ``-1``, :data:`NO_EXPERT`, and ``E`` route nowhere).
Public for backend authors, who import them from :mod:`veomni_ops.kernels.checks` (or bound to their
backend, :class:`~veomni_ops.kernels.checks.BackendChecks`); :mod:`veomni_ops.kernels.moe` re-exports them too.
"""

from __future__ import annotations

from functools import partial

import torch

from ...kernels.tensor_checks import (
    TensorCheck,
    can_read_values,
    check_float,
    check_integer,
    check_ndim,
    check_same_device,
    check_same_dtype,
    device_assert,
    value_range,
    where,
)

__all__ = ["NO_EXPERT", "check_expert_index", "check_moe_inputs"]

_MOE = "moe_experts"

#: The expert index that, like ``E``, means "this route goes to no expert here" (what an
#: expert-parallel dispatcher writes for a route whose expert lives on another rank).
NO_EXPERT = -1


def _index_message(op: str, value: int | None, num_experts: int) -> str:
    held = f"holds {value}" if value is not None else "holds an index"
    return (
        f"{op}: top_k_index {held}, outside [0, {num_experts}) for E = {num_experts} experts; only -1 and "
        f"E = {num_experts} may stand for 'no expert here' (the expert-parallel sentinel: the route contributes "
        "zero), any other index is a routing bug"
    )


def check_expert_index(
    top_k_index: torch.Tensor, num_experts: int, *, backend: str | None = None, always: bool = False
) -> None:
    """The contract's rule for expert indices: each in ``[0, E)``, or ``-1`` / ``E`` (routes nowhere).

    Anything else raises ``ValueError`` naming the op (and ``backend``), the offending index
    and E. Reading the indices costs one reduction and one host synchronisation, so:

    * ``always=True`` -- for kernels that synchronise anyway (the eager loop, Liger);
    * otherwise the values are read when :func:`can_read_values`
      allows it (CPU tensors; accelerators with ``VEOMNI_OPS_CHECK_VALUES=1``); on CUDA, and
      while ``torch.compile`` traces, the rule is asserted on the device instead
      (:func:`device_assert`: no synchronisation; a failure stops
      the process with CUDA's device-side assertion); on other accelerators it is not
      checked and such an index routes nowhere, as the sentinels do (never out of bounds).
    """
    op = where(_MOE, backend)
    if always or can_read_values(top_k_index):
        got = value_range(top_k_index)
        if got is None:
            return
        lo, hi = got
        if lo < NO_EXPERT:
            raise ValueError(_index_message(op, lo, num_experts))
        if hi > num_experts:
            raise ValueError(_index_message(op, hi, num_experts))
    elif top_k_index.device.type in ("cuda", "cpu") and top_k_index.numel():
        device_assert(
            ((top_k_index >= NO_EXPERT) & (top_k_index <= num_experts)).all(), _index_message(op, None, num_experts)
        )


def check_moe_inputs(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    *,
    backend: str | None = None,
    float_check: TensorCheck | None = None,
    integer_check: TensorCheck | None = None,
) -> tuple[int, int, int, int, int]:
    """Check the ``moe_experts`` contract's inputs; return ``(T, H, E, I, K)``.

    Public, for backend authors: call it first in an adapter, then check only what the
    backend adds (expert-count limits, index ranges). Checks, in this order: dtypes
    (``float_check`` on the four float tensors, ``integer_check`` on ``top_k_index``;
    by default :func:`check_float` and
    :func:`check_integer`, each called as ``(x, name, op)``:
    pass your own to narrow the dtypes or to require a device type), ranks, one device,
    one dtype for the hidden states and both weights, and the shapes ``[T, H]``,
    ``[T, K]`` twice, ``[E, 2I, H]`` and ``[E, H, I]``. ``backend`` tags every message
    (``"moe_experts (liger): ..."``). Shapes only: no host synchronisation.
    """
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    if integer_check is None:
        integer_check = partial(check_integer, backend=backend)
    op = where(_MOE, backend)
    float_check(hidden_states, "hidden_states", _MOE)
    integer_check(top_k_index, "top_k_index", _MOE)
    float_check(top_k_weights, "top_k_weights", _MOE)
    float_check(gate_up_proj, "gate_up_proj", _MOE)
    float_check(down_proj, "down_proj", _MOE)
    check_ndim(hidden_states, 2, "hidden_states", _MOE, "[T, H] (flatten batch and sequence first)", backend=backend)
    check_ndim(top_k_index, 2, "top_k_index", _MOE, "[T, K]", backend=backend)
    check_ndim(top_k_weights, 2, "top_k_weights", _MOE, "[T, K]", backend=backend)
    check_ndim(gate_up_proj, 3, "gate_up_proj", _MOE, "[E, 2I, H]", backend=backend)
    check_ndim(down_proj, 3, "down_proj", _MOE, "[E, H, I]", backend=backend)
    check_same_device(
        _MOE,
        backend=backend,
        hidden_states=hidden_states,
        top_k_index=top_k_index,
        top_k_weights=top_k_weights,
        gate_up_proj=gate_up_proj,
        down_proj=down_proj,
    )
    check_same_dtype(_MOE, backend=backend, hidden_states=hidden_states, gate_up_proj=gate_up_proj, down_proj=down_proj)
    t, h = hidden_states.shape
    if top_k_index.shape != top_k_weights.shape or top_k_index.shape[0] != t:
        raise ValueError(
            f"{op}: top_k_index {tuple(top_k_index.shape)} and top_k_weights {tuple(top_k_weights.shape)} "
            f"must both be [T, K] with T = {t} tokens"
        )
    e, two_i, h_in = gate_up_proj.shape
    if h_in != h or two_i % 2:
        raise ValueError(
            f"{op}: gate_up_proj {tuple(gate_up_proj.shape)} must be [E, 2I, H] with H = {h} "
            "(transformers v5 layout: gate rows first, then up rows)"
        )
    if tuple(down_proj.shape) != (e, h, two_i // 2):
        raise ValueError(
            f"{op}: down_proj {tuple(down_proj.shape)} must be [E, H, I] = [{e}, {h}, {two_i // 2}] "
            f"to match gate_up_proj {tuple(gate_up_proj.shape)}"
        )
    return t, h, e, two_i // 2, top_k_index.shape[1]
