"""Hook implementations of the ``npu`` backend (Ascend NPUs through ``torch_npu``).

This module is the entry point the core discovers (``veomni_ops.backends: npu``). It must
stay light: it imports only ``veomni_ops`` -- never torch or ``torch_npu``. The adapters are
named by ``factory`` strings and imported only when a plan selects them.

NOTHING HERE HAS RUN ON A REAL NPU. Every adapter is written from Ascend's documentation
(torch_npu API reference, op-plugin ``derivatives.yaml``, the CANN kernels' golden
references) and tested against a stand-in ``torch_npu`` in plain torch. The tolerances are
declared from the documented arithmetic, not measured.

Every spec is named ``npu`` (VeOmni's values: ``rms_norm_implementation: npu``,
``rotary_pos_emb_implementation: npu``; ``moe_implementation: fused_npu`` maps to ``npu``).

* ``hardware``: device type ``npu``. The core cannot tell Ascend generations apart; the
  README lists what needs an Atlas A2/A3 (910B/910C) part: bfloat16 and mixed-dtype RMSNorm,
  ``npu_swiglu``, the MoE token permutation.
* ``supports_backward``: from op-plugin's ``op_plugin/config/derivatives.yaml``, which
  registers autograd formulas for ``npu_rms_norm`` (self, gamma), ``npu_rotary_mul`` (self,
  r1, r2), ``npu_swiglu`` (self), ``npu_moe_token_permute`` (tokens) and
  ``_npu_moe_token_unpermute`` (permuted_tokens, probs). ``npu_grouped_matmul`` has none:
  the MoE adapter wraps it in its own autograd function (as VeOmni's ``fused_npu`` does).
* ``requires``: ``torch-npu>=2.1`` for the elementwise ops (their autograd formulas are
  declared for torch_npu v2.1 and newer). The MoE kernel needs ``torch-npu>=2.7.1``: the
  permute/unpermute autograd formulas first appear in op-plugin 7.2.0, and 2.7.1 is the
  first torch-npu line released from 7.2.0 (README, "Versions").
* ``supports_compile``: False everywhere (unverified; torchair / dynamo on NPU never run).
* ``attention``: ``npu_fusion_attention`` (``kernels/attention.py``), VeOmni's flash attention on
  an NPU; bfloat16/float16 (what every torch_npu release documents), no soft-capping or sinks.
* Not registered: ``cross_entropy`` (VeOmni's NPU path ``chunk_loss`` is plain PyTorch; the
  core's ``chunked`` kernel is that, and runs on any device) and ``load_balancing_loss`` (no
  torch_npu kernel with that contract here).
"""

from __future__ import annotations

from veomni_ops.hookspecs import hookimpl
from veomni_ops.spec import ELEMENTWISE, HardwareRequirement, KernelSpec, SpecDefaults, Tolerance

#: The veomni-ops plugin API versions this backend is built for (docs/writing-a-backend.md,
#: "The plugin API version"): outside it, discovery refuses the backend and says what to upgrade.
VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"

# Every kernel: device type npu, float32/bfloat16/float16, torch-npu>=2.1 unless said (README
# "Versions" gives the reasons), float32 math inside (the CANN golden references upcast) and one
# rounding to the input dtype at the end, the gradients likewise (ELEMENTWISE). The plugin alone
# computes nothing: the kernels are torch-npu's, and torch-npu runs only on top of Ascend's CANN
# toolkit. The hint says all three (kernels/_common.py says the same when the import fails).
_NPU = SpecDefaults(
    name="npu",
    kernels="veomni_npu.kernels",
    hardware=HardwareRequirement(("npu",)),
    requires=("torch-npu>=2.1",),
    supports_compile=False,
    priority=20,
    tolerances=ELEMENTWISE,
    install_hint=(
        'pip install "veomni-ops[npu]", then Ascend\'s torch-npu built for your torch (pip install '
        'torch-npu==<your torch version>, or pip install "veomni-npu[torch-npu]"), on a machine with an Ascend NPU '
        "and the Ascend CANN toolkit installed and its environment sourced (source "
        "/usr/local/Ascend/ascend-toolkit/set_env.sh): the npu kernels are torch-npu's, and torch-npu runs only on CANN"
    ),
)

