"""Routed experts of an MoE layer (transformers v5 layout), SiLU-gated.

* :func:`check_moe_inputs` — the contract's shape/dtype/device checks, public so that
  every backend's adapter runs the same ones (with its own tag in the messages).
* :func:`check_expert_index` — the contract's rule for expert indices: ``-1``
  (:data:`NO_EXPERT`) and ``E`` route nowhere (the expert-parallel sentinel), anything else
  outside ``[0, E)`` raises ``ValueError``; public for adapters too. These three are defined
  beside this module in :mod:`veomni_ops.ops.moe_experts.checks` (so that ``BackendChecks``
  binds them without importing this module), re-exported by :mod:`veomni_ops.kernels.checks`,
  and are importable from here.
  :func:`routed` marks the routes that reach an expert.
* :func:`moe_experts_eager` — the reference: a Python loop over the experts that are hit,
  op for op as transformers' ``Qwen3MoeExperts.forward`` (so bitwise equal to it). It
  synchronises with the host (``nonzero``) and has data-dependent shapes: it does not
  compile with ``fullgraph=True``.
* :func:`moe_experts_grouped_mm` — the portable fast kernel (``grouped_mm``): routes are
  sorted by expert, gathered, and each projection is one ``torch._grouped_mm`` over all
  experts (group offsets from a ``searchsorted``, int32); ``w * silu(gate) * up`` in between
  (the route weight applied on the narrow side); the ``K`` route outputs of every token are
  summed (float32 accumulation, one rounding, no atomics). No per-expert Python loop, no
  device-to-host synchronisation, and no masking pass over ``[T*K, H]`` tensors.

``torch._grouped_mm`` facts (torch 2.13, checked in ``_meta_registrations.py`` and
``aten/src/ATen/native/cuda/GroupedBlas.cpp``): CUDA runs a CUTLASS kernel only for
bfloat16 on compute capability 9.x/10.x; any other dtype or GPU takes a fallback that
copies the offsets to the host (a sync) and loops over groups. The CPU implementation is
that loop and accepts float32/bfloat16/float16 eagerly, but the meta kernel (used by
``torch.compile``) accepts bfloat16 only. Every row stride must be a multiple of 16 bytes
(H and I multiples of 8 in bfloat16). This kernel therefore takes bfloat16 on CUDA (it
refuses other dtypes rather than hide a sync) and float32/bfloat16/float16 on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .checks import NO_EXPERT, check_expert_index, check_moe_inputs

#: Its kernels, and the input checks they use (its folder's :mod:`.checks`): what
#: ``veomni_ops.kernels.<module>`` re-exports.
__all__ = ["NO_EXPERT", "check_expert_index", "check_moe_inputs", "grouped_mm_available", "moe_experts_eager",
    "moe_experts_grouped_mm", "routed"]

_OP = "moe_experts"


def routed(top_k_index: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Boolean ``[T, K]``: the routes whose expert is in ``[0, E)`` (the others contribute zero)."""
    return (top_k_index >= 0) & (top_k_index < num_experts)


