"""Where ``cross_entropy`` lives in a model: the causal-LM head (a module holding ``lm_head`` and
``model``), bound as a whole by :mod:`veomni_ops.binding.head`; and what the head asks of the plan
beside its loss kernel, a logits kernel for its logits path (:data:`LOGITS_PATH`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from torch import nn

from ...binding.functions import library_method
from ...binding.head import causal_lm_forward
from ...binding.place import Binder, Edits, Place, Survey, head_parts, head_problem
from ...plan import KernelPlan, PlanEntry
from ...target import Need

#: What the causal-LM head needs beside its loss kernel: a logits kernel for the logits path
#: (evaluation, generation, ``return_dict=False``), the configured kernel's logits variant or,
#: where the kernel the config names has none, the reference's.
LOGITS_PATH = Need(("logits",), fallback="eager", why="where the head returns logits (evaluation, no grad, "
                   "return_dict=False, skip_logits=False) the loss is computed from them by the reference kernel "
                   "(eager)")


def _find_head(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    if not head_parts(m):
        return []
    return [Place("cross_entropy", ("fused_linear", "logits"), path, m, left=head_problem(m))]


def _bind_cross_entropy(place: Place, kernel: Callable, edits: Edits) -> None:
    edits.head.setdefault(id(place.module), {"module": place.module})["ce"] = (place.info["chosen_variant"], kernel)


def _needs(places: list[Place], wanted: list) -> list:
    """The head's loss variants, and its logits path (:data:`LOGITS_PATH`)."""
    return [*wanted, LOGITS_PATH]


def _lacks(plan: KernelPlan) -> list[Need]:
    """A plan with a fused_linear kernel and no logits one lacks the head's logits path."""
    if plan.get("cross_entropy", "fused_linear") is None or plan.get("cross_entropy", "logits") is not None:
        return []
    return [LOGITS_PATH]


def _finish_heads(edits: Edits, plan: KernelPlan, places: list[Place], notes: list[str]) -> None:
    """Each causal-LM head's forward: its loss kernel, the logits path's, the auxiliary loss's."""
    skip_logits = edits.skip_logits
    for head in edits.head.values():
        m = head["module"]
        variant, ce = head["ce"]
        logits_kernel = ce if variant == "logits" else plan.kernel("cross_entropy", "logits")
        at = next(p.path for p in places if p.module is m and p.op == "cross_entropy") or "<model>"
        logits_name = cast(PlanEntry, plan.get("cross_entropy", "logits")).kernel
        if variant == "fused_linear":
            notes.append(f"cross_entropy at {at}: fused_linear {plan.get('cross_entropy', variant).kernel} "  # type: ignore[union-attr]
                         f"(logits=None) when training with labels and autograd on (skip_logits={skip_logits}); "
                         f"otherwise the model's logits, and the loss from them by {logits_name}")
        edits.forwards.append((m, causal_lm_forward(
            library_method(type(m), "forward"), fused=ce if variant == "fused_linear" else None,
            logits=logits_kernel, lbl=head.get("lbl"), skip_logits=skip_logits, owner=type(m).__name__)))


BINDER = Binder("cross_entropy", _find_head, _bind_cross_entropy, head=True, needs=_needs, lacks=_lacks,
                finish=_finish_heads)
