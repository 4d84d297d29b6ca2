"""The plan for one model: what its places ask of resolution beyond their variants
(:func:`target_needs`), the one resolution (:func:`resolve_for`), the places that plan leaves to
the model's own code (:func:`leave_to_model`), and what a plan given to ``apply`` lacks for them
(:func:`complete_plan`). What an op decides here, its binder says (``Binder.needs``, ``lacks``,
``by_head``: :mod:`.place`); nothing here names an op."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..config import OpsConfig
from ..lock import LockArg
from ..plan import KernelPlan
from ..resolve import ResolutionError, resolve
from ..target import Need, Target
from .binders import BY_OP, Place, binders
from .needs import needs_of

if TYPE_CHECKING:
    from ..registry import Registry


def target_needs(places: list[Place]) -> dict[str, list]:
    """What resolution must provide for ``places`` (:func:`~.needs.needs_of`), with what each op's
    binder asks beside (``Binder.needs``: the reference attention where the model was built with
    eager attention, the causal-LM head's logits path)."""
    needs: dict[str, list] = needs_of(places)
    for op in list(needs):
        hook = BY_OP[op].needs
        if hook is not None:
            needs[op] = hook([p for p in places if p.op == op], needs[op])
    return needs


def resolve_for(owner: str, cfg: OpsConfig, target: Target, registry: Registry | None, lock: LockArg) -> KernelPlan:
    """The plan for ``target``: one resolution; a refusal says what the model's places need."""
    try:
        return resolve(cfg, target, registry=registry, lock=lock)
    except ResolutionError as e:
        refused = {r.op for r in e.refusals}
        feats = describe_features({op: f for op, f in target.features.items() if op in refused})
        if feats:
            e.add_note(f"(while binding {owner}: its places need {feats})")
        raise


def leave_to_model(plan: KernelPlan, places: list[Place], skipped: list[tuple[str, str, str]]
                   ) -> tuple[KernelPlan, list[Place], list[tuple[str, str, str]]]:
    """The places ``plan`` leaves to the model's own code (an op on ``auto`` with no kernel usable
    here), moved to ``skipped`` with why; where that is the causal-LM head's own op, the ops the
    head computes (``Binder.by_head``: the auxiliary loss) too."""
    left = dict(plan.left)
    head = next((b.op for b in binders() if b.head and not b.by_head and b.op in left), None)
    if head is not None:  # the head's other ops are computed by the head
        for b in binders():
            if b.by_head:
                left.setdefault(b.op, left[head])
        plan = dataclasses.replace(plan, entries=tuple(e for e in plan.entries if e.op not in left))
    skipped = [*skipped, *((p.path, p.op, f"auto: {left[p.op]}") for p in places if p.op in left)]
    return plan, [p for p in places if p.op not in left], skipped


def complete_plan(plan: KernelPlan, places: list[Place], target: Target, registry: Registry | None) -> KernelPlan:
    """A plan given to ``apply``, with the kernels it lacks for ``places`` (``Binder.lacks``: a
    logits kernel for the head's logits path where the plan has a fused_linear one only)."""
    have = {p.op for p in places}
    lacking: dict[str, list[Need]] = {}
    for b in binders():
        if b.lacks is not None and b.op in have:
            wanted = b.lacks(plan)
            if wanted:
                lacking[b.op] = wanted
    if not lacking:
        return plan
    extra = Target(target.device, dtype=target.dtype, mode=target.mode, parallel=target.parallel, needs=lacking)
    extra_plan = resolve(plan.config, extra, registry=registry, lock=False)  # the plan was resolved already, lock or not
    return dataclasses.replace(plan, entries=(*plan.entries, *extra_plan.entries),
                               notes=(*plan.notes, *extra_plan.notes))


def describe_features(feats: Mapping[str, frozenset[str]]) -> str:
    return "; ".join(f"{op}: {', '.join(sorted(f))}" for op, f in feats.items())
