"""The ``rms_norm`` op: RMS normalisation over the last dimension.

Everything the core knows about it lives in this folder (see :mod:`veomni_ops.ops`); this
module is the light part: its table entry and kernel contract (the hookspec below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import OpDef, OpInfo, Preference

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ...spec import KernelSpec


def rms_norm(self) -> Iterable[KernelSpec]:
    """RMS normalisation over the last dimension.

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

    Example::

        @hookimpl
        def rms_norm():
            return [KernelSpec(name="mine", op="rms_norm", variant="standard",
                               factory="my_backend.kernels.rms_norm:rms_norm")]
    """


OP = OpDef(
    name="rms_norm",
    order=10,
    info=OpInfo(("standard", "offset"), "rms_norm_implementation"),
    contract=rms_norm,
    package=__name__,
    compile_preferences={"cuda": (Preference("eager", "standard", "compiled eager measured faster than triton (+6% "
                                             "step with rotary and swiglu, dense model; the MoE figures have no "
                                             "file)"),)},
)
