"""The core's own kernels of ``load_balancing_loss``: the ``eager`` reference (registered by
:mod:`veomni_ops.backends.reference`). Light: factories are ``"module:attr"`` strings.
"""

from __future__ import annotations

from ...backends.base import LOSS_TOLERANCES, eager_spec
from ...spec import KernelSpec


def specs() -> list[KernelSpec]:
    return [
        eager_spec("load_balancing_loss", "standard", "veomni_ops.kernels.load_balancing:load_balancing_loss", LOSS_TOLERANCES,
                   "Switch-Transformer aux loss as transformers' load_balancing_loss_func (float32)")
    ]
