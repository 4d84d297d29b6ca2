"""``moe_router``'s input checks (heavy: imports torch). Public for backend authors, who import them from
:mod:`veomni_ops.kernels.checks` (or bound to their backend, :class:`~veomni_ops.kernels.checks.BackendChecks`).
"""

from __future__ import annotations

from functools import partial

import torch

from ...kernels.tensor_checks import TensorCheck, check_float, check_ndim, where

__all__ = ["check_moe_router_inputs"]


def check_moe_router_inputs(
    logits: torch.Tensor, top_k: int, normalize: bool, *, backend: str | None = None,
    float_check: TensorCheck | None = None, max_experts: int | None = None, max_top_k: int | None = None,
) -> tuple[int, int]:
    """Check the ``moe_router`` contract's inputs: ``logits`` ``[T, E]``, ``top_k`` an int in ``[1, E]``,
    ``normalize`` a bool; a kernel's own limits ``max_experts`` / ``max_top_k`` where given.
    Returns ``(T, E)``."""
    op = "moe_router"
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    float_check(logits, "logits", op)
    check_ndim(logits, 2, "logits", op, "[T, E] (the router's linear output, tokens x experts)", backend=backend)
    t, e = logits.shape
    if e < 1:
        raise ValueError(f"{where(op, backend)}: logits {tuple(logits.shape)} has no experts; E must be >= 1")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= e:
        raise ValueError(f"{where(op, backend)}: top_k must be an int in [1, E={e}], got {top_k!r}")
    if not isinstance(normalize, bool):
        raise TypeError(f"{where(op, backend)}: normalize must be a bool (the router's norm_topk_prob), "
                        f"got {type(normalize).__name__}")
    if max_experts is not None and e > max_experts:
        raise ValueError(f"{where(op, backend)}: logits has E={e} experts; this kernel takes at most {max_experts} "
                         "(one row in registers). Use moe_router_implementation: eager")
    if max_top_k is not None and top_k > max_top_k:
        raise ValueError(f"{where(op, backend)}: top_k={top_k}; this kernel takes at most {max_top_k} (one selection "
                         "round per route). Use moe_router_implementation: eager")
    return t, e
