"""How a parallel layout wraps the ``load_balancing_loss`` kernel: with more than one rank, the
loss over every rank's tokens (:func:`veomni_ops.parallel.expert.global_load_balancing`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...parallel.expert import global_load_balancing

if TYPE_CHECKING:
    from ...parallel.runtime import ParallelRuntime


def wrap(fn: Callable[..., Any], runtime: ParallelRuntime, kernel: str) -> tuple[Callable[..., Any], str] | None:
    """The kernel under the runtime's layout and what the plan says of it; ``None``: as it is."""
    world = runtime.world_size
    if world <= 1:
        return None
    return global_load_balancing(fn, None, world, runtime.token_mask), f"over the tokens of all {world} ranks"
