"""The core's ``load_balancing_loss`` kernel: ``eager`` (light: a ``"module:attr"`` factory)."""

from __future__ import annotations

from ...backends.base import LOSS_TOLERANCES, eager_spec
from ...spec import KernelSpec


def specs() -> list[KernelSpec]:
    return [
        eager_spec("load_balancing_loss", "standard", "veomni_ops.ops.load_balancing_loss.kernel:load_balancing_loss", LOSS_TOLERANCES,
                   "Switch-Transformer aux loss as transformers' load_balancing_loss_func (float32)")
    ]
