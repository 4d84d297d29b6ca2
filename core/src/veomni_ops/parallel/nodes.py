"""Several nodes: which ranks share a node, and a layout whose sp/ep groups would cross one refused.

``torchrun --nnodes N --nproc-per-node P`` gives every node ``P`` consecutive global ranks
(``RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``), so a group of consecutive ranks stays on
one node exactly when its size divides ``P``. The layout's groups are consecutive blocks
(:mod:`.layout`: ``sp`` innermost, then ``dp_shard``, then ``dp_replicate``):

* an **sp** group (``sp`` ranks) all-to-alls twice in every attention layer, and an **ep** group
  (``ep`` ranks) twice in every MoE layer: across nodes that traffic leaves NVLink for the
  network, so a layout that puts either across nodes is refused (:func:`check_nodes`);
* an FSDP2 **shard group** (``dp_shard x sp`` ranks) all-gathers every layer's parameters:
  across nodes it still trains, only slower, so it is said (:func:`node_note`), with the fix:
  ``dp_replicate`` (HSDP) so that each node holds its own shard group.

Imports no torch at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .layout import ParallelConfigError, ParallelLayout


@dataclass(frozen=True)
class Nodes:
    """How torchrun spread the job: ``count`` nodes of ``per_node`` processes each."""

    count: int
    per_node: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Nodes:
        """From torchrun's environment: ``LOCAL_WORLD_SIZE`` (processes on this node) and
        ``WORLD_SIZE``; ``GROUP_WORLD_SIZE`` (torchrun's node count), where set, must agree.
        Without torchrun (no ``LOCAL_WORLD_SIZE``): one node of ``WORLD_SIZE`` processes."""
        env = os.environ if env is None else env
        world = _int(env, "WORLD_SIZE", 1)
        per_node = _int(env, "LOCAL_WORLD_SIZE", world)
        if per_node < 1 or world % per_node:
            raise ParallelConfigError(
                f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={per_node}: the nodes run different numbers "
                "of processes, which this job's rank layout cannot place; give every node the same --nproc-per-node")
        count = world // per_node
        groups = env.get("GROUP_WORLD_SIZE")
        if groups and groups.isdigit() and int(groups) != count:
            raise ParallelConfigError(
                f"torchrun says {groups} node(s) (GROUP_WORLD_SIZE) but WORLD_SIZE={world} / LOCAL_WORLD_SIZE="
                f"{per_node} = {count}: the nodes run different numbers of processes; give every node the same "
                "--nproc-per-node")
        return cls(count, per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.per_node


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, "") or default)
    except ValueError:
        raise ParallelConfigError(f"{name}={env.get(name)!r} is not a whole number (set by torchrun)") from None


def _layout_text(layout: ParallelLayout) -> str:
    keys = ("dp_replicate", "dp_shard", "sp", "ep")
    return "{" + ", ".join(f"{k}: {getattr(layout, k)}" for k in keys) + "}"


def _suggestion(layout: ParallelLayout, nodes: Nodes) -> str:
    """A layout of the same world whose sp and ep fit one node and whose shard group is one node."""
    sp = max(d for d in range(1, nodes.per_node + 1) if nodes.per_node % d == 0 and d <= layout.sp)
    ep = max(d for d in range(1, nodes.per_node + 1) if nodes.per_node % d == 0 and d <= layout.ep)
    return (f"parallel: {{dp_replicate: {nodes.count}, dp_shard: {nodes.per_node // sp}, sp: {sp}"
            + (f", ep: {ep}" if ep > 1 else "") + "}")


def check_nodes(layout: ParallelLayout, nodes: Nodes) -> None:
    """Refuse, in one line naming the layout and the fix, a layout whose sp or ep groups would
    span nodes (each group's size must divide the processes per node)."""
    if nodes.count <= 1:
        return
    wide = [f"{name} {size}" for name, size in (("sp", layout.sp), ("ep", layout.ep))
            if size > 1 and nodes.per_node % size]
    if wide:
        raise ParallelConfigError(
            f"parallel: {_layout_text(layout)} puts {' and '.join(wide)} group(s) across nodes (this job runs on "
            f"{nodes.count} nodes of {nodes.per_node} processes, and a group of consecutive ranks stays on one node "
            f"only when its size divides {nodes.per_node}); make sp and ep divide the processes per node, e.g. "
            f"{_suggestion(layout, nodes)}, or run more processes per node (--nproc-per-node)")


def node_note(layout: ParallelLayout, nodes: Nodes) -> str | None:
    """A line for the job's output where FSDP2's shard group spans nodes (it trains, but every
    all-gather crosses the network), with the fix; None where it stays on a node."""
    if nodes.count <= 1 or nodes.per_node % layout.shard_size == 0:
        return None
    return (f"note: parallel {_layout_text(layout)}: each FSDP2 shard group (dp_shard x sp = {layout.shard_size} "
            f"ranks) spans nodes of {nodes.per_node} processes, so every all-gather crosses the network; "
            f"{_suggestion(layout, nodes)} (HSDP) keeps each on one node")


def process_group_store(timeout_s: float) -> dict[str, Any]:
    """``init_process_group``'s rendezvous arguments for this process: ``env://``, except under a
    torchrun agent that hosts the job's store (``TORCHELASTIC_USE_AGENT_STORE``, c10d
    rendezvous): its store outlives a restart (``--max-restarts``), and the keys the dead
    attempt's ranks left in it (gloo's addresses) would be read by the new one's; there the store
    is a client of the agent's under a prefix of its own per attempt (``TORCHELASTIC_RESTART_COUNT``)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() not in ("1", "true"):
        return {"init_method": "env://"}
    from datetime import timedelta

    import torch.distributed as dist

    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                           timeout=timedelta(seconds=timeout_s))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {"store": dist.PrefixStore(f"veomni_ops/attempt_{attempt}", client)}
