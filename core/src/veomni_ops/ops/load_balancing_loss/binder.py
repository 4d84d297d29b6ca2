"""Where ``load_balancing_loss`` lives in a model: the causal-LM head of an MoE model, whose forward
calls transformers' ``load_balancing_loss_func`` (computed by the bound head)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ...binding.functions import code_names, function_globals, library_method
from ...binding.place import Binder, Edits, Place, Survey, head_parts, head_problem


def _find_aux_loss(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    """The MoE aux loss, computed by the head (so only where the head is bound)."""
    if not head_parts(m):
        return []
    try:
        fwd = library_method(type(m), "forward")
        names, globs = code_names(fwd), function_globals(fwd)
    except AttributeError:
        return []
    if "load_balancing_loss_func" in names and "load_balancing_loss_func" in globs:
        why = head_problem(m)
        return [Place("load_balancing_loss", "standard", path, m,
                      left=f"computed by the causal-LM head, which is left: {why}" if why else None)]
    return []


def _bind_load_balancing(place: Place, kernel: Callable, edits: Edits) -> None:
    edits.head.setdefault(id(place.module), {"module": place.module})["lbl"] = kernel


BINDER = Binder("load_balancing_loss", _find_aux_loss, _bind_load_balancing, head=True, by_head=True)
