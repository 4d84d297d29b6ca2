"""Expert parallelism in chunks (``parallel.ep_chunks: N > 1``): the token all-to-alls overlap
the expert compute.

The local tokens split into ``N`` chunks (``torch.tensor_split``: sizes differ by at most one; a
chunk may be empty). Each chunk takes the exchange :mod:`.expert` would give the whole call (even:
every token to every rank of the group; counted: a token to every rank owning one of its experts,
with one counts all-to-all and one host synchronisation for all chunks together). Then, in one
``autograd.Function``:

* **forward**: every chunk's dispatch (indices, hidden states, weights) is issued at once with
  ``async_op=True`` (the inputs are all known); chunk ``i``'s experts compute as soon as its
  dispatch is done, while chunks ``i+1..`` are still in flight; chunk ``i``'s combine is issued
  asynchronously as soon as its output exists, while chunk ``i+1`` computes; the combined
  outputs are summed per token at the end;
* **backward**: the same pipeline in reverse: every chunk's output gradient goes back to the
  rank that computed it at once (async), chunk ``i``'s expert backward runs while the later
  ones travel, and its input gradients return (async) while chunk ``i+1``'s backward runs.

The expert kernel is differentiated by autograd as usual: its forward runs with grad enabled on
the received chunk (detached leaves), and the backward calls ``torch.autograd.grad`` on that
graph. Every rank runs every chunk's collectives, in the same order, whatever it holds (empty
chunks included), and a rank that computes nothing still returns (zero) expert gradients, so
FSDP's reductions stay aligned. The kernel's graph keeps its tensors itself: under activation
checkpointing (``train.gradient_checkpointing``) the experts' activations of a chunked call are
kept, not recomputed (the rest of the layer is). Under ``torch.compile`` the whole exchange runs eagerly
(``torch.compiler.disable``): its async work handles cannot be traced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..kernels.checks import NO_EXPERT


@dataclass
class _Chunk:
    rows: torch.Tensor  # [N] local token rows sent, ordered by destination rank
    local_idx: torch.Tensor  # [N, K] int32: the receiver's local expert index, or -1
    send: list[int] | None  # rows to each rank (None: equal splits)
    recv: list[int] | None  # rows from each rank (None: equal splits)


def _local_index(idx: torch.Tensor, first: torch.Tensor, e_loc: int) -> torch.Tensor:
    rel = idx - first
    return torch.where((rel >= 0) & (rel < e_loc), rel, torch.full_like(rel, NO_EXPERT))


def plan_even(top_k_index: torch.Tensor, ep: int, e_loc: int, chunks: int) -> list[_Chunk]:
    """Every rank holds the same ``T`` tokens: chunk ``c`` sends all its tokens to every rank."""
    idx = top_k_index.long()
    out = []
    for rows in torch.tensor_split(torch.arange(idx.shape[0], device=idx.device), chunks):
        first = (torch.arange(ep, device=idx.device) * e_loc).view(ep, 1, 1)
        local = _local_index(idx[rows][None], first, e_loc)  # [ep(dest), n, K]
        out.append(_Chunk(rows.repeat(ep), local.to(torch.int32).reshape(ep * rows.numel(), idx.shape[1]), None, None))
    return out


def plan_counted(top_k_index: torch.Tensor, ep: int, e_loc: int, chunks: int, group) -> list[_Chunk]:
    """A token goes to every rank owning one of its experts; one counts exchange for all chunks."""
    idx = top_k_index.long()
    valid = (idx >= 0) & (idx < e_loc * ep)
    dest = torch.where(valid, idx // e_loc, torch.full_like(idx, -1))
    hit = (F.one_hot(dest.clamp(min=0), ep).bool() & valid[..., None]).any(1)  # [T, ep]
    parts = torch.tensor_split(torch.arange(idx.shape[0], device=idx.device), chunks)
    send_counts = torch.stack([hit[rows].sum(0) for rows in parts])  # [chunks, ep]
    by_dest = send_counts.t().contiguous()  # [ep(dest), chunks]: row j goes to rank j
    got = torch.empty_like(by_dest)
    dist.all_to_all_single(got, by_dest, group=group)  # [ep(src), chunks]
    counts = torch.stack([send_counts, got.t()]).tolist()  # the one host synchronisation
    out = []
    for c, rows in enumerate(parts):
        d_sel, t_sel = hit[rows].t().nonzero(as_tuple=True)
        t_rows = rows[t_sel]
        local = _local_index(idx[t_rows], (d_sel * e_loc)[:, None], e_loc)
        out.append(_Chunk(t_rows, local.to(torch.int32), counts[0][c], counts[1][c]))
    return out


def _start(x: torch.Tensor, send: Sequence[int] | None, recv: Sequence[int] | None, group) -> tuple[torch.Tensor, Any]:
    """Issue ``all_to_all_single`` of ``x`` (rows ``send[j]`` to rank ``j``) without waiting."""
    x = x.contiguous()
    rows = x.shape[0] if recv is None else sum(recv)
    out = x.new_empty((rows, *x.shape[1:]))
    work = dist.all_to_all_single(out, x, output_split_sizes=None if recv is None else list(recv),
                                  input_split_sizes=None if send is None else list(send), group=group, async_op=True)
    return out, (work, x)  # keep the input alive until the collective is done


def _wait(pending: tuple[torch.Tensor, Any]) -> torch.Tensor:
    out, (work, _) = pending
    work.wait()
    return out


def _keep(x: torch.Tensor) -> torch.Tensor:
    return x


class _Pipelined(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernel, group, plan, hidden, weights, gu, dn):  # type: ignore[override]
        t, h = hidden.shape
        sent = [(_start(c.local_idx, c.send, c.recv, group), _start(hidden[c.rows], c.send, c.recv, group),
                 _start(weights[c.rows], c.send, c.recv, group)) for c in plan]
        gu_, dn_ = gu.detach().requires_grad_(gu.requires_grad), dn.detach().requires_grad_(dn.requires_grad)
        graphs, back = [], []
        for c, (p_idx, p_h, p_w) in zip(plan, sent):
            r_idx, r_h, r_w = _wait(p_idx).long(), _wait(p_h), _wait(p_w)
            if r_h.shape[0]:
                r_h.requires_grad_(hidden.requires_grad)
                r_w.requires_grad_(weights.requires_grad)
                # the kernel's graph lives on the ctx; its tensors are kept as they are, not by an outer
                # saved-tensor hook (activation checkpointing's would recompute this very forward to fill them)
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
                    y = kernel(r_h, r_idx, r_w, gu_, dn_)
                graphs.append((y, r_h, r_w) if y.requires_grad else None)  # no route here: y is constant
            else:  # nothing reached this rank in this chunk: no kernel call
                y = r_h.new_zeros(r_h.shape)
                graphs.append(None)
            back.append(_start(y.detach(), c.recv, c.send, group))  # the combine, while the next chunk computes
        out = hidden.new_zeros((t, h))
        for c, pending in zip(plan, back):
            out.index_add_(0, c.rows, _wait(pending).to(out.dtype))
        ctx.kernel_graphs, ctx.plan, ctx.group = graphs, plan, group
        ctx.params = (gu_, dn_)
        ctx.shapes = (hidden.shape, hidden.dtype, weights.shape, weights.dtype)
        return out

    @staticmethod
    def backward(ctx, g_out):  # type: ignore[override]
        plan, group, graphs = ctx.plan, ctx.group, ctx.kernel_graphs
        gu_, dn_ = ctx.params
        h_shape, h_dtype, w_shape, w_dtype = ctx.shapes
        need_h, need_w, need_gu, need_dn = ctx.needs_input_grad[3:7]
        g_out = g_out.contiguous()
        # every chunk's output gradient back to the rank that computed it (the reverse combine), at once
        g_ys = [_start(g_out[c.rows], c.send, c.recv, group) for c in plan]
        g_gu = torch.zeros_like(gu_) if need_gu else None
        g_dn = torch.zeros_like(dn_) if need_dn else None
        returned = []
        for g_pending, graph in zip(g_ys, graphs):
            g_y = _wait(g_pending)
            n = g_y.shape[0]
            g_rh = g_y.new_zeros((n, h_shape[-1]))
            g_rw = torch.zeros((n, w_shape[-1]), dtype=w_dtype, device=g_y.device)
            if graph is not None:
                y, r_h, r_w = graph
                wrt = [x for x, need in ((r_h, need_h), (r_w, need_w), (gu_, need_gu), (dn_, need_dn)) if need]
                if wrt:
                    grads = list(torch.autograd.grad(y, wrt, g_y.to(y.dtype), allow_unused=True))
                    if need_h:
                        gh = grads.pop(0)
                        g_rh = gh if gh is not None else g_rh
                    if need_w:
                        gw = grads.pop(0)
                        g_rw = gw if gw is not None else g_rw
                    for acc, need in ((g_gu, need_gu), (g_dn, need_dn)):
                        if need:
                            g = grads.pop(0)
                            if g is not None and acc is not None:
                                acc += g
            # the input gradients back to the ranks that sent the tokens, while the next chunk runs
            c = plan[len(returned)]
            returned.append((_start(g_rh, c.recv, c.send, group) if need_h else None,
                             _start(g_rw, c.recv, c.send, group) if need_w else None))
        g_h = torch.zeros(h_shape, dtype=h_dtype, device=g_out.device) if need_h else None
        g_w = torch.zeros(w_shape, dtype=w_dtype, device=g_out.device) if need_w else None
        for c, (p_h, p_w) in zip(plan, returned):
            if p_h is not None and g_h is not None:
                g_h.index_add_(0, c.rows, _wait(p_h).to(h_dtype))
            if p_w is not None and g_w is not None:
                g_w.index_add_(0, c.rows, _wait(p_w).to(w_dtype))
        ctx.kernel_graphs = None
        return None, None, None, g_h, g_w, g_gu, g_dn


@torch.compiler.disable
def pipelined(kernel: Callable[..., torch.Tensor], group, ep: int, chunks: int, even: bool, rank: int,
              stats: dict[str, int], hidden_states: torch.Tensor, top_k_index: torch.Tensor,
              top_k_weights: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> torch.Tensor:
    """The expert-parallel experts of one call, in ``chunks`` pipelined chunks (module docstring)."""
    e_loc = gate_up_proj.shape[0]
    if even:
        plan = plan_even(top_k_index, ep, e_loc, chunks)
    else:
        plan = plan_counted(top_k_index, ep, e_loc, chunks, group)
        sent = [sum(c.send or ()) for c in plan]
        stats["sent_rows"] += sum(sent)
        stats["sent_off_rank"] += sum(sent) - sum((c.send or [0] * ep)[rank] for c in plan)
        stats["received_rows"] += sum(sum(c.recv or ()) for c in plan)
    out = _Pipelined.apply(kernel, group, plan, hidden_states, top_k_weights, gate_up_proj, down_proj)
    return out.to(hidden_states.dtype)
