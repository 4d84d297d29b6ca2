"""The core's own kernels of ``rotary``: the ``eager`` reference full and partial (registered by
:mod:`veomni_ops.backends.reference`). Light: factories are ``"module:attr"`` strings.
"""

from __future__ import annotations

from ...backends.base import ELEMENTWISE_TOLERANCES, eager_spec
from ...spec import KernelSpec


def specs() -> list[KernelSpec]:
    return [
        eager_spec("rotary", variant, "veomni_ops.kernels.rotary:apply_rotary", ELEMENTWISE_TOLERANCES,
                   f"PyTorch rotate_half RoPE ({variant}), as transformers' apply_rotary_pos_emb")
        for variant in ("full", "partial")
    ]
