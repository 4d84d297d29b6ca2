"""The core's ``moe_experts`` kernels: the ``eager`` loop and the portable ``grouped_mm``."""

from __future__ import annotations

from ...backends.base import MATMUL_TOLERANCES, PORTABLE_PRIORITY, core_spec, eager_spec
from ...spec import HardwareRequirement, KernelSpec

_K = "veomni_ops.ops.moe_experts.kernel"


def specs() -> list[KernelSpec]:
    return [
        eager_spec("moe_experts", "standard", f"{_K}:moe_experts_eager", MATMUL_TOLERANCES,
                   "per-expert Python loop, as transformers' Qwen3MoeExperts (host syncs; no fullgraph compile)",
                   supports_compile=False, parallel=("ep",)),
        core_spec("grouped_mm", "moe_experts", "standard", f"{_K}:moe_experts_grouped_mm", MATMUL_TOLERANCES,
                  "sort routes by expert + torch._grouped_mm per projection; no loop, no host sync",
                  # torch._grouped_mm's CUTLASS path: NVIDIA compute capability 9.x/10.x, bfloat16 only
                  # (elsewhere CUDA falls back to a host-synchronising loop, which the kernel refuses).
                  # The CPU implementation also runs float32/float16 eagerly, but only bfloat16 compiles.
                  hardware=HardwareRequirement(("cuda", "cpu"), min_capability=(9, 0), max_capability=(10, 9)),
                  requires=("torch>=2.8",), dtypes=("bfloat16",), priority=PORTABLE_PRIORITY, parallel=("ep",)),
    ]
