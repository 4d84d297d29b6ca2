"""The core's ``residual_rms_norm`` kernel: ``eager`` (light: a ``"module:attr"`` factory)."""

from __future__ import annotations

from collections.abc import Mapping

from ...backends.base import eager_spec
from ...spec import KernelSpec, Tolerance

#: Per dtype, a small multiple (2-4x) of eager PyTorch's own worst error against the float64
#: reference, as ``max |a - b| / (s + |b|)`` (``s`` the unit scale of the conformance kit) over
#: the small and full cases, seeds 0-2, on the CPU: float32 5.8e-7 (dx, tiny-64x4096), bfloat16
#: 0.0206 (dx, odd-hidden-300x5121), float16 0.0028 (dx, same case); outputs alone 1.9e-7 / 7.9e-3 /
#: 9.6e-4 (normed), the add 4.8e-8 / 3.1e-3 / 3.9e-4.
TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(1e-10, 1e-9),
    "float32": Tolerance(2.5e-6, 2.5e-6),
    "bfloat16": Tolerance(4e-2, 4e-2),
    "float16": Tolerance(6e-3, 6e-3),
}


def specs() -> list[KernelSpec]:
    return [eager_spec("residual_rms_norm", "standard", "veomni_ops.ops.residual_rms_norm.kernel:residual_rms_norm",
                       TOLERANCES, "PyTorch residual + x, then RMSNorm w * x̂ (as transformers' decoder layers)")]
