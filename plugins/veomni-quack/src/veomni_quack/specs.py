"""Hook implementations of the ``quack`` backend (quack-kernels, Dao-AILab/quack, CuTe-DSL).

This module is the entry point the core discovers (``veomni_ops.backends: quack``). It stays
light: it imports only ``veomni_ops`` -- never torch, ``quack`` or ``cutlass`` (a test
checks this in a fresh interpreter). The adapters are named by ``factory`` strings and
imported only when a plan selects them.

What is registered, and why each field has the value it has:

* ``requires``: quack-kernels 0.6.5 (``>=0.6.5,<0.7``: CuTe-DSL kernels are tied to the DSL
  release they were written for, so no untried minor release is accepted) and
  nvidia-cutlass-dsl >= 4.8.1, the pair this backend has been written and checked against.
* ``hardware``: CUDA sm 9.0+. Quack's README lists H100, B200/B300 and RTX 50 (sm 9.0,
  10.x, 12.0); its sources carry sm 8.x paths for some kernels, but Ampere is not listed and
  has not been run.
* ``supports_compile``: False. Every adapter checks the label range or layout on the host
  (the cross-entropies synchronise); Quack's row kernels register as torch custom ops, but
  tracing through the adapters has not been run.
* ``rms_norm``: both variants (``quack.rmsnorm.rmsnorm``, ``weight_offset`` 0.0 / 1.0).
  ``offset`` is exactly the contract; ``standard`` rounds once instead of twice (kernels/rms_norm.py).
* ``cross_entropy``: ``logits`` (``quack.cross_entropy.cross_entropy``, float32 per-row
  losses, ``reduction="sum"``) and ``fused_linear`` (``quack.linear_cross_entropy``), the
  latter **not yet run**: importing ``quack.linear_cross_entropy`` fails with
  nvidia-cutlass-dsl 4.8.1 (H100 run of 2026-11-21, ContextVar semantic-key TypeError), so
  resolution refuses it with the import error chained. It stays registered on purpose
  (README "fused_linear").
* Not registered: ``swiglu`` (Quack has SwiGLU only as a GEMM epilogue, no elementwise
  ``silu(gate) * up`` kernel), ``rotary`` (Quack's rotary is a GEMM epilogue / interleaved
  layout, not the contract), ``moe_experts`` (Quack's varlen GEMM with a row gather could
  carry it, but the full forward and backward were not written: README), ``load_balancing_loss``
  and ``attention`` (no such kernels in quack-kernels).
"""

from __future__ import annotations

from collections.abc import Mapping

from veomni_ops.hookspecs import hookimpl
from veomni_ops.spec import HardwareRequirement, KernelSpec, Tolerance

#: The veomni-ops plugin API versions this backend is built for (docs/writing-a-backend.md,
#: "The plugin API version"): outside it, discovery refuses the backend and says what to upgrade.
VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"

NAME = "quack"
PRIORITY = 25
INSTALL_HINT = 'pip install "veomni-ops[quack]"'
REQUIRES = ("quack-kernels>=0.6.5,<0.7", "nvidia-cutlass-dsl>=4.8.1")
_KERNELS = "veomni_quack.kernels"

_CUDA_SM90 = HardwareRequirement(("cuda",), min_capability=(9, 0))

# float32 math inside the kernel, one rounding to the input dtype at the end (the standard
# variant's contract rounds twice: at most about one more unit in the last place).
_RMS_TOL: Mapping[str, Tolerance] = {
    "float32": Tolerance(1e-5, 1e-4),
    "bfloat16": Tolerance(2e-2, 2e-2),
    "float16": Tolerance(2e-3, 2e-3),
}
# Loss: float32 per row from the input-dtype logits (as the reference); dlogits are
# stored in the logits dtype.
_CE_TOL: Mapping[str, Tolerance] = {
    "float32": Tolerance(1e-5, 1e-4),
    "bfloat16": Tolerance(2e-2, 2e-2),
    "float16": Tolerance(2e-3, 2e-3),
}
# Logits from a 16-bit GEMM; dW sums over every token (float32 accumulator, one cast).
_FLCE_TOL: Mapping[str, Tolerance] = {
    "bfloat16": Tolerance(2e-2, 2e-2),
    "float16": Tolerance(5e-3, 5e-3),
}


def _spec(
    op: str,
    variant: str,
    factory: str,
    tolerances: Mapping[str, Tolerance],
    description: str,
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16"),
) -> KernelSpec:
    return KernelSpec(
        name=NAME,
        op=op,
        variant=variant,
        factory=f"{_KERNELS}.{factory}",
        hardware=_CUDA_SM90,
        requires=REQUIRES,
        supports_backward=True,
        supports_compile=False,
        dtypes=dtypes,
        priority=PRIORITY,
        tolerances=dict(tolerances),
        description=description,
        install_hint=INSTALL_HINT,
    )


@hookimpl
def rms_norm() -> list[KernelSpec]:
    return [
        _spec(
            "rms_norm", "standard", "rms_norm:rms_norm_standard", _RMS_TOL,
            "Quack RMSNorm (quack.rmsnorm.rmsnorm, weight_offset=0): x̂ * w in fp32, one cast; fp32 dW partials. "
            "H must be even when x or w is bf16/fp16 (Quack 0.6.5 cannot compile 16-bit copies: refused)",
        ),
        _spec(
            "rms_norm", "offset", "rms_norm:rms_norm_offset", _RMS_TOL,
            "Quack RMSNorm (quack.rmsnorm.rmsnorm, weight_offset=1.0): x̂ * (1 + w) in fp32, one cast. "
            "H must be even when x or w is bf16/fp16 (Quack 0.6.5 cannot compile 16-bit copies: refused)",
        ),
    ]


@hookimpl
def cross_entropy() -> list[KernelSpec]:
    return [
        _spec(
            "cross_entropy", "logits", "cross_entropy:cross_entropy_sum", _CE_TOL,
            "Quack cross-entropy (quack.cross_entropy, fp32 per-row loss, reduction='sum'), out-of-place backward. "
            "Logits padded (one copy) when V is odd (16-bit) or Quack 0.6.5's cluster tiling would give NaN "
            "(sm 9.0 bf16: e.g. V = 151936, 152064, 100352)",
        ),
        _spec(
            "cross_entropy", "fused_linear", "linear_cross_entropy:fused_linear_cross_entropy_sum", _FLCE_TOL,
            "Quack chunked linear cross-entropy (quack.linear_cross_entropy), no bias, H/V multiples of 8. "
            "NOT YET RUN: registered, refuses at resolution with nvidia-cutlass-dsl 4.8.1 (H100, 2026-11-21): "
            "importing quack.linear_cross_entropy 0.6.5 raises \"TypeError: epilogue fn depends on "
            "<ContextVar name='_LOC_TRANSFORMS'> ... which has no fail-closed semantic key\"",
            dtypes=("bfloat16", "float16"),
        ),
    ]
