"""The core's ``swiglu`` kernel: ``eager`` (light: a ``"module:attr"`` factory)."""

from __future__ import annotations

from ...backends.base import ELEMENTWISE_TOLERANCES, eager_spec
from ...spec import KernelSpec


def specs() -> list[KernelSpec]:
    return [eager_spec("swiglu", "standard", "veomni_ops.ops.swiglu.kernel:silu_mul", ELEMENTWISE_TOLERANCES, "PyTorch silu(gate) * up")]
