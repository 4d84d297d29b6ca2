"""Expert parallelism around any ``moe_experts`` kernel, and the global load-balancing loss.

An expert group of ``ep`` ranks shares the experts of every MoE layer: rank ``r`` of the group
owns experts ``[r*E/ep, (r+1)*E/ep)`` (:func:`shard_experts` keeps only those in its
``gate_up_proj [E/ep, 2I, H]`` / ``down_proj [E/ep, H, I]``). The router is dense and
replicated, so every rank routes its own tokens over all ``E`` experts. Then, per layer
(:func:`expert_parallel`):

1. **dispatch**: the indices are checked first as the plain kernel checks them (-1 and
   ``E`` route nowhere, any other index outside ``[0, E)`` raises the same ``ValueError``).
   Each receiver gets the tokens with all ``K`` routing weights and their ``K`` expert
   indices rewritten for it: its local expert index where it owns the expert, ``-1`` (the
   contract's "no expert here" sentinel: contributes zero) where it does not. Two exchanges:

   * *even* (the runtime's batches, where every rank of the group holds the same ``T``
     tokens): every token goes to every rank of the group, in equal splits -- no counts, no
     host synchronisation, static shapes; the receiver's kernel skips the ``-1`` routes;
   * *counted* (any other call): a token goes once to every rank that owns at least one of
     its experts. Counts first (one small all-to-all, and one host synchronisation for the
     split sizes), then the hidden states, indices and weights with variable-size
     ``all_to_all_single``;
2. **compute**: the plan's kernel on the received tokens and the local experts -- the very
   kernel contract, nothing EP-specific in the kernel;
3. **combine**: the partial outputs (already weighted) go back by the reverse all-to-all and
   are summed per token.

Backward runs the same path in reverse (:mod:`.comm`): gradients of the hidden states and of
the routing weights return to the ranks that sent them; the local experts' gradients are
summed over every token that reached them. A rank that receives no token (counted) skips its kernel
and still gives its experts a (zero) gradient, so FSDP's reductions stay aligned; experts
with no token work as the kernel contract requires.

Volume per MoE layer and rank (forward): ``N`` rows sent off-rank, each ``H`` hidden values
+ ``K`` indices (int32) + ``K`` weights, and ``N`` rows of ``H`` back; backward the same
hidden and weight traffic again. Counted: ``N`` = the number of (token, owning rank) pairs
with the rank another one, ``N <= T * min(K, ep - 1)``; even: ``N = T * (ep - 1)``, which
for ``ep = 2`` and ``K = 4`` is within 7% of the counted volume (a token misses the other
rank's half of the experts with probability 1/16).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..kernels.checks import NO_EXPERT, check_expert_index
from .comm import all_gather, all_gather_nograd, all_to_all, all_to_all_nograd
from .expert_chunks import pipelined


def shard_experts(module: nn.Module, ep: int, rank: int) -> int:
    """Keep only this rank's ``E / ep`` experts in ``module`` (``gate_up_proj``/``down_proj``); returns E."""
    gu, dn = cast(torch.Tensor, module.gate_up_proj), cast(torch.Tensor, module.down_proj)
    e = gu.shape[0]
    if e % ep:
        raise ValueError(f"parallel.ep {ep} must divide the number of experts, {e} ({type(module).__name__})")
    n = e // ep
    lo = rank * n
    module.gate_up_proj = nn.Parameter(gu.detach()[lo:lo + n].clone(), requires_grad=gu.requires_grad)
    module.down_proj = nn.Parameter(dn.detach()[lo:lo + n].clone(), requires_grad=dn.requires_grad)
    # nn.Module.__setattr__ is typed for tensors and modules; plain attributes are fine at runtime.
    module.veomni_ops_experts = {"num_experts": e, "ep": ep, "first": lo, "local": n}  # type: ignore[assignment]
    return e


