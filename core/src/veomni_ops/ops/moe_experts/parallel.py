"""How a parallel layout wraps the ``moe_experts`` kernel: expert parallelism (ep > 1), a
dispatch/combine over the expert group around whatever kernel the plan chose
(:mod:`veomni_ops.parallel.expert`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...parallel.expert import expert_parallel

if TYPE_CHECKING:
    from ...parallel.runtime import ParallelRuntime


def wrap(fn: Callable[..., Any], runtime: ParallelRuntime, kernel: str) -> tuple[Callable[..., Any], str] | None:
    """The kernel under the runtime's layout and what the plan says of it; ``None``: as it is."""
    ep = runtime.layout.ep
    if ep <= 1:
        return None
    chunks = runtime.layout.ep_chunks
    what = f"expert-parallel ep={ep}" + (f", {chunks} overlapped chunks" if chunks > 1 else "")
    return expert_parallel(fn, runtime.ep_group, ep, kernel, runtime.even_tokens, chunks), what