def moe_experts_eager(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """Per-expert loop, exactly transformers' ``Qwen3MoeExperts.forward`` with SiLU.

    As transformers, the one-hot mask has an extra class ``E`` that the loop skips; routes to
    ``-1`` are mapped to it, so both sentinels contribute zero. Other indices outside
    ``[0, E)`` raise (the loop synchronises anyway, so the check costs nothing extra).
    """
    check_moe_inputs(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
    num_experts = gate_up_proj.shape[0]
    check_expert_index(top_k_index, num_experts, always=True)
    final_hidden_states = torch.zeros_like(hidden_states)
    with torch.no_grad():
        index = top_k_index.long()
        index = torch.where(index == NO_EXPERT, num_experts, index)
        expert_mask = F.one_hot(index, num_classes=num_experts + 1).permute(2, 1, 0)  # [E + 1, K, T]
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:
        expert_idx = expert_idx[0]
        if expert_idx == num_experts:
            continue
        top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
        current_state = hidden_states[token_idx]
        gate, up = F.linear(current_state, gate_up_proj[expert_idx]).chunk(2, dim=-1)
        current_hidden_states = F.silu(gate) * up
        current_hidden_states = F.linear(current_hidden_states, down_proj[expert_idx])
        current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
        final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
    return final_hidden_states


def grouped_mm_available(device: torch.device | str | None = None) -> bool:
    """Whether :func:`moe_experts_grouped_mm` can run on ``device`` without a hidden host sync.

    ``None`` asks only whether this torch has ``torch._grouped_mm``. For a CUDA device it
    also needs the CUTLASS path: NVIDIA compute capability 9.x or 10.x (not ROCm).
    """
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device is None:
        return True
    device = torch.device(device)
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        if torch.version.hip is not None or not torch.cuda.is_available():
            return False
        return torch.cuda.get_device_capability(device)[0] in (9, 10)
    return False


def _check_grouped(hidden_states: torch.Tensor, gate_up_proj: torch.Tensor) -> None:
    if not hasattr(torch, "_grouped_mm"):
        raise RuntimeError(
            f"{_OP} 'grouped_mm': this torch ({torch.__version__}) has no torch._grouped_mm; "
            "upgrade torch (>= 2.8) or set moe_implementation: eager"
        )
    dtype, device = hidden_states.dtype, hidden_states.device
    if device.type == "cuda":
        if dtype != torch.bfloat16:
            raise TypeError(
                f"{_OP} 'grouped_mm': on CUDA torch._grouped_mm is only fast for bfloat16 (got {dtype}; other "
                "dtypes take a host-synchronising loop); train in bfloat16 or set moe_implementation: eager"
            )
        # The capability query is host-side Python; under torch.compile it was already checked eagerly
        # at resolution time, so the traced graph skips it.
        if not torch.compiler.is_compiling() and not grouped_mm_available(device):
            raise RuntimeError(
                f"{_OP} 'grouped_mm': {torch.cuda.get_device_name(device)} is not compute capability 9.x/10.x, where "
                "torch._grouped_mm falls back to a host-synchronising loop; set moe_implementation: eager "
                "(or a backend built for this GPU)"
            )
    elif device.type != "cpu":
        raise RuntimeError(f"{_OP} 'grouped_mm': not available on {device.type}; set moe_implementation: eager")
    elif dtype == torch.float64:
        raise TypeError(f"{_OP} 'grouped_mm': torch._grouped_mm has no float64; use moe_implementation: eager")
    h = hidden_states.shape[1]
    i = gate_up_proj.shape[1] // 2
    align = 16 // hidden_states.element_size()
    if h % align or i % align:
        raise ValueError(
            f"{_OP} 'grouped_mm': torch._grouped_mm needs rows of a multiple of 16 bytes: hidden size {h} and "
            f"expert intermediate size {i} must be multiples of {align} in {dtype}; use moe_implementation: eager"
        )


def moe_experts_grouped_mm(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """Sort routes by expert, two grouped GEMMs, weighted combine; no loop, no host sync.

    Routes to ``-1`` or ``E`` (the expert-parallel sentinels) contribute nothing; any other
    index outside ``[0, E)`` is refused by :func:`check_expert_index` (a ``ValueError`` on the
    CPU or with ``VEOMNI_OPS_CHECK_VALUES=1``, a device-side assertion on CUDA). Output in
    ``hidden_states.dtype``.
    """
    check_moe_inputs(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
    _check_grouped(hidden_states, gate_up_proj)
    t, h = hidden_states.shape
    k = top_k_index.shape[1]
    num_experts = gate_up_proj.shape[0]
    dtype = hidden_states.dtype
    check_expert_index(top_k_index, num_experts)

    tk = t * k
    if num_experts == 0:
        # no expert: every route is a sentinel; zeros that autograd connects to the hidden states
        return torch.where(torch.zeros((), dtype=torch.bool, device=hidden_states.device), hidden_states, 0.0)

    flat_index = top_k_index.reshape(-1).long()
    in_range = routed(flat_index, num_experts)
    # Routes to no expert (the sentinels) sort after every real expert.
    key = torch.where(in_range, flat_index, torch.full_like(flat_index, num_experts))
    sorted_key, order = torch.sort(key, stable=True)
    # offs[e] = end of expert e's rows = number of routes to experts <= e; the last group runs
    # to the end, so it also takes the sentinel routes (see below) and every row of every
    # grouped GEMM, forward and backward, is written: no uninitialised memory to mask.
    experts = torch.arange(num_experts, device=flat_index.device, dtype=sorted_key.dtype)
    offs = torch.searchsorted(sorted_key, experts, right=True, out_int32=True)
    offs[-1] = tk

    # A sentinel route gathers the zero row appended to the hidden states (index T): its
    # gate/up rows are 0, silu(0) * 0 = 0, so it adds exactly zero to the output and to every
    # gradient (its weight is zeroed too). Its cost is that of a real route: an expert-parallel
    # dispatcher that hands over mostly sentinels should drop them first.
    token = torch.where(sorted_key < num_experts, order // k, torch.full_like(order, t))
    x = F.pad(hidden_states, (0, 0, 0, 1))[token]  # [T*K, H], grouped by expert
    gate_up = torch._grouped_mm(x, gate_up_proj.contiguous().transpose(1, 2), offs=offs)  # [T*K, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    # The route weight is applied before the down projection ([T*K, I] elements, not [T*K, H]),
    # so combining a token's K routes is a plain sum.
    weights = torch.where(in_range.view(t, k), top_k_weights, torch.zeros_like(top_k_weights)).to(dtype)
    act = F.silu(gate) * up * weights.reshape(-1)[order].unsqueeze(1)
    y = torch._grouped_mm(act, down_proj.contiguous().transpose(1, 2), offs=offs)  # [T*K, H]
    # Back to token-major route order (order is a permutation, so this is a plain scatter),
    # then out_t = sum_k y_tk: accumulated in float32, one rounding, deterministic (no atomics).
    y = torch.empty_like(y).index_copy(0, order, y).view(t, k, h)
    return y.sum(dim=1)
