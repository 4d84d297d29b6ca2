"""The ``moe_router`` op (see :mod:`veomni_ops.ops`): the top-k softmax router of an MoE layer."""

from __future__ import annotations

from ..base import OpDef, OpInfo

#: The kernel contract: the docstring of the ``moe_router`` hook (:class:`veomni_ops.hookspecs.OpHookspecs`).
CONTRACT = """The top-k softmax router of an MoE layer (transformers v5's ``Qwen3MoeTopKRouter``),
after the router's linear projection.

Kernel signature::

    kernel(logits: Tensor[T, E], top_k: int, normalize: bool)
        -> (weights: Tensor[T, top_k], indices: LongTensor[T, top_k])

``p = softmax(logits)`` over the E experts in float32 (float64 for float64 logits); per
token the ``top_k`` largest ``p`` in descending order, their expert indices (int64) and
values; with ``normalize`` the values are divided by their sum (they then sum to 1);
``weights`` are cast to ``logits.dtype`` at the end. The projection
``logits = F.linear(hidden, weight)`` stays outside the kernel (the module calls it).
Ties: among equal probabilities which expert comes first is up to the kernel (torch.topk,
the eager kernel, orders equal values by no rule: on the CPU ``topk(zeros(40), 5)`` gives
28, 26, 27, 25, 29); a kernel may promise an order (veomni-triton's takes the lower
index first). Backward produces the gradient of ``logits`` through ``weights`` (the
indices have none). ``T = 0`` gives empty outputs and a zero gradient. Variant:
``standard``.
"""

OP = OpDef(
    "moe_router", order=45, info=OpInfo(("standard",), "moe_router_implementation"), contract=CONTRACT,
    package=__name__,
)
