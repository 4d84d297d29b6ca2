"""The entry: ``resolve(config, target) -> KernelPlan``, one op at a time.

Per op and need: a name the config writes is taken as it is or refused (:func:`resolve_named`);
``auto`` is ranked (:mod:`.rank`), under a plan lock where one is in force. A VeOmni value is
said as the kernel it is on the target's device (:func:`~.explain.as_veomni_means`). Every
refusal of one config is raised together.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any, Union

from ..config import AUTO, OpsConfig, config_error, read_any
from ..device import DeviceInfo, detected_device, is_local
from ..discovery import discover
from ..lock import LockArg, PlanLock, active_lock
from ..plan import KernelPlan, PlanEntry
from ..registry import RegisteredKernel, Registry
from ..spec import OPS, split_name
from ..target import Mode, Need, Needs, Target
from .checks import OpRequest, unmet_requirements
from .explain import (
    Problem,
    Refusal,
    RefusalKind,
    ResolutionError,
    as_veomni_means,
    named_hint,
    refuse_contested,
    refuse_unknown,
)
from .load import import_why, try_entry
from .rank import resolve_auto, resolve_by_lock, variants_for

#: What resolving one op and need gives: its plan entry, or why it cannot be had.
Outcome = Union[PlanEntry, Refusal]


def all_needs(reg: Registry, config: OpsConfig) -> dict[str, list[tuple[str, ...]]]:
    """Without a model: every variant some kernel provides, for every op. For an explicit
    name, only the variants that name provides (a name that provides none is refused)."""
    needs: dict[str, list[tuple[str, ...]]] = {}
    for op, variants in OPS.items():
        name = config.for_op(op)
        if name == AUTO:
            needs[op] = [(v,) for v in variants if reg.for_op(op, v)]
        else:
            have = [v for v in variants if reg.providers(op, v, name)]
            needs[op] = [(v,) for v in have] or [(variants[0],)]
    return needs


def resolve_named(reg: Registry, req: OpRequest) -> Outcome:
    """The kernel the config names, in the first of the request's variants it provides and can
    serve here; else a refusal saying why (the first problem found) and how to fix it."""
    kernel, dist = split_name(req.name)
    if dist is None and reg.is_contested(req.op, kernel):
        return refuse_contested(reg, req, kernel)
    provided = [k for v in req.variants for k in reg.providers(req.op, v, req.name)]
    if not provided:
        return refuse_unknown(reg, req)
    problems: list[tuple[RegisteredKernel, Problem, BaseException | None]] = []
    for rk in provided:
        problem = req.problem(rk.spec)
        if problem is not None:
            problems.append((rk, problem, None))
            continue
        entry = try_entry(rk, req.name, "requested by name", req.load, req.name)
        if isinstance(entry, PlanEntry):
            return entry
        problems.append((rk, Problem(RefusalKind.IMPORT, import_why(entry)), entry))
    rk, problem, cause = problems[0]
    return req.refuse(reg, problem.kind, f"kernel {req.name!r} ({rk.provenance}) {problem}",
                      named_hint(problem, req, rk), cause)


def _preferred(reg: Registry, req: OpRequest, got: Outcome) -> Outcome:
    """``auto``'s choice ``got``, or the kernel the need prefers where auto chose another (its
    reason then the need's); a preferred kernel that cannot serve here is refused."""
    prefer = req.need.prefer
    if prefer is None or not isinstance(got, PlanEntry) or got.kernel == prefer:
        return got
    alt = resolve_named(reg, req.named(prefer))
    return dataclasses.replace(alt, requested=AUTO, reason=req.need.why) if isinstance(alt, PlanEntry) else alt


def _fallback(reg: Registry, req: OpRequest, refused: Refusal) -> tuple[Outcome, str | None]:
    """The need's fallback kernel where the named one was ``refused``, and the note that says
    so; the refusal as it was where the fallback cannot serve either."""
    fallback = req.need.fallback
    if fallback is None or req.name == AUTO:
        return refused, None
    alt = resolve_named(reg, req.named(fallback))
    if not isinstance(alt, PlanEntry):
        return refused, None
    kernel, variants = split_name(req.name)[0], "/".join(req.variants)
    lacks = (f"has no {variants} variant" if refused.kind is RefusalKind.WRONG_VARIANT
             else f"cannot serve {variants} here ({refused.why})")
    return alt, f"{req.op}: {kernel} {lacks}; {req.need.why}"


def _resolve_op(reg: Registry, req: OpRequest, written: str, lock: PlanLock | None) -> tuple[Outcome, str | None]:
    """One op and need: the plan entry or the refusal, and a note where a fallback was taken.
    ``written``: what the config says for the op (a VeOmni value is said as what it is here)."""
    if req.name != AUTO:
        ordered = dataclasses.replace(req.need, variants=variants_for(req.op, req.name, req.variants))
        got = resolve_named(reg, dataclasses.replace(req, need=ordered))
    else:
        got = _preferred(reg, req, resolve_auto(reg, req) if lock is None else resolve_by_lock(reg, req, lock))
    got = as_veomni_means(got, req.op, written, req.device)
    if isinstance(got, Refusal):
        return _fallback(reg, req, got)
    return got, None


def _left_to_model(refusals: list[Refusal]) -> dict[str, str]:
    """Per op on ``auto`` with no usable kernel here, why (the model's own code then runs it)."""
    return {r.op: r.why for r in refusals if r.requested == AUTO and r.kind is RefusalKind.NOTHING_USABLE}


