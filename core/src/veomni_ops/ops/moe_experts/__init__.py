"""The ``moe_experts`` op (see :mod:`veomni_ops.ops`): the routed experts of an MoE layer."""

from __future__ import annotations

from ..base import STEP_EVIDENCE, VEOMNI_SOURCE, DeviceChoice, NotProvided, OpDef, OpInfo, Preference, gpu_default

#: The kernel contract: the docstring of the ``moe_experts`` hook (:class:`veomni_ops.hookspecs.OpHookspecs`).
CONTRACT = """The routed experts of an MoE layer, transformers v5 layout, SiLU-gated.

Kernel signature::

    kernel(hidden_states: Tensor[T, H], top_k_index: LongTensor[T, K],
           top_k_weights: Tensor[T, K], gate_up_proj: Tensor[E, 2I, H],
           down_proj: Tensor[E, H, I]) -> Tensor[T, H]

For every token t and route k with expert ``e = top_k_index[t, k]``:
``g, u = (gate_up_proj[e] @ h_t).chunk(2)``; ``y_tk = down_proj[e] @ (silu(g) * u)``;
``out_t = sum_k top_k_weights[t, k] * y_tk``. Output in ``hidden_states.dtype``.
It must be correct when an expert gets no token, when every token goes to one
expert, and when a token lists the same expert twice. Backward produces
gradients for ``hidden_states``, ``top_k_weights``, ``gate_up_proj`` and
``down_proj``. Variant: ``standard``.

Expert indices outside ``[0, E)``: ``-1`` and ``E`` mean "this route goes to no
expert here" -- what an expert-parallel dispatcher writes for a route whose expert
lives on another rank (transformers writes ``E``): the route contributes zero to
``out_t``, its ``top_k_weights`` entry gets a zero gradient, and no expert's
weights see it. Any other index (``< -1`` or ``> E``) is an error: ``ValueError``
naming the op, the index and E. A kernel that synchronises with the host anyway
checks always; one that promises no synchronisation checks where reading the
indices is free (CPU tensors) or asked for (``VEOMNI_OPS_CHECK_VALUES=1``), and
otherwise asserts on the device where it can (``torch._assert_async`` on CUDA: the
process stops at a device-side assertion); either way it never reads out of bounds
and such a route never contributes to the output. The core's
``veomni_ops.kernels.moe.check_expert_index`` implements exactly this.
"""

OP = OpDef(
    "moe_experts", order=50, info=OpInfo(("standard",), "moe_implementation", parallel=("ep",)), contract=CONTRACT,
    package=__name__, wrapper=".parallel:wrap",
    legacy={"fused": "quack", "fused_triton": "triton", "fused_npu": "npu", "fused_quack": "quack"},
    veomni_values={
        "fused_triton": gpu_default("npu", "triton", 986),
        "fused": DeviceChoice("npu", "quack", "VeOmni's deprecated alias: fused_npu on an Ascend NPU, fused_quack "
                                              f"elsewhere ({VEOMNI_SOURCE}:1161-1169)"),
    },
    veomni_not_provided={
        # veomni 0.1.12 on the package index (newer than d977449) adds Cambricon MLU kernels.
        name: NotProvided(
            f"the Cambricon MLU experts kernel {name!r} of veomni 0.1.12 (MLU group GEMM)",
            "torch_mlu on a Cambricon MLU (a device veomni-ops does not know)",
            "moe_implementation: triton, quack or grouped_mm on CUDA, npu on Ascend, eager, or auto",
        )
        for name in ("fused_mlu", "fused_mlu_triton")
    },
    compile_preferences={"cuda": (
        Preference("grouped_mm", "standard", "grouped_mm (torch._grouped_mm) measured faster per step than triton "
                   "under torch.compile (bf16, MoE small, one run: 2.4%)", STEP_EVIDENCE),
    )},
)
