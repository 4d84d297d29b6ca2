"""The Switch-Transformer auxiliary load-balancing loss.

Same value as transformers' ``load_balancing_loss_func`` (qwen3_moe, v5): per layer the
router softmax and its top-k; over all layers and the tokens the attention mask keeps,
``f_e`` = top-k assignments to expert e per kept token and ``P_e`` = mean router
probability; loss = ``num_experts * sum_e f_e * P_e``. Differences, all deliberate: the
result is always a tensor, float32 (float64 for float64 logits), where transformers
returns the int ``0`` for a non-tuple input; a list is accepted as well as a tuple; an
empty sequence is an error; with no token counted (zero tokens, or a mask that keeps none)
the loss is 0 with zero gradients, where transformers divides 0 by 0 (NaN); the softmax runs
in float32 (transformers: in the logits' dtype); the counts use ``scatter_add`` rather than ``bincount``, so the function traces
under ``torch.compile(fullgraph=True)`` and never synchronises with the host. Gradients
reach the logits through ``P`` only (the top-k counts are not differentiable), as in
transformers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...kernels.tensor_checks import check_float, check_ndim

#: Its kernels, and the input checks they use (:mod:`veomni_ops.kernels.tensor_checks`): what
#: ``veomni_ops.kernels.<module>`` re-exports.
__all__ = ["check_float", "check_ndim", "load_balancing_loss"]

_OP = "load_balancing_loss"


def load_balancing_loss(
    gate_logits: Sequence[torch.Tensor],
    num_experts: int,
    top_k: int,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``num_experts * sum_e f_e * P_e`` over all layers' router logits ``[T, E]`` (T = B*S)."""
    if isinstance(gate_logits, torch.Tensor) or not isinstance(gate_logits, (tuple, list)):
        raise TypeError(
            f"{_OP}: gate_logits must be a tuple or list with one [T, E] tensor per MoE layer, "
            f"got {type(gate_logits).__name__}"
        )
    if len(gate_logits) == 0:
        raise ValueError(f"{_OP}: gate_logits is empty; pass one router-logits tensor per MoE layer")
    if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts < 1:
        raise ValueError(f"{_OP}: num_experts must be a positive int, got {num_experts!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= num_experts:
        raise ValueError(f"{_OP}: top_k must be an int in [1, num_experts={num_experts}], got {top_k!r}")
    tokens = None
    for i, layer in enumerate(gate_logits):
        check_float(layer, f"gate_logits[{i}]", _OP)
        check_ndim(layer, 2, f"gate_logits[{i}]", _OP, "[T, E] (T = batch * sequence)")
        if layer.shape[1] != num_experts:
            raise ValueError(
                f"{_OP}: gate_logits[{i}] has {layer.shape[1]} experts in its last dimension, num_experts is {num_experts}"
            )
        if tokens is None:
            tokens = layer.shape[0]
        elif layer.shape[0] != tokens:
            raise ValueError(f"{_OP}: gate_logits[{i}] has {layer.shape[0]} tokens, gate_logits[0] has {tokens}")

    device = gate_logits[0].device
    # float32 statistics; float64 logits keep float64 so the reference can be gradchecked.
    compute = torch.float64 if gate_logits[0].dtype == torch.float64 else torch.float32
    flat_mask = None
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(f"{_OP}: attention_mask must be a [B, S] tensor or None")
        if attention_mask.numel() != tokens:
            raise ValueError(
                f"{_OP}: attention_mask {tuple(attention_mask.shape)} has {attention_mask.numel()} entries, "
                f"the router logits have {tokens} tokens; pass the [B, S] mask of the same batch"
            )
        flat_mask = attention_mask.reshape(-1).to(device=device, dtype=compute)

    assignments = torch.zeros(num_experts, dtype=compute, device=device)
    prob_sum = torch.zeros(num_experts, dtype=compute, device=device)
    rows = torch.zeros((), dtype=compute, device=device)
    for layer in gate_logits:
        probs = torch.softmax(layer.to(device=device, dtype=compute), dim=-1)
        _, selected = torch.topk(probs, top_k, dim=-1)
        if flat_mask is None:
            counts = torch.ones(selected.numel(), dtype=compute, device=device)
            prob_sum = prob_sum + probs.sum(dim=0)
            rows = rows + probs.shape[0]
        else:
            counts = flat_mask.repeat_interleave(top_k)
            prob_sum = prob_sum + (probs * flat_mask.unsqueeze(-1)).sum(dim=0)
            rows = rows + flat_mask.sum()
        assignments = assignments.scatter_add(0, selected.reshape(-1), counts)
    # No token counted (zero tokens, or the mask keeps none): f and P are 0, not 0/0 -- the loss
    # is 0 with zero gradients, never NaN. Where rows > 0 this divides by rows itself.
    rows = torch.where(rows > 0, rows, torch.ones_like(rows))
    return torch.sum((assignments / rows) * (prob_sum / rows)) * num_experts
