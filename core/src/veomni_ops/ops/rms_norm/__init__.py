"""The ``rms_norm`` op (see :mod:`veomni_ops.ops`): RMS normalisation over the last dimension."""

from __future__ import annotations

from ..base import OpDef, OpInfo, Preference, gpu_default

#: The kernel contract: the docstring of the ``rms_norm`` hook (:class:`veomni_ops.hookspecs.OpHookspecs`).
CONTRACT = """RMS normalisation over the last dimension.

Kernel signature::

    kernel(hidden_states: Tensor[..., H], weight: Tensor[H], eps: float) -> Tensor[..., H]

Variants:

* ``standard`` (Llama, Qwen2/3): ``x̂ = x * rsqrt(mean(x², -1) + eps)`` computed in
  float32, cast to the input dtype, then ``weight * x̂``.
* ``offset`` (Qwen3.5, Qwen3-Next, Gemma): ``x̂ * (1 + weight)`` entirely in float32,
  cast to the input dtype at the end.

The output has the shape and dtype of ``hidden_states``; any leading shape, rows
need not be contiguous. ``weight`` may have another float dtype than
``hidden_states`` (mixed precision: a float32 weight with bfloat16/float16
activations): the output still has the activations' dtype, and the weight's
gradient has the weight's. Backward produces gradients for ``hidden_states`` and
``weight``. A standard kernel applied to an offset norm is a wrong result: the
core refuses it.
"""

OP = OpDef(
    "rms_norm", order=10, info=OpInfo(("standard", "offset"), "rms_norm_implementation"), contract=CONTRACT,
    package=__name__,
    veomni_values={"liger_kernel": gpu_default("npu", "liger", 980)},
    compile_preferences={"cuda": (
        Preference("eager", "standard", "compiled eager measured faster than triton (+6% step with rotary and swiglu, "
                   "dense model; the MoE figures have no file)"),
    )},
)
