"""The core's own kernels of ``cross_entropy``: the ``eager`` reference and the portable
``chunked`` fused linear loss (registered by :mod:`veomni_ops.backends.reference`). Light:
factories are ``"module:attr"`` strings.
"""

from __future__ import annotations

from ...backends.base import ALL_DTYPES, ANYWHERE, LOSS_TOLERANCES, PORTABLE_PRIORITY, eager_spec
from ...spec import KernelSpec


def specs() -> list[KernelSpec]:
    return [
        eager_spec("cross_entropy", "logits", "veomni_ops.kernels.cross_entropy:cross_entropy_sum", LOSS_TOLERANCES,
                   "F.cross_entropy(logits.float(), reduction='sum')"),
        eager_spec("cross_entropy", "fused_linear", "veomni_ops.kernels.cross_entropy:fused_linear_cross_entropy_sum", LOSS_TOLERANCES,
                   "lm_head matmul then F.cross_entropy: materialises the [N, V] logits"),
        KernelSpec(
            name="chunked",
            op="cross_entropy",
            variant="fused_linear",
            factory="veomni_ops.kernels.cross_entropy:chunked_fused_linear_cross_entropy_sum",
            hardware=ANYWHERE,
            supports_backward=True,
            supports_compile=True,
            dtypes=ALL_DTYPES,
            priority=PORTABLE_PRIORITY,
            tolerances=LOSS_TOLERANCES,
            description="PyTorch chunked fused linear CE: per-chunk logits, grads in forward, never holds [N, V]",
        ),
    ]
