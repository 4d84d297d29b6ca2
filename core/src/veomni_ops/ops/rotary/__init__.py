"""The ``rotary`` op (see :mod:`veomni_ops.ops`): rotary position embedding of queries and keys."""

from __future__ import annotations

from ..base import OpDef, OpInfo, Preference, gpu_default

#: The kernel contract: the docstring of the ``rotary`` hook (:class:`veomni_ops.hookspecs.OpHookspecs`).
CONTRACT = """Rotary position embedding of queries and keys (transformers' ``rotate_half`` form).

Kernel signature::

    kernel(q: Tensor[B, Hq, S, D], k: Tensor[B, Hk, S, D],
           cos: Tensor[B, S, R], sin: Tensor[B, S, R]) -> tuple[Tensor, Tensor]

``cos``/``sin`` are what the model's rotary embedding module returns
(``cat(freqs, freqs)``, so R is even). The first R channels of every head are
rotated, ``x*cos + rotate_half(x)*sin``; the remaining ``D - R`` pass through
unchanged. Outputs have the shapes and dtypes of ``q`` and ``k``.

Variants: ``full`` (R == D) and ``partial`` (R < D, as Qwen3.5 / Qwen3-Next /
GLM use). Backward produces gradients for ``q`` and ``k``.
"""

OP = OpDef(
    "rotary", order=20, info=OpInfo(("full", "partial"), "rotary_pos_emb_implementation"), contract=CONTRACT,
    package=__name__,
    veomni_values={"liger_kernel": gpu_default("npu", "liger", 981)},
    compile_preferences={"cuda": (Preference("eager", "full", "compiled eager measured faster than triton (dense model)"),)},
)
