"""The ``residual_rms_norm`` op (see :mod:`veomni_ops.ops`): a decoder layer's residual add fused
with the RMSNorm after it (``post_attention_layernorm``)."""

from __future__ import annotations

from ..base import OpDef, OpInfo

#: The kernel contract: the docstring of the ``residual_rms_norm`` hook (:class:`veomni_ops.hookspecs.OpHookspecs`).
CONTRACT = """A residual add and the standard RMSNorm after it, in one kernel.

Kernel signature::

    kernel(x: Tensor[..., H], residual: Tensor[..., H], weight: Tensor[H], eps: float)
        -> (normed: Tensor[..., H], summed: Tensor[..., H])

``summed = residual + x`` in the input dtype, rounded once (as eager's add), and ``normed``
is the standard RMSNorm of ``summed`` exactly as ``Qwen3RMSNorm`` computes it:
``s̃ = s * rsqrt(mean(s², -1) + eps)`` in float32, cast to the input dtype, then
``weight * s̃`` (the result in the input dtype). In a decoder layer ``x`` is the attention's
output, ``residual`` the layer's input, ``weight`` and ``eps`` its ``post_attention_layernorm``'s;
``summed`` is the residual the MLP's output is added to.

``x`` and ``residual`` have one shape, dtype and device; any leading shape, rows need not be
contiguous, zero rows give empty outputs. Backward produces gradients for ``x`` and
``residual`` (equal: the gradient reaching ``summed`` from the output plus the one through
the norm) and ``weight``. Variant: ``standard``.
"""

OP = OpDef(
    "residual_rms_norm", order=15, info=OpInfo(("standard",), "residual_rms_norm_implementation"),
    contract=CONTRACT, package=__name__,
)
