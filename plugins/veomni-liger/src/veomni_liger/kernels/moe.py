"""``moe_experts`` contract -> ``liger_kernel.ops.fused_moe.LigerFusedMoEFunction``.

Liger's signature is ``apply(x [T, H], gate_up_proj [E, 2I, H], down_proj [E, H, I],
top_k_index [T, K] int32, top_k_weights [T, K])`` -- the transformers v5 expert layout
(gate rows ``[0, I)``, up rows ``[I, 2I)`` of ``gate_up_proj``, read in
``_fused_up_proj_swiglu_kernel``), SiLU-gated, weighted sum over the K routes. So the
adapter reorders the arguments (the contract puts the routing before the weights), casts
the routing indices to int32, and checks what Liger does not:

* the contract's index rule (:func:`veomni_ops.kernels.moe.check_expert_index`, always:
  one reduction and one host synchronisation, as Liger's routing synchronises anyway):
  ``-1`` and ``E`` (expert-parallel sentinels) route nowhere, any other index outside
  ``[0, E)`` raises ``ValueError``. Liger has no notion of a route to no expert (its routing
  kernels would scatter out of bounds), so sentinel routes are sent to expert 0 with
  weight 0: they cost one row of GEMM work each and contribute exactly zero, and their
  ``top_k_weights`` gradient is zero (``torch.where``);
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
from veomni_ops.kernels.moe import routed

from ._common import CHECKS

_OP = "moe_experts"
#: Liger stores the expert id in 16 bits and reserves 0xFFFF.
MAX_EXPERTS = 0xFFFF


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
    # The contract's checks are the core's; Liger narrows the dtypes (no float64).
    _, _, e, _, _ = CHECKS.check_moe_inputs(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
    if e >= MAX_EXPERTS:
        raise ValueError(f"{_OP} (liger): {e} experts; Liger's routing supports at most {MAX_EXPERTS - 1}")
    CHECKS.check_expert_index(top_k_index, e, always=True)
    valid = routed(top_k_index, gate_up_proj.shape[0])
    # Sentinel routes (-1, E) -> expert 0 with weight 0. Liger's routing kernels read int32
    # indices; [T, K] is small.
    index = torch.where(valid, top_k_index, torch.zeros_like(top_k_index)).to(torch.int32)
    weights = torch.where(valid, top_k_weights, torch.zeros_like(top_k_weights))
    return LigerFusedMoEFunction.apply(hidden_states, gate_up_proj, down_proj, index, weights)
