"""The core's ``moe_router`` kernel: ``eager`` (light: a ``"module:attr"`` factory)."""

from __future__ import annotations

from ...backends.base import eager_spec
from ...spec import KernelSpec, Tolerance

#: Measured, not guessed: the eager kernel run in each dtype against itself in float64 on every
#: conformance case (small and full sizes, seeds 0-2, CPU, torch 2.13), worst error in units of
#: ``s + |b|`` (s: the reference's unit scale; the kit's measure at atol = rtol = 1):
#: weights 8.1e-8 / 1.3e-3 / 1.8e-4 and grad logits 9.2e-7 / 3.6e-3 / 4.5e-4 in float32 /
#: bfloat16 / float16 (the final cast to the logits' dtype dominates). Tolerances: about 4x the
#: worst (float64: the reference itself; any float64 kernel rounds there only).
TOLERANCES = {
    "float64": Tolerance(1e-12, 1e-10),
    "float32": Tolerance(4e-6, 4e-6),
    "bfloat16": Tolerance(1.6e-2, 1.6e-2),
    "float16": Tolerance(2e-3, 2e-3),
}


def specs() -> list[KernelSpec]:
    return [eager_spec("moe_router", "standard", "veomni_ops.ops.moe_router.kernel:moe_router", TOLERANCES,
                       "PyTorch softmax (float32) + torch.topk (+ renormalise), as transformers' Qwen3MoeTopKRouter")]
