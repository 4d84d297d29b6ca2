"""Ranking: which kernel ``auto`` takes, and in which order a kernel's variants are tried.

``auto`` ranks every usable kernel by :data:`AUTO_ORDER`; the plan entry's reason says when a
tie was broken and by which rule. In compile mode the measured choices of
:mod:`~veomni_ops.compile_policy` come first, and a plan lock in force (:mod:`~veomni_ops.lock`)
outranks both. The reference kernel tries its own preferred variant first (:func:`variants_for`).

Under a memory budget (:class:`~veomni_ops.target.MemoryBudget` on the target), ``auto`` and the
compile-mode choices pass over a kernel whose declared extra memory does not fit the free bytes,
saying what it needs; where every usable kernel was passed over so, the leanest is taken. A plan
lock's choice is taken as the lock says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, cast

from ..config import AUTO
from ..lock import PlanLock
from ..plan import PlanEntry
from ..registry import FIRST_PARTY_DISTRIBUTIONS, ORIGINS, REFERENCE, RegisteredKernel, Registry, origin_rank
from ..spec import split_name
from .checks import OpRequest
from .explain import Refusal, RefusalKind
from .load import import_why, try_entry

#: How ``auto`` ranks the usable kernels of an op; the first one wins. The plan entry's reason
#: says when the winner tied with another usable kernel at its priority, and which rule split them.
AUTO_ORDER = (
    "highest priority; then the variant the model prefers; then origin: the core (veomni-ops), then our "
    f"first-party backends ({', '.join(FIRST_PARTY_DISTRIBUTIONS)}), then every other "
    "distribution; then kernel name; then distribution name"
)


#: The variant the reference kernel is tried in first, where the model accepts it among others.
#: ``cross_entropy``: the reference means what transformers does, the logits and then the loss
#: (the logits are returned); other kernels prefer the fused form, which never holds them.
REFERENCE_PREFERS: Mapping[str, str] = {"cross_entropy": "logits"}


def variants_for(op: str, name: str, variants: tuple[str, ...]) -> tuple[str, ...]:
    """The order the kernel the config names (``name``) is tried in ``variants``: the model's,
    but for the reference kernel, which tries its own preferred variant first (:data:`REFERENCE_PREFERS`)."""
    first = REFERENCE_PREFERS.get(op)
    if split_name(name)[0] != REFERENCE or first not in variants:
        return variants
    return (first, *(v for v in variants if v != first))


def _auto_key(order: Mapping[str, int]) -> Callable[[RegisteredKernel], tuple[Any, ...]]:
    def key(k: RegisteredKernel) -> tuple[Any, ...]:
        return (-k.spec.priority, order[k.spec.variant], origin_rank(k.provenance.distribution), k.spec.name,
                k.provenance.qualifier)
    return key


def _tie_rule(a: RegisteredKernel, b: RegisteredKernel) -> str:
    """Which rule of :data:`AUTO_ORDER` put ``a`` before ``b`` (same priority and variant)."""
    ra, rb = origin_rank(a.provenance.distribution), origin_rank(b.provenance.distribution)
    if ra != rb:
        return f"origin: {ORIGINS[ra]} before {ORIGINS[rb]}"
    if a.spec.name != b.spec.name:
        return "kernel name order"
    return "distribution name order"


def _compile_preference(reg: Registry, req: OpRequest) -> tuple[PlanEntry | None, list[str]]:
    """Compile-mode auto: the measured choice of :mod:`~veomni_ops.compile_policy`, where it is usable
    here; and the measured choices passed over because they failed to load (said in the plan)."""
    from ..compile_policy import capability_text, preferences

    failed: list[str] = []
    for pref in preferences(req.op, req.variants, req.device.type, req.device.capability):
        rk = reg.get(req.op, pref.variant, pref.kernel) if not reg.is_contested(req.op, pref.kernel) else None
        if rk is None or req.problem(rk.spec) is not None:
            continue
        too_big = req.memory_problem(rk.spec)
        if too_big is not None:
            failed.append(f"the measured compile-mode choice {reg.name_of(rk)} ({too_big})")
            continue
        entry = try_entry(rk, AUTO, "", req.load, reg.name_of(rk))
        if isinstance(entry, Exception):
            failed.append(f"the measured compile-mode choice {reg.name_of(rk)} ({import_why(entry)})")
            continue
        passed = f"; passed over {', '.join(failed)}" if failed else ""
        return dataclasses.replace(entry, reason=f"auto (compile mode): {pref.kernel} by measurement on "
                                                 f"{capability_text(pref.capability)} (applied there only): "
                                                 f"{pref.why} [{pref.evidence}]{passed}"), failed
    return None, failed


def _auto_reason(reg: Registry, req: OpRequest, rk: RegisteredKernel, behind: list[RegisteredKernel],
                 passed: list[str]) -> str:
    """Why ``auto`` took ``rk``: its priority, a tie it won and by which rule, what it passed over."""
    reason = f"auto: highest priority usable here (priority {rk.spec.priority})"
    tied = [k for k in behind if k.spec.priority == rk.spec.priority and k.spec.variant == rk.spec.variant
            and req.usable(k)]
    if tied:
        reason += (f"; tie at priority {rk.spec.priority} with " + ", ".join(k.qualified_name for k in tied)
                   + f", broken by {_tie_rule(rk, tied[0])}")
    if passed:
        reason += "; passed over " + ", ".join(passed)
    if reg.is_contested(req.op, rk.spec.name):
        reason += f"; its name is contested: select it by name as {rk.qualified_name}"
    return reason


def resolve_auto(reg: Registry, req: OpRequest) -> PlanEntry | Refusal:
    """``auto``: the first usable kernel by :data:`AUTO_ORDER` (in compile mode, a measured
    choice first), or a refusal listing why each candidate was passed over."""
    passed: list[str] = []
    note = ""
    if req.mode.compile:
        from ..compile_policy import not_measured_here

        got, passed = _compile_preference(reg, req)
        if got is not None:
            return got
        note = not_measured_here(req.op, req.device.type, req.device.capability)
    # See AUTO_ORDER: priority, preferred variant, origin (core, first-party, others), name, distribution.
    cands = sorted((k for v in req.variants for k in reg.for_op(req.op, v)),
                   key=_auto_key({v: i for i, v in enumerate(req.variants)}))
    too_big: list[RegisteredKernel] = []
    for i, rk in enumerate(cands):
        problem = req.problem(rk.spec)
        if problem is not None:
            passed.append(f"{reg.name_of(rk)} ({problem})")
            continue
        memory = req.memory_problem(rk.spec)
        if memory is not None:
            passed.append(f"{reg.name_of(rk)} ({memory})")
            too_big.append(rk)
            continue
        entry = try_entry(rk, AUTO, "", req.load, reg.name_of(rk))
        if isinstance(entry, Exception):
            passed.append(f"{reg.name_of(rk)} (import failed: {type(entry).__name__})")
            continue
        reason = _auto_reason(reg, req, rk, cands[i + 1:], passed)
        return dataclasses.replace(entry, reason=f"{reason}; {note}" if note else reason)
    leanest = _leanest(reg, req, too_big)
    if leanest is not None:
        return leanest
    return req.refuse(reg, RefusalKind.NOTHING_USABLE,
                      "no registered kernel is usable here" + (": " + "; ".join(passed) if passed else ""),
                      "Install a backend for this op, or check why the candidates were refused.", available=())


def _leanest(reg: Registry, req: OpRequest, too_big: list[RegisteredKernel]) -> PlanEntry | None:
    """Where every usable kernel was passed over for memory: the one that needs the least (the
    model's own code, which ``auto`` would leave the op to, holds at least as much), said so."""
    for rk in sorted(too_big, key=lambda k: cast(int, req.extra_memory(k.spec))):
        entry = try_entry(rk, AUTO, "", req.load, reg.name_of(rk))
        if isinstance(entry, PlanEntry):
            return dataclasses.replace(entry, reason=f"auto: no usable kernel fits the free device memory; took the "
                                                     f"one that needs least, {reg.name_of(rk)} "
                                                     f"({req.memory_problem(rk.spec)})")
    return None


def _lock_choice(reg: Registry, req: OpRequest, lock: PlanLock) -> PlanEntry | str:
    """The lock's measured choice for ``req`` as a plan entry, or why it cannot be taken here."""
    choice = lock.choice(req.op, req.variants)
    if choice is None:
        return f"the plan lock {lock.source} has no choice for {req.op}/{'/'.join(req.variants)}"
    found = [k for k in reg.for_op(req.op, choice.variant)
             if k.spec.name == choice.kernel and k.provenance.distribution == choice.distribution]
    if not found:
        problem = "not registered here"
    elif (p := req.problem(found[0].spec)) is not None:
        problem = p.text
    else:
        entry = try_entry(found[0], AUTO, f"auto by plan lock {lock.source}: {choice.why}", req.load,
                          reg.name_of(found[0]))
        if isinstance(entry, PlanEntry):
            return entry
        problem = import_why(entry)
    return f"passed over the plan lock's {choice.qualified_name} ({problem})"


def resolve_by_lock(reg: Registry, req: OpRequest, lock: PlanLock) -> PlanEntry | Refusal:
    """``auto`` under a plan lock in force: the lock's measured choice for this request where it
    is usable here; otherwise the static ``auto`` (:func:`resolve_auto`), whose reason then says
    why the lock did not decide."""
    got = _lock_choice(reg, req, lock)
    if isinstance(got, PlanEntry):
        return got
    entry = resolve_auto(reg, req)
    if isinstance(entry, PlanEntry):
        return dataclasses.replace(entry, reason=f"{entry.reason}; {got}")
    return entry
