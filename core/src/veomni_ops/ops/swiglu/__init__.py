"""The ``swiglu`` op: the gated activation of a SwiGLU MLP.

Everything the core knows about it lives in this folder (see :mod:`veomni_ops.ops`); this
module is the light part: its table entry and kernel contract (the hookspec below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import OpDef, OpInfo, Preference

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ...spec import KernelSpec


def swiglu(self) -> Iterable[KernelSpec]:
    """The gated activation of a SwiGLU MLP: ``silu(gate) * up``.

    Kernel signature::

        kernel(gate: Tensor[..., I], up: Tensor[..., I]) -> Tensor[..., I]

    The MLP module keeps its own projections: ``down_proj(kernel(gate_proj(x), up_proj(x)))``.
    Output in the input dtype (math may be float32). Backward produces gradients for
    ``gate`` and ``up``. Variant: ``standard``.

    Example::

        @hookimpl
        def swiglu():
            return [KernelSpec(name="mine", op="swiglu", variant="standard",
                               factory="my_backend.kernels:silu_mul")]
    """


OP = OpDef(
    name="swiglu",
    order=30,
    info=OpInfo(("standard",), "swiglu_mlp_implementation"),
    contract=swiglu,
    package=__name__,
    compile_preferences={"cuda": (Preference("eager", "standard", "compiled eager measured faster than triton "
                                             "(dense model)"),)},
)
