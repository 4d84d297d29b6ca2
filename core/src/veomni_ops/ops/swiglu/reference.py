"""The core's own kernels of ``swiglu``: the ``eager`` reference (registered by
:mod:`veomni_ops.backends.reference`). Light: factories are ``"module:attr"`` strings.
"""

from __future__ import annotations

from ...backends.base import ELEMENTWISE_TOLERANCES, eager_spec
from ...spec import KernelSpec


def specs() -> list[KernelSpec]:
    return [eager_spec("swiglu", "standard", "veomni_ops.kernels.swiglu:silu_mul", ELEMENTWISE_TOLERANCES, "PyTorch silu(gate) * up")]
