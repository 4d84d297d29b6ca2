"""The core's ``attention`` kernels: ``eager``, and ``sdpa`` and ``flex_attention`` from PyTorch."""

from __future__ import annotations

from ...backends.base import MATMUL_TOLERANCES, PORTABLE_PRIORITY, core_spec, eager_spec
from ...spec import HardwareRequirement, KernelSpec

_K = "veomni_ops.ops.attention.kernel"


def specs() -> list[KernelSpec]:
    return [
        eager_spec("attention", "standard", f"{_K}:eager_attention", MATMUL_TOLERANCES,
                   "explicit softmax(q k^T) v as transformers' eager_attention_forward (softcap, sinks, returns weights)",
                   features=("softcap", "sinks", "sliding_window", "dropout"), parallel=("sp",)),
        core_spec("sdpa", "attention", "standard", f"{_K}:sdpa_attention", MATMUL_TOLERANCES,
                  "torch scaled_dot_product_attention as transformers' sdpa_attention_forward (no softcap)",
                  priority=PORTABLE_PRIORITY, features=("sliding_window", "dropout"), parallel=("sp",)),
        core_spec("flex_attention", "attention", "standard", f"{_K}:flex_attention_kernel", MATMUL_TOLERANCES,
                  "PyTorch FlexAttention (torch.nn.attention.flex_attention): BlockMask from transformers' flex mask "
                  "builder or from the call; softcap as a score_mod; compiled on CUDA; no dropout",
                  # PyTorch's FlexAttention has no backward on the CPU (or MPS): training needs CUDA. Its
                  # fused Triton kernels are what PyTorch targets on sm 8.0+; tested on an H100.
                  hardware=HardwareRequirement(("cuda",), min_capability=(8, 0)),
                  requires=("torch>=2.5",),  # the public flex_attention with enable_gqa
                  dtypes=("float32", "bfloat16", "float16"),
                  # Below the reference: auto never takes it (nothing measured says it wins); name it to use it.
                  priority=-1, features=("softcap", "sliding_window")),
    ]
