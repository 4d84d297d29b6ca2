"""The core's ``cross_entropy`` kernels: ``eager`` and the portable ``chunked`` fused linear loss."""

from __future__ import annotations

from ...backends.base import LOSS_TOLERANCES, PORTABLE_PRIORITY, core_spec, eager_spec
from ...spec import KernelSpec

_K = "veomni_ops.ops.cross_entropy.kernel"


def specs() -> list[KernelSpec]:
    return [
        eager_spec("cross_entropy", "logits", f"{_K}:cross_entropy_sum", LOSS_TOLERANCES,
                   "F.cross_entropy(logits.float(), reduction='sum')"),
        eager_spec("cross_entropy", "fused_linear", f"{_K}:fused_linear_cross_entropy_sum", LOSS_TOLERANCES,
                   "lm_head matmul then F.cross_entropy: materialises the [N, V] logits"),
        core_spec("chunked", "cross_entropy", "fused_linear", f"{_K}:chunked_fused_linear_cross_entropy_sum",
                  LOSS_TOLERANCES, "PyTorch chunked fused linear CE: per-chunk logits, grads in forward, never holds "
                  "[N, V]", priority=PORTABLE_PRIORITY),
    ]
