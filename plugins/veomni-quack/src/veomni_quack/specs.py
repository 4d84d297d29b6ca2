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
* ``supports_compile``: False, except ``moe_experts`` (custom ops with fakes). Every other
  adapter checks the label range or layout on the host (the cross-entropies synchronise);
  Quack's row kernels register as torch custom ops, but tracing through the adapters has not
  been run.
* ``rms_norm``: both variants (``quack.rmsnorm.rmsnorm``, ``weight_offset`` 0.0 / 1.0).
  ``offset`` is exactly the contract; ``standard`` rounds once instead of twice (kernels/rms_norm.py).
* ``cross_entropy``: ``logits`` (``quack.cross_entropy.cross_entropy``, float32 per-row
  losses, ``reduction="sum"``) and ``fused_linear`` (``quack.linear_cross_entropy``), the
  latter **not yet run**: importing ``quack.linear_cross_entropy`` fails with
  nvidia-cutlass-dsl 4.8.1 (H100 run of 2026-11-21, ContextVar semantic-key TypeError), so
  resolution refuses it with the import error chained. It stays registered on purpose
  (README "fused_linear").
* ``moe_experts``: ``quack.gemm_interface``'s varlen-M grouped GEMMs with gathered rows
  (``gemm_gated`` with the SwiGLU epilogue, ``gemm``, ``gemm_dgated`` with the route-weight
  scale and reduction) and varlen-K grouped GEMMs for the expert weight gradients
  (kernels/moe.py). bfloat16 and float16 (fp32 is not declared), H and I multiples of 8;
  honours both expert sentinels, so it is declared expert-parallel. Checked on an H100
  (2026-11-25, ``benchmarks/gpu/quack_moe.py``) against float64, forward and backward, bf16
  and fp16, also compiled. Forward and backward are torch.library custom ops with fakes, so it
  compiles with ``fullgraph=True``.
* Not registered: ``swiglu`` (Quack has SwiGLU only as a GEMM epilogue, no elementwise
  ``silu(gate) * up`` kernel), ``rotary`` (Quack's rotary is a GEMM epilogue / interleaved
  layout, not the contract), ``load_balancing_loss`` and ``attention`` (no such kernels in
  quack-kernels).
"""

from __future__ import annotations

from veomni_ops.hookspecs import hookimpl
from veomni_ops.spec import ELEMENTWISE, MATMUL, HardwareRequirement, KernelSpec, SpecDefaults

#: The veomni-ops plugin API versions this backend is built for (docs/writing-a-backend.md,
#: "The plugin API version"): outside it, discovery refuses the backend and says what to upgrade.
VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"

# Every kernel: CUDA sm 9.0+, quack-kernels 0.6.5 with nvidia-cutlass-dsl 4.8.1, float32 math
# inside and one rounding to the input dtype at the end (ELEMENTWISE; the standard norm's
# contract rounds twice: at most about one more unit in the last place; the cross-entropy's
# loss is float32 per row from the input-dtype logits, its dlogits stored in the logits dtype).
_QUACK = SpecDefaults(
    name="quack",
    kernels="veomni_quack.kernels",
    hardware=HardwareRequirement(("cuda",), min_capability=(9, 0)),
    requires=("quack-kernels>=0.6.5,<0.7", "nvidia-cutlass-dsl>=4.8.1"),
    supports_compile=False,
    priority=25,
    tolerances=ELEMENTWISE,
    install_hint='pip install "veomni-ops[quack]"',
)


@hookimpl
def rms_norm() -> list[KernelSpec]:
    return [
        _QUACK.spec(
            "rms_norm", "standard", "rms_norm:rms_norm_standard",
            "Quack RMSNorm (quack.rmsnorm.rmsnorm, weight_offset=0): x̂ * w in fp32, one cast; fp32 dW partials. "
            "H must be even when x or w is bf16/fp16 (Quack 0.6.5 cannot compile 16-bit copies: refused)",
        ),
        _QUACK.spec(
            "rms_norm", "offset", "rms_norm:rms_norm_offset",
            "Quack RMSNorm (quack.rmsnorm.rmsnorm, weight_offset=1.0): x̂ * (1 + w) in fp32, one cast. "
            "H must be even when x or w is bf16/fp16 (Quack 0.6.5 cannot compile 16-bit copies: refused)",
        ),
    ]


@hookimpl
def cross_entropy() -> list[KernelSpec]:
    return [
        _QUACK.spec(
            "cross_entropy", "logits", "cross_entropy:cross_entropy_sum",
            "Quack cross-entropy (quack.cross_entropy, fp32 per-row loss, reduction='sum'), out-of-place backward. "
            "Logits padded (one copy) when V is odd (16-bit) or Quack 0.6.5's cluster tiling would give NaN "
            "(sm 9.0 bf16: e.g. V = 151936, 152064, 100352)",
        ),
        # Logits from a 16-bit GEMM; dW sums over every token (float32 accumulator, one cast).
        _QUACK.spec(
            "cross_entropy", "fused_linear", "linear_cross_entropy:fused_linear_cross_entropy_sum",
            "Quack chunked linear cross-entropy (quack.linear_cross_entropy), no bias, H/V multiples of 8. "
            "NOT YET RUN: registered, refuses at resolution with nvidia-cutlass-dsl 4.8.1 (H100, 2026-11-21): "
            "importing quack.linear_cross_entropy 0.6.5 raises \"TypeError: epilogue fn depends on "
            "<ContextVar name='_LOC_TRANSFORMS'> ... which has no fail-closed semantic key\"",
            dtypes=("bfloat16", "float16"),
            tolerances=MATMUL,
        ),
    ]


@hookimpl
def moe_experts() -> list[KernelSpec]:
    # Grouped GEMMs in the input dtype, fp32 accumulation; bf16 intermediates (preact, act, y)
    # as every grouped-GEMM MoE kernel here: the matmul tolerances.
    return [
        _QUACK.spec(
            "moe_experts", "standard", "moe:moe_experts",
            "Quack varlen grouped GEMMs over expert-sorted routes (quack.gemm_interface): token rows gathered in "
            "the GEMM (A_idx), fused SwiGLU epilogue, deterministic combine; backward: gemm_dgated (route-weight "
            "gradient in its epilogue) and varlen-K weight-gradient GEMMs. No host sync. H, I multiples of 8. "
            "H100, Qwen3-30B-A3B experts: fwd+bwd 5.41 ms (veomni-triton 5.35, core grouped_mm 7.03)",
            dtypes=("bfloat16", "float16"),
            tolerances=MATMUL,
            parallel=("ep",),
            # Forward and backward are torch.library custom ops with fakes (fullgraph traced on the CPU
            # against the stand-in; the GPU script's "compile" section runs it with inductor).
            supports_compile=True,
            # The backend's priority 25: checked on an H100 (benchmarks/results/h100-2026-11-25-quack-moe:
            # float64 reference fwd+bwd, fp16, sentinels, compile) and measured there below veomni-triton
            # (30; 1% faster) and above veomni-liger (20) and the core's grouped_mm (10).
        )
    ]