# Three roundings in the input dtype (the GEMM outputs and the activation), the weighted sum
# over K routes inside npu_moe_token_unpermute at an undocumented precision, and float32
# GEMMs that may run on the cube unit at reduced (HF32) precision: wider than elementwise.
_MOE_TOL = {"float32": Tolerance(5e-3, 5e-3), "bfloat16": Tolerance(3e-2, 3e-2), "float16": Tolerance(5e-3, 5e-3)}


@hookimpl
def rms_norm() -> list[KernelSpec]:
    return [
        _NPU.spec(
            "rms_norm", "standard", "rms_norm:rms_norm_standard",
            "torch_npu.npu_rms_norm(x, w, eps): x * rstd * w in float32, one cast at the end (not run on an NPU)",
        ),
        # Exact to the contract: gamma = 1 + w formed in float32 (as the reference forms it),
        # and npu_rms_norm with a float32 gamma computes x * rstd * gamma in float32 and casts
        # once (CANN's golden reference); bf16/fp16 x with a float32 gamma is a documented pair.
        _NPU.spec(
            "rms_norm", "offset", "rms_norm:rms_norm_offset",
            "torch_npu.npu_rms_norm(x, 1 + w.float(), eps): x̂ * (1 + w) in float32, one cast (not run on an NPU)",
        ),
    ]


@hookimpl
def rotary() -> list[KernelSpec]:
    # One adapter for both variants: R == D calls npu_rotary_mul on q and k; R < D on their
    # first R channels, then concatenates the untouched rest.
    return [
        _NPU.spec(
            "rotary", "full", "rotary:apply_rotary",
            "torch_npu.npu_rotary_mul(x, cos, sin) 'half' mode = x*cos + rotate_half(x)*sin (not run on an NPU)",
        ),
        _NPU.spec(
            "rotary", "partial", "rotary:apply_rotary",
            "npu_rotary_mul on the first R channels, cat with the rest (one extra copy) (not run on an NPU)",
        ),
    ]


@hookimpl
def swiglu() -> list[KernelSpec]:
    return [
        _NPU.spec(
            "swiglu", "standard", "swiglu:silu_mul",
            "torch_npu.npu_swiglu(cat(gate, up), dim=-1) = silu(first half) * second half; the cat is an extra "
            "copy (not run on an NPU)",
        )
    ]


@hookimpl
def moe_experts() -> list[KernelSpec]:
    return [
        _NPU.spec(
            "moe_experts", "standard", "moe:moe_experts",
            "npu_moe_token_permute + npu_grouped_matmul (gate_up) + npu_swiglu + npu_grouped_matmul (down) + "
            "npu_moe_token_unpermute, VeOmni's fused_npu path (not run on an NPU)",
            requires=("torch-npu>=2.7.1",),  # permute/unpermute autograd formulas: op-plugin 7.2.0
            tolerances=_MOE_TOL,
            parallel=("ep",),  # honours the -1 sentinel; E from gate_up_proj: runs expert-parallel
        )
    ]


# Against the float64 reference: the kernel rounds the probabilities to the input dtype before
# the P@V product and the output once (a flash-attention kernel), as veomni-flash declares.
_ATTENTION_TOL = {"bfloat16": Tolerance(3e-2, 3e-2), "float16": Tolerance(5e-3, 5e-3)}


@hookimpl
def attention() -> list[KernelSpec]:
    # VeOmni's flash attention on an Ascend NPU is this kernel (transformers' NPU flash attention):
    # veomni_ops.veomni.DEVICE_VALUES maps flash_attention_2/3/4 to it on an NPU.
    return [
        _NPU.spec(
            "attention", "standard", "attention:npu_attention",
            "torch_npu.npu_fusion_attention: BSND/BNSD, GQA via head_num, causal as sparse mode 2, boolean masks "
            "(True = masked), packed documents as the TND varlen layout, dropout as keep_prob; no softcap, no sinks, "
            "no weights (not run on an NPU)",
            dtypes=("bfloat16", "float16"),  # float32 is in newer torch_npu docs only
            tolerances=_ATTENTION_TOL,
            features=("sliding_window", "dropout"),
            parallel=("sp",),  # heads from the tensors; causality and packing from the call
        )
    ]
