"""The core's ``rms_norm`` kernels: ``eager`` in both variants (light: ``"module:attr"`` factories)."""

from __future__ import annotations

from ...backends.base import NORM_TOLERANCES, eager_spec
from ...spec import KernelSpec


def specs() -> list[KernelSpec]:
    return [
        eager_spec("rms_norm", "standard", "veomni_ops.ops.rms_norm.kernel:rms_norm_standard", NORM_TOLERANCES,
                   "PyTorch RMSNorm, w * x̂ (as transformers' Qwen3RMSNorm/LlamaRMSNorm)"),
        eager_spec("rms_norm", "offset", "veomni_ops.ops.rms_norm.kernel:rms_norm_offset", NORM_TOLERANCES,
                   "PyTorch RMSNorm, x̂ * (1 + w) in float32 (as transformers' Qwen3NextRMSNorm/Gemma)"),
    ]
