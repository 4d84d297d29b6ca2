"""The ``load_balancing_loss`` op: the MoE router's auxiliary load-balancing loss.

Everything the core knows about it lives in this folder (see :mod:`veomni_ops.ops`); this
module is the light part: its table entry and kernel contract (the hookspec below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import OpDef, OpInfo

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ...spec import KernelSpec


def load_balancing_loss(self) -> Iterable[KernelSpec]:
    """The Switch-Transformer auxiliary loss, as transformers' ``load_balancing_loss_func``.

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

    Example::

        @hookimpl
        def load_balancing_loss():
            return [KernelSpec(name="mine", op="load_balancing_loss", variant="standard",
                               factory="my_backend.kernels:aux_loss")]
    """


OP = OpDef(
    name="load_balancing_loss",
    order=60,
    info=OpInfo(("standard",), "load_balancing_loss_implementation"),
    contract=load_balancing_loss,
    package=__name__,
)
