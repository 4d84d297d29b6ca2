"""``moe_experts`` contract -> ``liger_kernel.ops.fused_moe.LigerFusedMoEFunction``.

Liger's signature is ``apply(x [T, H], gate_up_proj [E, 2I, H], down_proj [E, H, I],
top_k_index [T, K] int32, top_k_weights [T, K])`` -- the transformers v5 expert layout
(gate rows ``[0, I)``, up rows ``[I, 2I)`` of ``gate_up_proj``, read in
``_fused_up_proj_swiglu_kernel``), SiLU-gated, weighted sum over the K routes. So the
adapter reorders the arguments (the contract puts the routing before the weights), casts
the routing indices to int32, and checks what Liger does not:

* every index in ``[0, E)`` (Liger's routing kernels would scatter out of bounds; this
  check synchronises with the host, as Liger's routing does anyway);
* E below 65535 (Liger packs the expert id into 16 bits, 0xFFFF marks padding);
* hidden states and both weights of one dtype (``tl.dot`` needs it).

Gradients: hidden states, both weights and ``top_k_weights`` (Liger returns the latter in
the activation dtype; autograd casts it to the routing weights' dtype). Liger does not
write into any input. On NVIDIA GPUs ``tl.dot`` runs float32 inputs as TF32, so float32 is
about as precise as float16 here (the spec's tolerance says so).
"""

from __future__ import annotations

import torch
from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

from ._checks import (
    check_index_range,
    check_integer,
    check_kernel_dtype,
    check_ndim,
    check_same_device,
    check_same_dtype,
)

_OP = "moe_experts"
#: Liger stores the expert id in 16 bits and reserves 0xFFFF.
MAX_EXPERTS = 0xFFFF


def _check(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> None:
    check_kernel_dtype(hidden_states, "hidden_states", _OP)
    check_integer(top_k_index, "top_k_index", _OP)
    check_kernel_dtype(top_k_weights, "top_k_weights", _OP)
    check_kernel_dtype(gate_up_proj, "gate_up_proj", _OP)
    check_kernel_dtype(down_proj, "down_proj", _OP)
    check_ndim(hidden_states, 2, "hidden_states", _OP, "[T, H] (flatten batch and sequence first)")
    check_ndim(top_k_index, 2, "top_k_index", _OP, "[T, K]")
    check_ndim(top_k_weights, 2, "top_k_weights", _OP, "[T, K]")
    check_ndim(gate_up_proj, 3, "gate_up_proj", _OP, "[E, 2I, H]")
    check_ndim(down_proj, 3, "down_proj", _OP, "[E, H, I]")
    check_same_device(
        _OP,
        hidden_states=hidden_states,
        top_k_index=top_k_index,
        top_k_weights=top_k_weights,
        gate_up_proj=gate_up_proj,
        down_proj=down_proj,
    )
    check_same_dtype(_OP, hidden_states=hidden_states, gate_up_proj=gate_up_proj, down_proj=down_proj)
    t, h = hidden_states.shape
    if top_k_index.shape != top_k_weights.shape or top_k_index.shape[0] != t:
        raise ValueError(
            f"{_OP} (liger): top_k_index {tuple(top_k_index.shape)} and top_k_weights "
            f"{tuple(top_k_weights.shape)} must both be [T, K] with T = {t} tokens"
        )
    e, two_i, h_in = gate_up_proj.shape
    if h_in != h or two_i % 2:
        raise ValueError(
            f"{_OP} (liger): gate_up_proj {tuple(gate_up_proj.shape)} must be [E, 2I, H] with H = {h} "
            "(transformers v5 layout: gate rows first, then up rows)"
        )
    if tuple(down_proj.shape) != (e, h, two_i // 2):
        raise ValueError(
            f"{_OP} (liger): down_proj {tuple(down_proj.shape)} must be [E, H, I] = [{e}, {h}, {two_i // 2}] "
            f"to match gate_up_proj {tuple(gate_up_proj.shape)}"
        )
    if e >= MAX_EXPERTS:
        raise ValueError(f"{_OP} (liger): {e} experts; Liger's routing supports at most {MAX_EXPERTS - 1}")
    check_index_range(top_k_index, e, "top_k_index", _OP, f"the number of experts E = {e}")


def moe_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """Routed SiLU-gated experts (transformers v5 layout) via Liger's fused grouped GEMM.

    ``hidden_states [T, H]``, ``top_k_index [T, K]`` (integer), ``top_k_weights [T, K]``,
    ``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``; returns ``[T, H]`` in the hidden dtype.
    """
    _check(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
    # Liger's routing kernels read int32 indices; [T, K] is small.
    index = top_k_index.to(torch.int32)
    return LigerFusedMoEFunction.apply(hidden_states, gate_up_proj, down_proj, index, top_k_weights)
