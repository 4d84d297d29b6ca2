"""veomni-flash's KernelSpecs (the ``veomni_ops.backends`` entry point). Light module.

Imports veomni_ops and this package's name table only: no torch, no transformers, no flash
package. Each kernel is imported by its factory once a config selects it.

Hardware ranges come from the packages' own sources (read, not yet run on every card). Run on an
H100 (sm 9.0), 2026-11-26: FA2 (flash-attn 2.8.3.post2, built from the sdist) and FA4; FA3 was not
built there (benchmarks/results/h100-2026-11-26-flash/README.md says why).

* FA2 (``flash-attn``): its C++ API checks ``major >= 8`` and nothing above; its setup builds
  sm80/sm90 (and sm100/sm110/sm120 with CUDA >= 12.8) plus PTX of the newest arch for forward
  compatibility. No upper bound is declared.
* FA3 (``flash-attn-3``, ``hopper/``): 3.0.0 builds sm80 kernels and sm90a kernels and checks
  ``major >= 8``; sm90a code runs only on 9.0, sm80 code on any 8.x. Nothing is built for 10.x+,
  so the range is 8.0..9.0.
* FA4 (``flash-attn-4`` 4.0.0b36, ``flash_attn/cute/interface.py``): the forward accepts
  8.x..12.x, but the backward asserts ``arch // 10 in [9, 10, 11, 12]``. Training needs the
  backward, so the range is 9.0..12.x.
"""

from __future__ import annotations

from typing import Any

from veomni_ops.hookspecs import hookimpl
from veomni_ops.spec import HardwareRequirement, KernelSpec, SpecDefaults, Tolerance

from .packages import PACKAGES

#: The veomni-ops plugin API versions this backend is built for (docs/writing-a-backend.md,
#: "The plugin API version"): outside it, discovery refuses the backend and says what to upgrade.
VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"

# Why supports_compile is False for all three: the padding-mask and packed-sequence paths
# derive cu_seqlens with nonzero()/item() (data-dependent shapes and host syncs), which
# torch.compile(fullgraph=True) cannot trace; FA4's kernels are CuTe-DSL JIT launches that
# dynamo does not trace either.
_FLASH = SpecDefaults(
    kernels="veomni_flash.kernels",
    supports_compile=False,
    dtypes=("bfloat16", "float16"),  # flash kernels take half precision only
    # Against the float64 reference. The kernels round P to the input dtype before the P@V
    # GEMM and round the output once, so the error is a few units of the dtype's epsilon.
    tolerances={"bfloat16": Tolerance(3e-2, 3e-2), "float16": Tolerance(5e-3, 5e-3)},
    features=("softcap", "sliding_window"),
    parallel=("sp",),  # heads from the tensors; no mask under SP (causal/window/packing from the call)
)


def _package(version: int) -> dict[str, Any]:
    """The fields the package table gives: the kernel name, the requirement, the install hint."""
    pkg = PACKAGES[version]
    return {
        "name": pkg.kernel_name,
        "requires": (pkg.requirement,),
        "install_hint": f'pip install "veomni-ops[flash]" and {pkg.install}',
    }


@hookimpl
def attention() -> list[KernelSpec]:
    return [
        _FLASH.spec(
            "attention", "standard", "fa4:flash_attention_4",
            "FlashAttention-4 (CuTe DSL, flash_attn.cute): Hopper/Blackwell, GQA, varlen, no dropout",
            priority=40, hardware=HardwareRequirement(("cuda",), min_capability=(9, 0), max_capability=(12, 9)),
            **_package(4),
        ),
        _FLASH.spec(
            "attention", "standard", "fa3:flash_attention_3",
            "FlashAttention-3 (flash_attn_interface): tuned for Hopper, GQA, varlen, no dropout",
            priority=35, hardware=HardwareRequirement(("cuda",), min_capability=(8, 0), max_capability=(9, 0)),
            **_package(3),
        ),
        # Priority 5, below the core's sdpa (10): on an H100 (2026-11-26, flash-attn 2.8.3.post2, torch 2.11
        # cu130) sdpa (cuDNN) ran the attn preset 1.55x faster forward+backward (4.07 vs 6.30 ms) and
        # 1.53x forward; FA4 1.72x. auto takes FA2 where sdpa cannot serve the layer (softcap), or by name.
        _FLASH.spec(
            "attention", "standard", "fa2:flash_attention_2",
            "FlashAttention-2 (flash_attn): Ampere and newer, GQA, varlen, dropout",
            priority=5, hardware=HardwareRequirement(("cuda",), min_capability=(8, 0)),
            features=("softcap", "sliding_window", "dropout"), **_package(2),
        ),
    ]
