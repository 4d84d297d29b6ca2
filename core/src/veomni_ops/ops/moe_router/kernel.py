"""The top-k softmax router of an MoE layer, after its linear projection.

As transformers' ``Qwen3MoeTopKRouter.forward`` computes it from the router logits, bitwise
in the same dtype: ``softmax(logits, dtype=float32)``, ``torch.topk``, divided by the sum of
the top-k when ``normalize``, cast to the logits' dtype. Float64 logits keep float64 (the
conformance reference). Autograd provides the backward (through the weights; the indices
have none).
"""

from __future__ import annotations

import torch

from .checks import check_moe_router_inputs

#: Its kernels, and the input checks they use (its folder's :mod:`.checks`): what
#: ``veomni_ops.kernels.<module>`` re-exports.
__all__ = ["check_moe_router_inputs", "moe_router"]


def moe_router(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, top_k] in logits.dtype, indices [T, top_k] int64)`` of the softmax's top-k."""
    check_moe_router_inputs(logits, top_k, normalize)
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    probs = torch.softmax(logits, dim=-1, dtype=compute)
    weights, indices = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), indices
