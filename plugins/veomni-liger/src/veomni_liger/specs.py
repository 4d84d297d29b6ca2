"""Hook implementations of the ``liger`` backend (Liger-Kernel, linkedin/Liger-Kernel).

This module is the entry point the core discovers (``veomni_ops.backends: liger``). It must
stay light: it imports only ``veomni_ops`` -- never torch, Triton or ``liger_kernel``. The
adapters are named by ``factory`` strings and imported only when a plan selects them.

Every spec is named ``liger`` (VeOmni's legacy value ``liger_kernel`` maps to it in the
core's config). What is registered, and why each field has the value it has:

* ``requires``: the lowest liger-kernel release that has the API the adapter calls *and*
  no known correctness bug on the path it takes, read from Liger's git history (see
  README, "Versions"). Only 0.8.5 has been run.
* ``hardware``: CUDA only (ROCm has never been run). sm 8.0+ because bf16 Triton kernels
  need Ampere; the MoE kernel asks for sm 9.0 (its backward uses bf16 ``atomic_add`` and
  Liger tunes it for Hopper/Blackwell; it has not been run on Ampere).
* ``supports_compile``: False everywhere until a GPU run shows otherwise. The cross-entropy
  and MoE kernels synchronise with the host (``.item()``) and cannot trace with
  ``fullgraph=True``; for RMSNorm, RoPE and SwiGLU it is untested (Triton under the CPU
  interpreter cannot be traced by dynamo). ``veomni-ops check --backend veomni-liger --compile``
  on a GPU says whether each compiles (README, ``supports_compile``).
* Not registered: ``load_balancing_loss`` and ``attention`` (Liger 0.8.5 has no kernel with
  those contracts).
"""

from __future__ import annotations

from veomni_ops.hookspecs import hookimpl
from veomni_ops.spec import ELEMENTWISE, MATMUL, HardwareRequirement, KernelSpec, SpecDefaults, Tolerance

from .memory import fused_linear_extra

#: The veomni-ops plugin API versions this backend is built for (docs/writing-a-backend.md,
#: "The plugin API version"): outside it, discovery refuses the backend and says what to upgrade.
VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"

_CUDA_SM90 = HardwareRequirement(("cuda",), min_capability=(9, 0))

# Every kernel: CUDA sm80+, float32/bfloat16/float16, fp32 math inside and one or two roundings
# to the input dtype (ELEMENTWISE; a cross-entropy's per-token losses are stored in the logits
# dtype before the float32 sum). Each spec names its lowest liger-kernel release (README
# "Versions" gives the reasons).
_LIGER = SpecDefaults(
    name="liger",
    kernels="veomni_liger.kernels",
    hardware=HardwareRequirement(("cuda",), min_capability=(8, 0)),
    supports_compile=False,
    priority=20,
    tolerances=ELEMENTWISE,
    install_hint='pip install "veomni-ops[liger]"',
)

# tl.dot on float32 inputs uses TF32 (10-bit mantissa) on NVIDIA GPUs (Liger's MoE kernels pass
# no input_precision, so Triton's default applies); dS is accumulated with atomic_add in the
# activation dtype. Measured on an H100 (`veomni-ops check --backend veomni-liger`, 2026-11-21):
# float32 expert-weight gradients 0.009 at unit scale (eager float32: 0.00001), so 5e-3 failed.
_MOE_TOL = {
    "float32": Tolerance(1.5e-2, 1.5e-2),
    "bfloat16": Tolerance(3e-2, 3e-2),
    "float16": Tolerance(1.5e-2, 1.5e-2),  # float16 and TF32 both keep 10 mantissa bits (H100: 0.0078)
}


@hookimpl
def rms_norm() -> list[KernelSpec]:
    # fp32 accumulation of dW in llama casting mode: #950, first released in 0.6.5.
    return [
        _LIGER.spec(
            "rms_norm", "standard", "rms_norm:rms_norm_standard",
            "Liger RMSNorm, casting_mode='llama' (fp32 statistics, cast x̂, then * w), out-of-place backward",
            requires=("liger-kernel>=0.6.5",),
        ),
        _LIGER.spec(
            "rms_norm", "offset", "rms_norm:rms_norm_offset",
            "Liger RMSNorm, offset=1.0 casting_mode='gemma' (x̂ * (1 + w) all in fp32), out-of-place backward",
            requires=("liger-kernel>=0.6.5",),
        ),
    ]


@hookimpl
def rotary() -> list[KernelSpec]:
    return [
        _LIGER.spec(
            "rotary", "full", "rotary:apply_rotary_full",
            "Liger RoPE (rope_forward/backward), q and k in one launch; rotary dim == head dim",
            requires=("liger-kernel>=0.6.1",),  # int64 program ids (no overflow at long sequences): #804
        ),
        _LIGER.spec(
            "rotary", "partial", "rotary:apply_rotary_partial",
            "Liger RoPE (rope_forward/backward, rotary_dim): first R channels rotated, the rest untouched",
            # rotary_dim < head_dim first supported in 0.8.5; older releases read cos/sin as if
            # they were head_dim wide (silently wrong for partial rotary).
            requires=("liger-kernel>=0.8.5",),
        ),
    ]


@hookimpl
def swiglu() -> list[KernelSpec]:
    return [
        _LIGER.spec(
            "swiglu", "standard", "swiglu:silu_mul",
            "Liger SiLU*mul (swiglu_forward/backward); backward overwrites gate/up with their gradients",
            requires=("liger-kernel>=0.3.1",),  # swiglu_forward/backward with an int64 program id (#251)
        )
    ]


@hookimpl
def cross_entropy() -> list[KernelSpec]:
    return [
        _LIGER.spec(
            "cross_entropy", "logits", "cross_entropy:cross_entropy_sum",
            "Liger cross-entropy (online softmax, gradient computed in forward into the logits buffer)",
            requires=("liger-kernel>=0.6.3",),  # cross_entropy_forward stops writing unneeded gradients: #894
        ),
        _LIGER.spec(
            "cross_entropy", "fused_linear", "cross_entropy:fused_linear_cross_entropy_sum",
            "Liger fused linear cross-entropy (chunked logits, grads in forward, fp32 dW accumulator)",
            requires=("liger-kernel>=0.6.4",),  # accum_dtype (#830, 0.6.2) and a working no-grad path (#931)
            tolerances=MATMUL,
            # 1.449 GiB beyond inputs and gradients at 8k / 16k / 32k tokens (H100, hidden 2560, V 151,936,
            # bf16, fwd+bwd: benchmarks/results/h100-2026-11-26-issue24/callA/bench-flce.json)
            extra_memory=fused_linear_extra,
        ),
    ]


@hookimpl
def moe_experts() -> list[KernelSpec]:
    return [
        _LIGER.spec(
            "moe_experts", "standard", "moe:moe_experts",
            "Liger fused MoE (LigerFusedMoEFunction): Triton grouped GEMM with fused gather and SwiGLU",
            # LigerFusedMoEFunction appeared in 0.8.0; int32 overflow fix (#1248) in 0.8.1; the dx
            # backward miscompile fix (separate gate/up accumulators) in 0.8.3.
            requires=("liger-kernel>=0.8.3",),
            hardware=_CUDA_SM90,
            tolerances=_MOE_TOL,
            parallel=("ep",),  # honours the -1 sentinel; E from gate_up_proj: runs expert-parallel
        )
    ]
