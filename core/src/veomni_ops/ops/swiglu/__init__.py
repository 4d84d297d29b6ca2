"""The ``swiglu`` op (see :mod:`veomni_ops.ops`): the gated activation of a SwiGLU MLP."""

from __future__ import annotations

from ..base import OpDef, OpInfo, Preference, gpu_default

#: The kernel contract: the docstring of the ``swiglu`` hook (:class:`veomni_ops.hookspecs.OpHookspecs`).
CONTRACT = """The gated activation of a SwiGLU MLP: ``silu(gate) * up``.

Kernel signature::

    kernel(gate: Tensor[..., I], up: Tensor[..., I]) -> Tensor[..., I]

The MLP module keeps its own projections: ``down_proj(kernel(gate_proj(x), up_proj(x)))``.
Output in the input dtype (math may be float32). Backward produces gradients for
``gate`` and ``up``. Variant: ``standard``.
"""

OP = OpDef(
    "swiglu", order=30, info=OpInfo(("standard",), "swiglu_mlp_implementation"), contract=CONTRACT, package=__name__,
    # VeOmni has no NPU SwiGLU and runs eager there (veomni-npu's npu kernel is taken only by name or auto).
    veomni_values={"liger_kernel": gpu_default("eager", "liger", 983)},
    compile_preferences={"cuda": (
        Preference("eager", "standard", "compiled eager measured faster than triton (dense model)"),
    )},
)
