"""The core's own kernels of ``moe_experts``: the ``eager`` reference and the portable
``grouped_mm`` (registered by :mod:`veomni_ops.backends.reference`). Light: factories are
``"module:attr"`` strings.
"""

from __future__ import annotations

from ...backends.base import MATMUL_TOLERANCES, PORTABLE_PRIORITY, eager_spec
from ...spec import HardwareRequirement, KernelSpec


def specs() -> list[KernelSpec]:
    return [
        eager_spec("moe_experts", "standard", "veomni_ops.kernels.moe:moe_experts_eager", MATMUL_TOLERANCES,
                   "per-expert Python loop, as transformers' Qwen3MoeExperts (host syncs; no fullgraph compile)",
                   supports_compile=False, parallel=("ep",)),
        KernelSpec(
            name="grouped_mm",
            op="moe_experts",
            variant="standard",
            factory="veomni_ops.kernels.moe:moe_experts_grouped_mm",
            # torch._grouped_mm's CUTLASS path: NVIDIA compute capability 9.x/10.x, bfloat16 only
            # (elsewhere CUDA falls back to a host-synchronising loop, which the kernel refuses).
            # The CPU implementation also runs float32/float16 eagerly, but only bfloat16 compiles.
            hardware=HardwareRequirement(("cuda", "cpu"), min_capability=(9, 0), max_capability=(10, 9)),
            requires=("torch>=2.8",),
            supports_backward=True,
            supports_compile=True,
            dtypes=("bfloat16",),
            priority=PORTABLE_PRIORITY,
            tolerances=MATMUL_TOLERANCES,
            description="sort routes by expert + torch._grouped_mm per projection; no loop, no host sync",
            parallel=("ep",),
        ),
    ]