def expert_parallel(kernel: Callable[..., torch.Tensor], group: dist.ProcessGroup | None, ep: int, name: str = "",
                    even_tokens: Callable[[], int | None] | None = None, chunks: int = 1) -> Callable[..., torch.Tensor]:
    """The plan's ``moe_experts`` kernel, run over an expert group of ``ep`` ranks.

    ``even_tokens()``: the number of tokens *every* rank of the group holds in this forward, when
    the caller knows it (the runtime does for batches from ``shard_batch``), else None. With it,
    a call whose ``hidden_states`` has that many rows takes the even exchange (no host sync);
    otherwise the counted one (module docstring). ``chunks > 1`` (``parallel.ep_chunks``): the
    same exchange in that many chunks, the all-to-alls overlapping the experts
    (:mod:`.expert_chunks`)."""
    rank = dist.get_rank(group)
    #: what this rank dispatched and received, in (token, rank) rows, over all calls (host ints: free)
    stats = {"calls": 0, "even_calls": 0, "sent_rows": 0, "sent_off_rank": 0, "received_rows": 0}

    @functools.wraps(kernel)
    def ep_experts(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj):
        t = top_k_index.shape[0]
        e_loc = gate_up_proj.shape[0]
        # the plain kernel's rule, with the global E: -1 and E route nowhere, anything else outside [0, E) raises
        check_expert_index(top_k_index, e_loc * ep)
        stats["calls"] += 1
        n = even_tokens() if even_tokens is not None else None
        even = n is not None and 0 < n == t == hidden_states.shape[0]
        if even:
            stats["even_calls"] += 1
            stats["sent_rows"] += ep * t
            stats["sent_off_rank"] += (ep - 1) * t
            stats["received_rows"] += ep * t
        if chunks > 1:
            return pipelined(kernel, group, ep, chunks, even, rank, stats, hidden_states, top_k_index, top_k_weights,
                             gate_up_proj, down_proj)
        if even:
            return _even(kernel, group, ep, hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
        return _counted(kernel, group, ep, rank, stats, hidden_states, top_k_index, top_k_weights, gate_up_proj,
                        down_proj)

    ep_experts.veomni_ops_ep = {"ep": ep, "rank": rank, "name": name, "chunks": chunks,  # type: ignore[attr-defined]
                                "stats": stats}
    return ep_experts


def _local_index(idx: torch.Tensor, first: torch.Tensor, e_loc: int) -> torch.Tensor:
    """``idx`` as the local expert index on ranks whose first expert is ``first`` (broadcast), -1 elsewhere."""
    rel = idx - first
    return torch.where((rel >= 0) & (rel < e_loc), rel, torch.full_like(rel, NO_EXPERT))


def _even(kernel, group, ep, hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj) -> torch.Tensor:
    """Every rank holds ``T`` tokens: each sends all of them to every rank of the group (equal
    splits, no counts, no host synchronisation), with the indices rewritten for the receiver
    (its local expert, or -1); the receiver runs the kernel on the ``ep * T`` rows and returns
    the weighted partial outputs, which are summed per token."""
    t, k = top_k_index.shape
    h = hidden_states.shape[-1]
    e_loc = gate_up_proj.shape[0]
    first = (torch.arange(ep, device=top_k_index.device) * e_loc).view(ep, 1, 1)
    local_idx = _local_index(top_k_index.long()[None], first, e_loc)  # [ep(dest), T, K]
    recv_idx = all_to_all_nograd(group, local_idx.to(torch.int32).reshape(ep * t, k)).long()
    recv_h, recv_w = all_to_all(group, hidden_states.reshape(1, t, h).expand(ep, t, h).reshape(ep * t, h),
                                top_k_weights.reshape(1, t, k).expand(ep, t, k).reshape(ep * t, k))
    y = kernel(recv_h, recv_idx, recv_w, gate_up_proj, down_proj)
    (back,) = all_to_all(group, y)  # [ep(src = the rank that computed it), T, H]
    return back.view(ep, t, h).sum(0).to(hidden_states.dtype)


def _counted(kernel, group, ep, rank, stats, hidden_states, top_k_index, top_k_weights, gate_up_proj,
             down_proj) -> torch.Tensor:
    """Tokens go only to the ranks that own one of their experts: counts first (one small
    all-to-all and one host synchronisation), then variable-size all-to-alls."""
    t, k = top_k_index.shape
    h = hidden_states.shape[-1]
    e_loc = gate_up_proj.shape[0]
    idx = top_k_index.long()
    valid = (idx >= 0) & (idx < e_loc * ep)  # -1 / E coming in route nowhere, as the contract says
    dest = torch.where(valid, idx // e_loc, torch.full_like(idx, -1))  # [T, K] owning rank
    hit = (F.one_hot(dest.clamp(min=0), ep).bool() & valid[..., None]).any(1)  # [T, ep]
    d_sel, t_sel = hit.t().nonzero(as_tuple=True)  # (rank, token) pairs, by rank then token
    send_counts = hit.sum(0)
    recv_counts = all_to_all_nograd(group, send_counts)
    counts = torch.stack([send_counts, recv_counts]).tolist()  # the one host synchronisation
    in_splits, out_splits = counts[0], counts[1]
    stats["sent_rows"] += sum(in_splits)
    stats["sent_off_rank"] += sum(in_splits) - in_splits[rank]
    stats["received_rows"] += sum(out_splits)
    local_idx = _local_index(idx[t_sel], (d_sel * e_loc)[:, None], e_loc)
    recv_idx = all_to_all_nograd(group, local_idx.to(torch.int32), in_splits, out_splits).long()
    recv_h, recv_w = all_to_all(group, hidden_states[t_sel], top_k_weights[t_sel],
                                in_splits=in_splits, out_splits=out_splits)
    if sum(out_splits):
        y = kernel(recv_h, recv_idx, recv_w, gate_up_proj, down_proj)
    else:  # nothing to compute here; the experts still get a (zero) gradient on every rank
        zero = (gate_up_proj.sum() + down_proj.sum() + recv_w.sum()).to(recv_h.dtype) * 0
        y = recv_h + zero
    (back,) = all_to_all(group, y, in_splits=out_splits, out_splits=in_splits)
    out = hidden_states.new_zeros((t, h))
    return out.index_add(0, t_sel, back.to(out.dtype))


def global_load_balancing(kernel: Callable[..., torch.Tensor], group: dist.ProcessGroup | None, world: int,
                          token_mask: Callable[[], torch.Tensor | None]) -> Callable[..., torch.Tensor]:
    """The plan's ``load_balancing_loss`` kernel over the tokens of *every* rank.

    The loss is a product of two token means (``f_e * P_e``), not a sum over tokens, so one
    rank's share cannot be computed from its tokens alone: the router logits of all ranks are
    all-gathered (one collective for all layers, differentiable) and the kernel sees the global
    batch, as in one process. Every rank then holds the same loss; each returns ``1/world`` of
    it, so that the ranks' losses sum to the single-process loss and the gradients (summed by
    FSDP and by the gather's backward) are those of one process. ``token_mask()`` gives the
    tokens that count on this rank (padding added for sequence parallelism is left out), or None.
    """

    @functools.wraps(kernel)
    def lbl(gate_logits: Sequence[torch.Tensor], num_experts: int, top_k: int, attention_mask: Any = None):
        layers = list(gate_logits)
        if not layers:
            return kernel(gate_logits, num_experts, top_k, attention_mask)
        stacked = torch.stack([g.reshape(-1, g.shape[-1]) for g in layers])  # [L, T, E]
        got = all_gather(group, stacked)  # [world, L, T, E]
        w, n_layers, tokens, e = got.shape
        per_layer = tuple(got[:, i].reshape(w * tokens, e) for i in range(n_layers))
        mask = token_mask()
        if attention_mask is not None:
            am = attention_mask.bool()
            mask = am if mask is None else (mask & am.reshape(mask.shape))
        full_mask = None
        if mask is not None:
            full_mask = all_gather_nograd(group, mask.to(torch.int32)).reshape(w * mask.shape[0], *mask.shape[1:])
        return kernel(per_layer, num_experts, top_k, full_mask) / world

    return lbl
