"""How a parallel layout wraps the ``attention`` kernel: Ulysses sequence parallelism (sp > 1),
all-to-alls around whatever kernel the plan chose (:mod:`veomni_ops.parallel.ulysses`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...parallel.ulysses import ulysses_attention

if TYPE_CHECKING:
    from ...parallel.runtime import ParallelRuntime


def wrap(fn: Callable[..., Any], runtime: ParallelRuntime, kernel: str) -> tuple[Callable[..., Any], str] | None:
    """The kernel under the runtime's layout and what the plan says of it; ``None``: as it is."""
    sp = runtime.layout.sp
    if sp <= 1:
        return None
    return ulysses_attention(fn, runtime.sp_group, sp, kernel), f"Ulysses sp={sp}"
