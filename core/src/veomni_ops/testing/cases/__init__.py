"""What the conformance kit feeds each op, as data: input generators and how to call a kernel.

For every op an :class:`OpHarness` says how to call a kernel per its contract
(:mod:`veomni_ops.hookspecs`), which eager function is the reference for each variant, which
dtypes the outputs must have, and lists :class:`Case` objects per variant and size:

* ``small`` — a few dozen elements per tensor; what CI runs on the CPU and under the Triton
  interpreter (``TRITON_INTERPRET=1``);
* ``full`` — shapes of real models (hidden sizes of thousands, vocabularies of tens of
  thousands), for GPUs.

Every case builds fresh random inputs from a seed (:class:`Builder`): odd sizes, the layouts
models actually pass (``[B, S, H, D]`` tensors transposed into ``[B, H, S, D]``, gate and up
as two halves of one projection, rows with a stride), and the op's edge cases: mixed dtypes
(a float32 norm weight with 16-bit activations), experts with no tokens, every token to one
expert, a token listing one expert twice, every label ``ignore_index``, a non-default
``ignore_index``, padding masks, partial rotary, values wide enough that statistics computed
in half precision would overflow.

Tensors are generated in float64 from seeded ``torch.Generator`` objects — on the device
under test for the large random tensors (generating hundreds of millions of float64 values
on the CPU would dominate a GPU run), on the CPU for small integer draws — then cast to the
dtype under test. A seed gives the same inputs on every run on the same kind of device. The
reference sees exactly those values, cast back to float64.

One module per op (its harness and cases) beside :mod:`~veomni_ops.testing.cases.base`; adding
an op adds one module here and one entry in :data:`HARNESSES`.
"""

from __future__ import annotations

from .attention import ATTENTION, AttentionModule
from .base import SIZES, TORCH_DTYPES, Builder, Case, OpHarness, loss_dtypes, pick, same_dtype
from .cross_entropy import CROSS_ENTROPY
from .load_balancing import LOAD_BALANCING_LOSS, router_logits
from .moe import MOE_EXPERTS
from .rms_norm import RMS_NORM
from .rotary import ROTARY, cos_sin
from .swiglu import SWIGLU

HARNESSES: dict[str, OpHarness] = {
    h.op: h for h in (RMS_NORM, ROTARY, SWIGLU, CROSS_ENTROPY, MOE_EXPERTS, LOAD_BALANCING_LOSS, ATTENTION)
}


def harness(op: str) -> OpHarness:
    try:
        return HARNESSES[op]
    except KeyError:
        raise ValueError(f"the conformance kit has no cases for op {op!r}; ops: {', '.join(HARNESSES)}") from None


#: The former private name, still imported by tests outside the core.
_router_logits = router_logits

__all__ = [
    "ATTENTION", "CROSS_ENTROPY", "HARNESSES", "LOAD_BALANCING_LOSS", "MOE_EXPERTS", "RMS_NORM", "ROTARY", "SIZES",
    "SWIGLU", "TORCH_DTYPES", "AttentionModule", "Builder", "Case", "OpHarness", "cos_sin", "harness",
    "loss_dtypes", "pick", "router_logits", "same_dtype",
]
