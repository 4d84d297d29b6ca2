"""The ``load_balancing_loss`` op (see :mod:`veomni_ops.ops`): the MoE router's auxiliary load-balancing loss."""

from __future__ import annotations

from ..base import OpDef, OpInfo, gpu_default

#: The kernel contract: the docstring of the ``load_balancing_loss`` hook (:class:`veomni_ops.hookspecs.OpHookspecs`).
CONTRACT = """The Switch-Transformer auxiliary loss, as transformers' ``load_balancing_loss_func``.

Kernel signature::

    kernel(gate_logits: Sequence[Tensor[T, E]], num_experts: int, top_k: int,
           attention_mask: Tensor[B, S] | None = None) -> Tensor[]  (float32)

One logits tensor per MoE layer (T = B*S tokens). Per layer: ``p = softmax(logits)``,
the top-k experts of each token; over all layers and the tokens the mask keeps,
``f_e`` = fraction of routes to expert e and ``P_e`` = mean router probability;
the loss is ``num_experts * sum_e f_e * P_e`` (without the model's coefficient).
Backward produces gradients for the logits through ``P`` only. With no token
counted -- zero tokens (``T = 0``), or an ``attention_mask`` that keeps none -- the
loss is 0 and the gradients are zero, never NaN (transformers divides 0 by 0
there). Variant: ``standard``.
"""

OP = OpDef(
    "load_balancing_loss", order=60, info=OpInfo(("standard",), "load_balancing_loss_implementation"),
    contract=CONTRACT, package=__name__, wrapper=".parallel:wrap",
    veomni_values={"triton": gpu_default("eager", "triton", 984, legacy=False)},
)
