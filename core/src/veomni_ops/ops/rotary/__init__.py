"""The ``rotary`` op: rotary position embedding of queries and keys.

Everything the core knows about it lives in this folder (see :mod:`veomni_ops.ops`); this
module is the light part: its table entry and kernel contract (the hookspec below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import OpDef, OpInfo, Preference

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ...spec import KernelSpec


def rotary(self) -> Iterable[KernelSpec]:
    """Rotary position embedding of queries and keys (transformers' ``rotate_half`` form).

    Kernel signature::

        kernel(q: Tensor[B, Hq, S, D], k: Tensor[B, Hk, S, D],
               cos: Tensor[B, S, R], sin: Tensor[B, S, R]) -> tuple[Tensor, Tensor]

    ``cos``/``sin`` are what the model's rotary embedding module returns
    (``cat(freqs, freqs)``, so R is even). The first R channels of every head are
    rotated, ``x*cos + rotate_half(x)*sin``; the remaining ``D - R`` pass through
    unchanged. Outputs have the shapes and dtypes of ``q`` and ``k``.

    Variants: ``full`` (R == D) and ``partial`` (R < D, as Qwen3.5 / Qwen3-Next /
    GLM use). Backward produces gradients for ``q`` and ``k``.

    Example::

        @hookimpl
        def rotary():
            return [KernelSpec(name="mine", op="rotary", variant="full",
                               factory="my_backend.kernels.rope:apply_rotary")]
    """


OP = OpDef(
    name="rotary",
    order=20,
    info=OpInfo(("full", "partial"), "rotary_pos_emb_implementation"),
    contract=rotary,
    package=__name__,
    compile_preferences={"cuda": (Preference("eager", "full", "compiled eager measured faster than triton (dense "
                                             "model)"),)},
)
