"""The core's ``rotary`` kernels: ``eager``, full and partial (light: ``"module:attr"`` factories)."""

from __future__ import annotations

from ...backends.base import ELEMENTWISE_TOLERANCES, eager_spec
from ...spec import KernelSpec


def specs() -> list[KernelSpec]:
    return [
        eager_spec("rotary", variant, "veomni_ops.ops.rotary.kernel:apply_rotary", ELEMENTWISE_TOLERANCES,
                   f"PyTorch rotate_half RoPE ({variant}), as transformers' apply_rotary_pos_emb")
        for variant in ("full", "partial")
    ]
