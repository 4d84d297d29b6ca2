"""The core's own kernels of ``attention``: the ``eager`` reference and the portable ``sdpa`` and
``flex_attention`` (registered by :mod:`veomni_ops.backends.reference`). Light: factories are
``"module:attr"`` strings.
"""

from __future__ import annotations

from ...backends.base import ALL_DTYPES, ANYWHERE, MATMUL_TOLERANCES, PORTABLE_PRIORITY, eager_spec
from ...spec import HardwareRequirement, KernelSpec


def specs() -> list[KernelSpec]:
    return [
        eager_spec("attention", "standard", "veomni_ops.kernels.attention:eager_attention", MATMUL_TOLERANCES,
                   "explicit softmax(q k^T) v as transformers' eager_attention_forward (softcap, sinks, returns weights)",
                   features=("softcap", "sinks", "sliding_window", "dropout"), parallel=("sp",)),
        KernelSpec(
            name="sdpa",
            op="attention",
            variant="standard",
            factory="veomni_ops.kernels.attention:sdpa_attention",
            hardware=ANYWHERE,
            supports_backward=True,
            supports_compile=True,
            dtypes=ALL_DTYPES,
            priority=PORTABLE_PRIORITY,
            tolerances=MATMUL_TOLERANCES,
            description="torch scaled_dot_product_attention as transformers' sdpa_attention_forward (no softcap)",
            features=("sliding_window", "dropout"),
            parallel=("sp",),
        ),
        KernelSpec(
            name="flex_attention",
            op="attention",
            variant="standard",
            factory="veomni_ops.kernels.attention:flex_attention_kernel",
            # PyTorch's FlexAttention has no backward on the CPU (or MPS): training needs CUDA. Its
            # fused Triton kernels are what PyTorch targets on sm 8.0+; tested on an H100.
            hardware=HardwareRequirement(("cuda",), min_capability=(8, 0)),
            requires=("torch>=2.5",),  # the public flex_attention with enable_gqa
            supports_backward=True,
            supports_compile=True,
            dtypes=("float32", "bfloat16", "float16"),
            # Below the reference: auto never takes it (nothing measured says it wins); name it to use it.
            priority=-1,
            tolerances=MATMUL_TOLERANCES,
            description="PyTorch FlexAttention (torch.nn.attention.flex_attention): BlockMask from transformers' "
                        "flex mask builder or from the call; softcap as a score_mod; compiled on CUDA; no dropout",
            features=("softcap", "sliding_window"),
        ),
    ]
