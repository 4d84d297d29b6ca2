"""The core's ``cross_entropy`` kernels: ``eager`` and the portable ``chunked`` fused linear loss."""

from __future__ import annotations

from ...backends.base import LOSS_TOLERANCES, PORTABLE_PRIORITY, core_spec, eager_spec
from ...spec import KernelSpec
from .memory import chunked_extra, eager_extra, eager_logits_extra

_K = "veomni_ops.ops.cross_entropy.kernel"


def specs() -> list[KernelSpec]:
    # extra_memory (.memory): measured on an H100, hidden 2560, vocab 151,936, bf16, fwd+bwd
    # (benchmarks/results/h100-2026-11-26-issue24/callA/bench-flce.json): eager 13.15 / 27.02 / 54.76 GiB
    # at 8k / 16k / 32k tokens, chunked 1.902 GiB at each; eager logits 11.59 / 23.18 / 46.37 GiB.
    return [
        eager_spec("cross_entropy", "logits", f"{_K}:cross_entropy_sum", LOSS_TOLERANCES,
                   "F.cross_entropy(logits.float(), reduction='sum')", extra_memory=eager_logits_extra),
        eager_spec("cross_entropy", "fused_linear", f"{_K}:fused_linear_cross_entropy_sum", LOSS_TOLERANCES,
                   "lm_head matmul then F.cross_entropy: materialises the [N, V] logits", extra_memory=eager_extra),
        core_spec("chunked", "cross_entropy", "fused_linear", f"{_K}:chunked_fused_linear_cross_entropy_sum",
                  LOSS_TOLERANCES, "PyTorch chunked fused linear CE: per-chunk logits, grads in forward, never holds "
                  "[N, V]", priority=PORTABLE_PRIORITY, extra_memory=chunked_extra),
    ]
