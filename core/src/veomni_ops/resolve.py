"""Resolution: ``(config, device) -> KernelPlan``. Strict, and it explains.

For each op: is the requested name registered, did its plugin load, does the device meet
the spec's hardware requirement, are its required distributions installed, does it have the
variant the model needs? Only then is its factory imported. Every refusal of one config is
collected and raised together as one :class:`ResolutionError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Union

from .config import AUTO, OP_TO_FIELD, OpsConfig
from .device import DeviceInfo, check_hardware, current_device
from .discovery import discover
from .plan import KernelPlan, PlanEntry
from .registry import RegisteredKernel, Registry
from .spec import OPS, KernelSpec

#: What a model needs per op: a list of requirements, each a variant or a tuple of
#: acceptable variants in order of preference (e.g. ``("fused_linear", "logits")``).
Needs = Mapping[str, Sequence[Union[str, tuple[str, ...]]]]

#: Our own backends, and the extra that installs each (for refusal messages).
KNOWN_EXTRAS: Mapping[str, str] = {
    "liger": "liger",
    "triton": "triton",
    "triton_batch_invariant": "triton",
    "quack": "quack",
    "npu": "npu",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "flash_attention_4": "flash",
}


@dataclass(frozen=True)
class Refusal:
    op: str
    requested: str
    variants: tuple[str, ...]
    why: str
    available: tuple[str, ...]
    how: str
    cause: BaseException | None = None

    def describe(self) -> str:
        field = OP_TO_FIELD[self.op]
        avail = ", ".join(self.available) if self.available else "none"
        return (
            f"{field}={self.requested!r} (op {self.op}, variant {'/'.join(self.variants)}): {self.why}. "
            f"Usable here for {self.op}/{self.variants[0]}: {avail}. {self.how}"
        ).rstrip()


class ResolutionError(RuntimeError):
    """One or more ops of a config cannot be had on this device. ``refusals`` lists them all."""

    def __init__(self, refusals: Sequence[Refusal], device: DeviceInfo):
        self.refusals = tuple(refusals)
        self.device = device
        lines = [f"cannot resolve {len(self.refusals)} op(s) for device {device}:"]
        lines += [f"  - {r.describe()}" for r in self.refusals]
        super().__init__("\n".join(lines))
        for r in self.refusals:
            if r.cause is not None:
                self.__cause__ = r.cause
                break


_loaded: dict[tuple[Any, ...], Callable[..., Any]] = {}


def load_kernel(rk: RegisteredKernel) -> Callable[..., Any]:
    """Import a spec's factory and return the kernel callable (cached per process)."""
    key = (rk.provenance, rk.spec.key, rk.spec.factory_repr())
    fn = _loaded.get(key)
    if fn is None:
        f = rk.spec.factory
        if isinstance(f, str):
            mod_name, _, attr = f.partition(":")
            obj: Any = importlib.import_module(mod_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
            fn = obj
        else:
            fn = f()
        if not callable(fn):
            raise TypeError(f"factory {rk.spec.factory_repr()} gave {type(fn).__name__}, not a callable kernel")
        _loaded[key] = fn
    return fn


def requirement_problem(text: str) -> str | None:
    """``None`` if the installed distributions satisfy ``text`` (PEP 508), else why not."""
    from packaging.requirements import Requirement  # ~50 ms to import: only when resolving

    req = Requirement(text)
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return f"requires {text}, which is not installed"
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        return f"requires {text}, installed is {req.name} {have}"
    return None


def static_problem(spec: KernelSpec, device: DeviceInfo, dtype: str | None = None, training: bool = True,
                   features: Iterable[str] = (), compile: bool = False) -> str | None:
    """Why ``spec`` cannot run here, checking metadata only (no import); ``None`` if it can.

    ``features``: what the model's places need the kernel to honour (see ``spec.FEATURES``);
    ``compile``: the model will run under ``torch.compile``.
    """
    why = check_hardware(spec.hardware, device)
    if why:
        return why
    for r in spec.requires:
        why = requirement_problem(r)
        if why:
            return why
    if dtype is not None and dtype not in spec.dtypes:
        return f"does not support dtype {dtype} (supports {', '.join(spec.dtypes)})"
    if training and not spec.supports_backward:
        return "has no backward, and training needs one"
    missing = sorted(set(features) - set(spec.features))
    if missing:
        return (f"does not honour {', '.join(missing)}, which the model needs here "
                f"(its spec declares: {', '.join(spec.features) or 'no optional features'})")
    if compile and not spec.supports_compile:
        return "does not run under torch.compile (its spec says supports_compile=False), and this is compile mode"
    return None


def install_hint(name: str, spec: KernelSpec | None = None) -> str:
    if spec is not None and spec.install_hint:
        return f"To get it: {spec.install_hint}."
    extra = KNOWN_EXTRAS.get(name)
    if extra:
        return f'To get it: pip install "veomni-ops[{extra}]".'
    return (
        "To get it: install the distribution that provides it (it declares an entry point in the group "
        "'veomni_ops.backends'), or choose a kernel listed above."
    )


def _alternatives(req: str | tuple[str, ...]) -> tuple[str, ...]:
    return (req,) if isinstance(req, str) else tuple(req)


def _all_needs(reg: Registry, config: OpsConfig) -> dict[str, list[tuple[str, ...]]]:
    """Without a model: every variant some kernel provides, for every op. For an explicit
    name, only the variants that name provides (a name that provides none is refused)."""
    needs: dict[str, list[tuple[str, ...]]] = {}
    for op, variants in OPS.items():
        name = config.for_op(op)
        if name == AUTO:
            needs[op] = [(v,) for v in variants if reg.for_op(op, v)]
        else:
            have = [v for v in variants if reg.get(op, v, name)]
            needs[op] = [(v,) for v in have] or [(variants[0],)]
    return needs


def resolve(
    config: OpsConfig | Mapping[str, Any] | str | os.PathLike | None = None,
    device: DeviceInfo | str | None = None,
    *,
    needs: Needs | None = None,
    registry: Registry | None = None,
    dtype: str | None = None,
    training: bool = True,
    load: bool | None = None,
    features: Mapping[str, Iterable[str]] | None = None,
    compile: bool = False,
) -> KernelPlan:
    """Resolve ``config`` for ``device`` into a :class:`KernelPlan`.

    ``needs`` restricts resolution to what a model needs (see :data:`Needs`); without it
    every op and variant is resolved. ``dtype`` (e.g. ``"bfloat16"``) and ``training``
    (kernel must have a backward) filter kernels, and so do ``features`` (per op, what the
    model's places need honoured, e.g. ``{"attention": {"softcap"}}``) and ``compile``
    (the model will run under ``torch.compile``: only ``supports_compile`` kernels). ``load=False`` checks everything but
    the import (for resolving for another device); the default loads unless the device is
    one this machine is not (``VEOMNI_OPS_DEVICE=cuda:9.0`` on a CPU box). Raises :class:`ResolutionError` listing
    every refusal.
    """
    cfg = _as_config(config)
    dev = current_device(device)
    if load is None:
        load = is_local(dev)
    reg = registry if registry is not None else discover()
    if needs is None:
        need_map: Mapping[str, Iterable[str | tuple[str, ...]]] = _all_needs(reg, cfg)
    else:
        unknown = [op for op in needs if op not in OPS]
        if unknown:
            raise ValueError(f"unknown op(s) in needs: {unknown}; known: {', '.join(OPS)}")
        need_map = needs
    entries: list[PlanEntry] = []
    refusals: list[Refusal] = []
    feats = {op: frozenset(f) for op, f in (features or {}).items()}
    unknown = [op for op in feats if op not in OPS]
    if unknown:
        raise ValueError(f"unknown op(s) in features: {unknown}; known: {', '.join(OPS)}")
    ctx = _Ctx(dev, dtype, training, load, compile)
    for op in OPS:
        for req in need_map.get(op, ()):
            alts = _alternatives(req)
            for v in alts:
                if v not in OPS[op]:
                    raise ValueError(f"op {op} has no variant {v!r}; its variants: {', '.join(OPS[op])}")
            requested = cfg.for_op(op)
            c = dataclasses.replace(ctx, features=feats.get(op, frozenset()))
            if requested == AUTO:
                got = _resolve_auto(reg, op, alts, c)
            else:
                got = _resolve_named(reg, op, alts, requested, c)
            if isinstance(got, Refusal):
                refusals.append(got)
            elif all((e.op, e.variant) != (got.op, got.variant) for e in entries):
                entries.append(got)
    if refusals:
        raise ResolutionError(refusals, dev)
    return KernelPlan(dev, cfg, tuple(entries), compile=compile)


def is_local(dev: DeviceInfo) -> bool:
    """Is ``dev`` this machine's device (so its kernels can be imported and run here)?"""
    if not dev.overridden:
        return True
    from .device import _detected

    here = _detected()
    return dev.type == here.type and (dev.capability is None or dev.capability == here.capability)


def _as_config(config: Any) -> OpsConfig:
    if config is None:
        return OpsConfig()
    if isinstance(config, OpsConfig):
        return config
    if isinstance(config, Mapping):
        return OpsConfig.from_dict(config)
    if isinstance(config, (str, os.PathLike)):
        return OpsConfig.from_yaml(config)
    raise TypeError(f"config must be an OpsConfig, a mapping or a YAML path, got {type(config).__name__}")


@dataclass(frozen=True)
class _Ctx:
    """What a kernel must satisfy besides its name: device, dtype, backward, features, compile."""

    dev: DeviceInfo
    dtype: str | None
    training: bool
    load: bool
    compile: bool
    features: frozenset[str] = frozenset()

    def problem(self, spec: KernelSpec) -> str | None:
        return static_problem(spec, self.dev, self.dtype, self.training, self.features, self.compile)


def _usable_names(reg: Registry, op: str, variant: str, c: _Ctx) -> tuple[str, ...]:
    return tuple(k.spec.name for k in reg.for_op(op, variant) if c.problem(k.spec) is None)


def _entry(rk: RegisteredKernel, requested: str, reason: str, load: bool) -> PlanEntry:
    fn = load_kernel(rk) if load else None
    s = rk.spec
    return PlanEntry(s.op, s.variant, requested, s.name, rk.provenance.distribution, rk.provenance.version, reason, s, fn)


def _resolve_named(reg, op, alts, name, c: _Ctx) -> PlanEntry | Refusal:
    provided = [reg.get(op, v, name) for v in alts]
    provided = [k for k in provided if k is not None]
    if not provided:
        anywhere = [k.spec.variant for k in reg.for_op(op) if k.spec.name == name]
        if anywhere:
            why = (
                f"kernel {name!r} provides variant(s) {', '.join(anywhere)} of {op}, but this needs "
                f"{' or '.join(alts)}"
            )
            return Refusal(op, name, alts, why, _usable_names(reg, op, alts[0], c),
                           f"Choose a kernel that provides {alts[0]}, or 'auto'.")
        failures = reg.failures_for(name)
        if failures:
            why = f"no kernel {name!r} is registered for {op}; its plugin failed to load: " + "; ".join(
                f.describe() for f in failures
            )
            how = "Fix or reinstall the failing plugin (see the chained exception)."
            cause = failures[0].error
        else:
            known = reg.names(op)
            guess = difflib.get_close_matches(name, known, n=1)
            why = f"no kernel {name!r} is registered for {op}" + (f" (did you mean {guess[0]!r}?)" if guess else "")
            if reg.failures:
                # Not obviously theirs, but a failed plugin may be the one that provides it.
                why += "; note that these plugins failed to load: " + ", ".join(
                    str(f.provenance) for f in reg.failures
                )
            how = install_hint(name)
            cause = reg.failures[0].error if len(reg.failures) == 1 else None
        return Refusal(op, name, alts, why, _usable_names(reg, op, alts[0], c), how, cause)
    problems = []
    for rk in provided:
        why = c.problem(rk.spec)
        if why is None:
            try:
                return _entry(rk, name, "requested by name", c.load)
            except Exception as e:
                problems.append((rk, f"its kernel failed to import ({type(e).__name__}: {e})", e))
                continue
        problems.append((rk, why, None))
    rk, why, cause = problems[0]
    if "requires" in why:
        how = install_hint(name, rk.spec)
    elif "device" in why or "capability" in why:
        how = f"Pick a kernel that runs on {c.dev}, or 'auto'."
    elif "honour" in why:
        how = "Pick a kernel listed above (they honour what the model needs), or 'auto'."
    elif "compile" in why:
        how = "Pick a kernel listed above (they run under torch.compile), or 'auto', or do not compile."
    else:
        how = ""
    return Refusal(op, name, alts, f"kernel {name!r} ({rk.provenance}) {why}",
                   _usable_names(reg, op, alts[0], c), how, cause)


def _resolve_auto(reg, op, alts, c: _Ctx) -> PlanEntry | Refusal:
    cands = [k for i, v in enumerate(alts) for k in reg.for_op(op, v)]
    # Highest priority first; among equals, the preferred variant, then the name.
    order = {v: i for i, v in enumerate(alts)}
    cands.sort(key=lambda k: (-k.spec.priority, order[k.spec.variant], k.spec.name))
    passed: list[str] = []
    for rk in cands:
        why = c.problem(rk.spec)
        if why is None:
            try:
                entry = _entry(rk, AUTO, "", c.load)
            except Exception as e:
                passed.append(f"{rk.spec.name} (import failed: {type(e).__name__})")
                continue
            reason = f"auto: highest priority usable here (priority {rk.spec.priority})"
            if passed:
                reason += "; passed over " + ", ".join(passed)
            return dataclasses.replace(entry, reason=reason)
        passed.append(f"{rk.spec.name} ({why})")
    return Refusal(op, AUTO, alts, "no registered kernel is usable here" + (": " + "; ".join(passed) if passed else ""),
                   (), "Install a backend for this op, or check why the candidates were refused.")
