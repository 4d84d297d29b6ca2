"""``moe_experts`` contract -> VeOmni's ``fused_npu`` path on torch_npu.

The same five steps as VeOmni's ``_npu_fused_moe_forward`` (``veomni/ops/kernels/moe/
npu_group_gemm.py``), written from the torch_npu / CANN documentation:

1. ``torch_npu.npu_moe_token_permute(tokens [T, H], indices [T, K])`` -> ``(permuted
   [T*K, H], sorted_indices int32 [T*K])``: the T*K routes sorted by expert
   (``argsort(flatten(indices))``), ``sorted_indices`` = where each flat route ``t*K + k``
   landed. Autograd: ``tokens`` (op-plugin ``derivatives.yaml``, since op-plugin 7.2.0).
2. ``npu_grouped_matmul([permuted], [gate_up_proj^T [E, H, 2I]], group_list=ends,
   group_type=0, group_list_type=0, split_item=2)``: one GEMM per expert over its
   contiguous rows (``ends`` = cumulative route counts, a device tensor: no host sync).
3. ``torch_npu.npu_swiglu(gate_up, dim=-1)``: silu(first half) * second half -- the gate
   rows of ``gate_up_proj`` come first (transformers v5 layout), so no reordering.
4. ``npu_grouped_matmul`` with ``down_proj^T [E, I, H]``.
5. ``torch_npu.npu_moe_token_unpermute(y, sorted_indices, probs=top_k_weights)``:
   ``out[t] = sum_k probs[t, k] * y[sorted_indices[t*K + k]]``. Autograd: permuted tokens and
   probs (``_npu_moe_token_unpermute`` in ``derivatives.yaml``, since op-plugin 7.2.0).

``npu_grouped_matmul`` has no autograd formula, so :class:`_GroupedMatmul` supplies one
(what VeOmni's ``GmmFunction`` does): ``dX = gmm(dY, W^T)`` grouped over M, and
``dW = gmm(X^T, dY)`` grouped over K (``group_type=2``), one ``[K, N]`` block per expert.

Routes to expert ``-1`` or ``E`` (the contract's expert-parallel sentinels) contribute
nothing, as in the core's ``grouped_mm`` kernel: they are sent to expert 0 with weight 0
(their rows are computed and multiplied by zero; no host sync to drop them). Any other index
outside ``[0, E)`` is refused by the core's ``check_expert_index`` with a ``ValueError``
naming it and E when the values can be read without a cost (``VEOMNI_OPS_CHECK_VALUES=1``,
or CPU tensors in the tests' stand-in); on the NPU without that switch it is not checked (a
check would synchronise with the host) and routes nowhere like a sentinel, never out of bounds.

Documented limits checked here: K <= 512 (permute/unpermute), E <= 1024 groups, H and 2I
below 65536 (grouped-matmul inner-axis limit). The permute/unpermute kernels are listed for
Atlas A2/A3 only.
"""

from __future__ import annotations

from typing import Any

import torch
from veomni_ops.kernels.moe import routed

from ._common import CHECKS, torch_npu

_OP = "moe_experts"
MAX_TOP_K = 512  # npu_moe_token_permute / unpermute: topK <= 512
MAX_EXPERTS = 1024  # npu_grouped_matmul with a tensor group_list: at most 1024 groups
INNER_LIMIT = 65536  # npu_grouped_matmul: the last dim of x and of weight must be below this


def _gmm(x: torch.Tensor, weight: torch.Tensor, group_list: torch.Tensor, *, group_type: int, split_item: int) -> torch.Tensor:
    return torch_npu.npu_grouped_matmul(
        [x], [weight], bias=None, group_list=group_list, split_item=split_item, group_type=group_type,
        group_list_type=0,
    )[0]


class _GroupedMatmul(torch.autograd.Function):
    """``y[rows of e] = x[rows of e] @ weight[e]`` for every expert e; ``group_ends`` = cumsum of rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight, group_ends)
        return _gmm(x, weight, group_ends, group_type=0, split_item=2)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, group_ends = ctx.saved_tensors
        grad_out = grad_out.contiguous()  # the M-grouped GEMM takes no transposed left operand
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            # [M, N] @ [E, N, K] grouped over M -> [M, K]
            grad_x = _gmm(grad_out, weight.transpose(1, 2), group_ends, group_type=0, split_item=2)
        if ctx.needs_input_grad[1]:
            # [K, M] @ [M, N] grouped over the shared M axis -> [E, K, N]: one block per expert
            grad_w = _gmm(x.t(), grad_out, group_ends, group_type=2, split_item=3)
        return grad_x, grad_w, None


def _check(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> None:
    # The contract's checks are the core's; the NPU narrows dtypes and device type.
    _, h, e, i, k = CHECKS.check_moe_inputs(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
    two_i = 2 * i
    if not 1 <= k <= MAX_TOP_K:
        raise ValueError(f"{_OP} (npu): npu_moe_token_permute takes 1 to {MAX_TOP_K} routes per token, got K = {k}")
    if not 1 <= e <= MAX_EXPERTS:
        raise ValueError(
            f"{_OP} (npu): npu_grouped_matmul takes 1 to {MAX_EXPERTS} groups, got {e} experts; "
            "use another moe_implementation (e.g. 'eager') for this model"
        )
    if max(h, two_i) >= INNER_LIMIT:
        raise ValueError(
            f"{_OP} (npu): npu_grouped_matmul needs the hidden size ({h}) and 2 x intermediate size ({two_i}) "
            f"below {INNER_LIMIT}; use another moe_implementation (e.g. 'eager') for this model"
        )
    CHECKS.check_expert_index(top_k_index, e)


def moe_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """Routed SiLU-gated experts, transformers v5 layout; output ``[T, H]`` in ``hidden_states.dtype``."""
    _check(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
    t = hidden_states.shape[0]
    num_experts = gate_up_proj.shape[0]
    dtype = hidden_states.dtype
    if t == 0:
        return hidden_states * 0  # the permute kernel takes no empty input; an empty result, in the graph
    valid = routed(top_k_index, num_experts)
    index = torch.where(valid, top_k_index, torch.zeros_like(top_k_index)).to(torch.int32)
    # The unpermute kernel takes probs in the tokens' dtype (the model's routing weights are
    # cast to the hidden dtype before the weighted sum, as the eager reference's product is).
    weights = torch.where(valid, top_k_weights, torch.zeros_like(top_k_weights)).to(dtype)

    # Route counts per expert, then their running sum: the row range of each expert in the
    # permuted order (fixed size E, computed on the device, no host sync).
    flat = index.reshape(-1).long()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    group_ends = counts.cumsum(0)

    permuted, sorted_indices = torch_npu.npu_moe_token_permute(hidden_states, index)
    gate_up = _GroupedMatmul.apply(permuted, gate_up_proj.transpose(1, 2), group_ends)  # [T*K, 2I]
    act = torch_npu.npu_swiglu(gate_up, dim=-1)  # [T*K, I] = silu(gate) * up
    y = _GroupedMatmul.apply(act, down_proj.transpose(1, 2), group_ends)  # [T*K, H]
    return torch_npu.npu_moe_token_unpermute(y, sorted_indices, probs=weights)