#: The arguments of ``resolve`` that describe its target, and their defaults.
_TARGET_PARTS: Mapping[str, Any] = {"needs": None, "dtype": None, "training": True, "compile": False,
                                    "features": None, "parallel": None}


def _target_of(device: DeviceInfo | str | Target | None, given: Mapping[str, Any]) -> Target:
    """The target of ``resolve``'s arguments: ``device`` where it is one (then the keyword
    arguments that describe a target must be left out), else one made of them."""
    if isinstance(device, Target):
        passed = [k for k, v in given.items() if v is not _TARGET_PARTS[k] and v != _TARGET_PARTS[k]]
        if passed:
            raise TypeError(f"resolve(config, target) takes {', '.join(passed)} from the Target; pass "
                            f"Target(..., {passed[0]}=...) instead of resolve(..., {passed[0]}=...)")
        return device
    return Target(device, dtype=given["dtype"], mode=Mode.of(training=given["training"], compile=given["compile"]),
                  needs=given["needs"], features=given["features"], parallel=given["parallel"])


def resolve(
    config: OpsConfig | Mapping[str, Any] | str | os.PathLike | None = None,
    device: DeviceInfo | str | Target | None = None,
    *,
    needs: Needs | None = None,
    registry: Registry | None = None,
    dtype: str | None = None,
    training: bool = True,
    load: bool | None = None,
    features: Mapping[str, Iterable[str]] | None = None,
    compile: bool = False,
    parallel: Mapping[str, Iterable[str]] | None = None,
    check_requires: bool | None = None,
    lock: LockArg = None,
) -> KernelPlan:
    """Resolve ``config`` for a :class:`~veomni_ops.target.Target` into a :class:`KernelPlan`:
    ``resolve(config, Target("cuda:9.0", dtype="bfloat16", mode=Mode.COMPILE, needs=...))``.

    The target may be given as its parts instead: ``device`` and the keyword arguments
    ``needs``, ``dtype``, ``training``, ``compile`` (the :class:`~veomni_ops.target.Mode`),
    ``features`` and ``parallel``, each as :class:`~veomni_ops.target.Target` describes it; with
    a ``Target``, those are left out. ``needs`` restricts resolution to what a model needs; without
    it every op and variant is resolved. ``dtype`` and the mode (training: a backward; compile:
    only ``supports_compile`` kernels) filter kernels, and so do ``features`` and ``parallel``.

    Planning for another device than this machine's (``device="cuda:9.0"`` on a laptop) is what
    ``veomni-ops resolve --device`` does, by the same code: no kernel is imported (``load``
    defaults to whether the device is this machine's), and each kernel's ``requires`` is not
    checked (``check_requires`` defaults the same way), since this machine's packages say nothing
    about the target's; the requirements this machine does not meet are listed in the plan's
    ``not_checked`` (and under its table). ``check_requires=True`` / ``load=True`` force either.
    Raises :class:`ResolutionError` listing every refusal. A mapping or YAML file with problems
    of its own (unknown fields, bad values, keys given twice) raises one
    :class:`~veomni_ops.config.ConfigError` listing those and the refusals of resolving its other fields.

    ``lock``: a plan lock (:mod:`~veomni_ops.lock`; a path, a :class:`~veomni_ops.lock.PlanLock`,
    ``None``: the ``VEOMNI_OPS_LOCK`` variable if set, ``False``: none). Where it matches this
    device, these versions and this mode, its measured choice outranks the static priorities and
    the compile preferences for every op on ``auto``; a lock passed explicitly that does not match
    raises :class:`~veomni_ops.lock.LockMismatchError`, one found through the variable is ignored
    with a warning.
    """
    cfg, config_problems, source = read_any(config)
    target = _target_of(device, dict(needs=needs, dtype=dtype, training=training, compile=compile, features=features,
                                     parallel=parallel))
    dev = target.device
    locked = active_lock(lock, dev, compile=target.mode.compile, dtype=target.dtype)
    reg = registry if registry is not None else discover()
    local = is_local(dev)
    load = local if load is None else load
    check_requires = local if check_requires is None else check_requires
    here = cfg.for_device(dev)  # VeOmni's device-dependent values, as the kernels they are on dev
    need_map = target.needs if target.needs is not None else {
        op: tuple(Need(v) for v in want) for op, want in all_needs(reg, here).items()}
    entries: list[PlanEntry] = []
    refusals: list[Refusal] = []
    notes: list[str] = []
    for op in OPS:
        for need in need_map.get(op, ()):
            req = OpRequest(op, need, here.for_op(op), target, load=load, check_requires=check_requires)
            got, note = _resolve_op(reg, req, cfg.for_op(op), locked)
            notes += [note] if note else []
            if isinstance(got, Refusal):
                refusals.append(got)
            elif all((e.op, e.variant) != (got.op, got.variant) for e in entries):
                entries.append(got)
    left = _left_to_model(refusals) if target.leaves_to_model else {}
    refusals = [r for r in refusals if r.op not in left]
    if config_problems:
        raise config_error(config_problems, source, refusals, dev.describe())
    if refusals:
        raise ResolutionError(refusals, dev)
    entries = [e for e in entries if e.op not in left]
    unchecked = () if check_requires else tuple(
        (e.op, e.variant, unmet) for e in entries if (unmet := unmet_requirements(e.spec.requires)))
    return KernelPlan(dev, cfg, tuple(entries), mode=target.mode,
                      lock=locked.describe() if locked is not None else None,
                      planned_from=None if local else str(detected_device()), not_checked=unchecked,
                      left=tuple(left.items()), notes=tuple(notes))
