"""Resolution: ``(config, device) -> KernelPlan``. Strict, and it explains.

For each op: is the requested name registered, did its plugin load, does the device meet
the spec's hardware requirement, are its required distributions installed, does it have the
variant the model needs? Only then is its factory imported. Every refusal of one config is
collected and raised together as one :class:`ResolutionError`.

Names. A config names a kernel bare (``liger``) or qualified by the distribution that
registers it (``liger@veomni-liger``). A bare name that two installed distributions register
for the op is *contested*: it is refused, naming both, and the refusal lists the qualified
names to write. ``auto`` ranks every usable kernel by :data:`AUTO_ORDER`, and a plan entry's
reason says when a tie was broken and by which rule.

VeOmni's values. A VeOmni value whose kernel depends on the device (``moe_implementation:
fused``; VeOmni's GPU defaults on an Ascend NPU) is resolved as the kernel it is on the device
planned for (:meth:`~veomni_ops.config.OpsConfig.for_device`), and the plan entry says so. A
VeOmni kernel veomni-ops does not provide (``magi_attention``, ...) is refused, where no installed
plugin provides the name, with what it is in VeOmni, what it needs and what to write instead
(:mod:`veomni_ops.veomni`).

Hints. A refusal says how to get what was asked: ``pip install "veomni-ops[liger]"`` for our
backends (``pip install -e plugins/veomni-liger`` where the core runs from a source checkout
that has the plugin), what the NPU kernels really need (torch-npu on the Ascend CANN toolkit),
or, for a kernel whose plugin ``VEOMNI_OPS_PLUGINS`` / ``VEOMNI_OPS_DISABLE`` switched off,
that switch and its value. A kernel whose module failed to import in this process is not
offered as usable; under ``VEOMNI_OPS_STRICT=1`` such a failure raises
:class:`~veomni_ops.discovery.PluginLoadError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import importlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Union

from .config import AUTO, OP_TO_FIELD, OpsConfig, config_error, read_any
from .device import DeviceInfo, check_hardware, current_device, detected_device, is_local
from .discovery import ENV_ALLOW, ENV_DENY, ENV_STRICT, PluginLoadError, discover, strict_mode
from .lock import LockArg, PlanLock, active_lock
from .plan import KernelPlan, PlanEntry
from .registry import (
    EXTRA_NOTES,
    FIRST_PARTY_DISTRIBUTIONS,
    ORIGINS,
    PluginRecord,
    RegisteredKernel,
    Registry,
    extra_of,
    first_party_extra,
    origin_rank,
)
from .spec import OPS, KernelSpec, canonical_distribution, split_name
from .veomni import device_value, not_provided, off_device_fix

#: What a model needs per op: a list of requirements, each a variant or a tuple of
#: acceptable variants in order of preference (e.g. ``("fused_linear", "logits")``).
Needs = Mapping[str, Sequence[Union[str, tuple[str, ...]]]]

#: How ``auto`` ranks the usable kernels of an op; the first one wins. The plan entry's reason
#: says when the winner tied with another usable kernel at its priority, and which rule split them.
AUTO_ORDER = (
    "highest priority; then the variant the model prefers; then origin: the core (veomni-ops), then our "
    f"first-party backends ({', '.join(FIRST_PARTY_DISTRIBUTIONS)}), then every other "
    "distribution; then kernel name; then distribution name"
)


class RefusalKind(enum.Enum):
    """Why a kernel was refused. A refusal's fix-it hint is chosen from its kind."""

    #: No installed plugin registers the name for the op.
    UNKNOWN_NAME = "unknown name"
    #: A bare name that two installed distributions register for the op.
    CONTESTED_NAME = "contested name"
    #: The name provides other variants of the op than the model needs.
    WRONG_VARIANT = "wrong variant"
    #: The name is qualified by a distribution that does not register it (others do).
    WRONG_DISTRIBUTION = "wrong distribution"
    #: The plugin that provides it was switched off (``VEOMNI_OPS_PLUGINS`` / ``VEOMNI_OPS_DISABLE``).
    SWITCHED_OFF = "switched off"
    #: The plugin that may provide it failed to load.
    PLUGIN_FAILED = "plugin failed"
    #: Its hardware requirement: another device type, or compute capability.
    DEVICE = "device"
    #: A distribution it requires is missing or of another version.
    REQUIREMENT = "requirement"
    #: It does not accept the dtype.
    DTYPE = "dtype"
    #: It has no backward, and training needs one.
    NO_BACKWARD = "no backward"
    #: It does not honour an optional feature the model needs (``spec.FEATURES``).
    FEATURE = "feature"
    #: It does not run under torch.compile, and this is compile mode.
    COMPILE = "compile"
    #: It does not run under a parallel layout the job needs (``spec.PARALLEL``).
    PARALLEL = "parallel"
    #: Its factory failed to import in this process.
    IMPORT = "import"
    #: ``auto``: no registered kernel is usable.
    NOTHING_USABLE = "nothing usable"


@dataclass(frozen=True)
class Problem:
    """Why one kernel cannot be used here: its kind, and the phrase that says it."""

    kind: RefusalKind
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Refusal:
    """One op the config asked for that cannot be had: what was asked, why not (``kind`` and
    ``why``), what is usable instead, and how to get what was asked (``how``)."""

    kind: RefusalKind
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
#: Kernels whose factory failed in this process, and how (cleared when a later try succeeds).
_import_failures: dict[tuple[Any, ...], BaseException] = {}


def _load_key(rk: RegisteredKernel) -> tuple[Any, ...]:
    return (rk.provenance, rk.spec.key, rk.spec.factory_repr())


def load_kernel(rk: RegisteredKernel) -> Callable[..., Any]:
    """Import a spec's factory and return the kernel callable (cached per process). A failure
    is remembered (:func:`import_failure`) and raised."""
    key = _load_key(rk)
    fn = _loaded.get(key)
    if fn is None:
        try:
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
        except Exception as e:
            _import_failures[key] = e
            raise
        _import_failures.pop(key, None)
        _loaded[key] = fn
    return fn


def import_failure(rk: RegisteredKernel) -> BaseException | None:
    """The exception the kernel's factory raised in this process, if its last try failed."""
    return _import_failures.get(_load_key(rk))


def _import_why(e: BaseException) -> str:
    return f"its kernel failed to import ({type(e).__name__}: {e})"


def _strict_import_error(rk: RegisteredKernel, e: BaseException, name: str) -> PluginLoadError:
    s = rk.spec
    err = PluginLoadError(
        f"kernel {name!r} for {s.op}/{s.variant} ({rk.provenance}) failed to import its factory "
        f"{s.factory_repr()}: {type(e).__name__}: {e}\n({ENV_STRICT}=1 makes a kernel that fails to import fatal, "
        f"as it does every plugin load failure; fix or reinstall {rk.provenance.distribution}, or disable it with "
        f"{ENV_DENY}={rk.provenance.entry_point})"
    )
    err.__cause__ = e
    return err


def kernel_problem(rk: RegisteredKernel, device: DeviceInfo | str | None = None, *, dtype: str | None = None,
                   training: bool = True, features: Iterable[str] = (), compile: bool = False,
                   probe: bool | None = None, registry: Registry | None = None,
                   check_requires: bool | None = None) -> str | None:
    """Why ``rk`` cannot be used here, ``None`` if it can: :func:`static_problem`, and then
    whether its kernel imports. ``probe`` (default: the device is this machine's) imports the
    factory to find out; otherwise only a failure already seen in this process counts. Under
    ``VEOMNI_OPS_STRICT=1`` an import failure raises :class:`PluginLoadError`. This is what
    ``veomni-ops plugins`` reports as "usable here". ``check_requires`` (default: the device is
    this machine's, as in :func:`resolve`): see :func:`static_problem`."""
    dev = current_device(device)
    here = is_local(dev)
    check_requires = here if check_requires is None else check_requires
    why = static_problem(rk.spec, dev, dtype, training, features, compile, check_requires=check_requires)
    if why:
        return why
    if probe is None:
        probe = here
    if probe:
        try:
            load_kernel(rk)
        except Exception as e:
            if strict_mode():
                name = registry.name_of(rk) if registry is not None else rk.spec.name
                raise _strict_import_error(rk, e, name) from e
            return _import_why(e)
        return None
    failed = import_failure(rk)
    return _import_why(failed) if failed is not None else None


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


def unmet_requirements(requires: Iterable[str]) -> tuple[str, ...]:
    """The requirements of ``requires`` (PEP 508) this machine's installed distributions do not satisfy."""
    return tuple(r for r in requires if requirement_problem(r) is not None)


def static_problem(spec: KernelSpec, device: DeviceInfo, dtype: str | None = None, training: bool = True,
                   features: Iterable[str] = (), compile: bool = False, parallel: Iterable[str] = (),
                   check_requires: bool = True) -> str | None:
    """Why ``spec`` cannot run here, checking metadata only (no import); ``None`` if it can.

    ``features``: what the model's places need the kernel to honour (see ``spec.FEATURES``);
    ``compile``: the model will run under ``torch.compile``; ``parallel``: what the job's
    parallel layout needs the kernel to run under (see ``spec.PARALLEL``: ``sp``, ``ep``);
    ``check_requires=False``: skip the ``requires`` check, for planning for another machine,
    whose installed packages this one cannot see. :func:`spec_problem` says it with its kind.
    """
    p = spec_problem(spec, device, dtype, training, features, compile, parallel, check_requires)
    return p.text if p is not None else None


def spec_problem(spec: KernelSpec, device: DeviceInfo, dtype: str | None = None, training: bool = True,
                 features: Iterable[str] = (), compile: bool = False, parallel: Iterable[str] = (),
                 check_requires: bool = True) -> Problem | None:
    """:func:`static_problem` with its :class:`RefusalKind`: the first check ``spec`` fails."""
    why = check_hardware(spec.hardware, device)
    if why:
        return Problem(RefusalKind.DEVICE, why)
    for r in spec.requires if check_requires else ():
        why = requirement_problem(r)
        if why:
            return Problem(RefusalKind.REQUIREMENT, why)
    if dtype is not None and dtype not in spec.dtypes:
        return Problem(RefusalKind.DTYPE, f"does not support dtype {dtype} (supports {', '.join(spec.dtypes)})")
    if training and not spec.supports_backward:
        return Problem(RefusalKind.NO_BACKWARD, "has no backward, and training needs one")
    missing = sorted(set(features) - set(spec.features))
    if missing:
        return Problem(RefusalKind.FEATURE,
                       f"does not honour {', '.join(missing)}, which the model needs here "
                       f"(its spec declares: {', '.join(spec.features) or 'no optional features'})")
    if compile and not spec.supports_compile:
        return Problem(RefusalKind.COMPILE, "does not run under torch.compile (its spec says supports_compile=False), "
                                            "and this is compile mode")
    missing = sorted(set(parallel) - set(spec.parallel))
    if missing:
        return Problem(RefusalKind.PARALLEL,
                       f"cannot run under parallel {', '.join(missing)}, which the job's parallel layout needs "
                       f"(its spec declares: parallel={list(spec.parallel)})")
    return None


def _checkout_root() -> Path | None:
    """The root of the source checkout this core runs from (``core/src/veomni_ops`` inside
    it, as an editable install has it), or None for an installed wheel."""
    pkg = Path(__file__).resolve().parent
    root = pkg.parents[2] if len(pkg.parents) > 2 else None
    if root is None or pkg.parent.name != "src" or not (pkg.parents[1] / "pyproject.toml").is_file():
        return None
    return root


def checkout_plugin_dir(distribution: str) -> str | None:
    """Where the plugin ``distribution`` lies in the source checkout the core runs from
    (``plugins/veomni-liger``: relative to the working directory when it is inside it), or None."""
    root = _checkout_root()
    if root is None:
        return None
    d = root / "plugins" / canonical_distribution(distribution)
    if not (d / "pyproject.toml").is_file():
        return None
    try:
        rel = os.path.relpath(d)
    except ValueError:  # another drive (Windows)
        return str(d)
    return str(d) if rel.startswith("..") else rel


def _first_party(kernel: str, distribution: str | None) -> tuple[str | None, str | None]:
    """(core extra, distribution) for a hint: the distribution given (its extra where the core
    has one), else the first-party plugin the bare kernel name belongs to, else (None, None)."""
    if distribution is not None:
        dist = canonical_distribution(distribution)
        return extra_of(dist), dist
    ours = first_party_extra(kernel)
    return ours if ours is not None else (None, None)


def install_hint(name: str, spec: KernelSpec | None = None, distribution: str | None = None) -> str:
    """How to get kernel ``name`` (bare or qualified): the hint its spec declares where it has
    one (its plugin is installed, a requirement is not), else the plugin to install: for our
    own backends the core's extra (read from the core's metadata), from a source checkout the
    editable install of the plugin beside the core."""
    kernel, qualifier = split_name(name)
    extra, dist = _first_party(kernel, distribution or qualifier)
    local = checkout_plugin_dir(dist) if dist in FIRST_PARTY_DISTRIBUTIONS else None
    if spec is not None and spec.install_hint:
        text = spec.install_hint
        index = f'pip install "veomni-ops[{extra}]"' if extra else None
        if local and index and index in text:
            text = text.replace(index, f"pip install -e {local} (from this source checkout; from the index: {index})", 1)
        elif local:
            text += f" (from this source checkout: pip install -e {local})"
        return f"To get it: {text}."
    if extra:
        if local:
            text = (f"pip install -e {local} (this veomni-ops runs from a source checkout; from the index: "
                    f'pip install "veomni-ops[{extra}]")')
        else:
            text = f'pip install "veomni-ops[{extra}]"'
        if extra in EXTRA_NOTES:
            text += f"; {EXTRA_NOTES[extra]}"
        return f"To get it: {text}."
    if dist:
        return (f"To get it: pip install {dist} (the distribution the name is qualified with), or choose a kernel "
                "listed above.")
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
            have = [v for v in variants if reg.providers(op, v, name)]
            needs[op] = [(v,) for v in have] or [(variants[0],)]
    return needs


def _checked_ops(what: str, ops: Iterable[str]) -> None:
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(f"unknown op(s) in {what}: {unknown}; known: {', '.join(OPS)}")


def _checked_variants(op: str, req: str | tuple[str, ...]) -> tuple[str, ...]:
    alts = _alternatives(req)
    for v in alts:
        if v not in OPS[op]:
            raise ValueError(f"op {op} has no variant {v!r}; its variants: {', '.join(OPS[op])}")
    return alts


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
    parallel: Mapping[str, Iterable[str]] | None = None,
    check_requires: bool | None = None,
    lock: LockArg = None,
) -> KernelPlan:
    """Resolve ``config`` for ``device`` into a :class:`KernelPlan`.

    ``needs`` restricts resolution to what a model needs (see :data:`Needs`); without it
    every op and variant is resolved. ``dtype`` (e.g. ``"bfloat16"``) and ``training``
    (kernel must have a backward) filter kernels, and so do ``features`` (per op, what the
    model's places need honoured, e.g. ``{"attention": {"softcap"}}``) and ``compile``
    (the model will run under ``torch.compile``: only ``supports_compile`` kernels), and so does ``parallel`` (per
    op, what the job's parallel layout needs, e.g. ``{"attention": {"sp"}}``).

    Planning for another device than this machine's (``device="cuda:9.0"`` on a laptop) is what
    ``veomni-ops resolve --device`` does, by the same code: no kernel is imported (``load``
    defaults to whether the device is this machine's), and each kernel's ``requires`` is not
    checked (``check_requires`` defaults the same way), since this machine's packages say nothing
    about the target's; the requirements this machine does not meet are listed in the plan's
    ``not_checked`` (and under its table). ``check_requires=True`` / ``load=True`` force either.
    Raises :class:`ResolutionError` listing every refusal. A mapping or YAML file with problems
    of its own (unknown fields, bad values, keys given twice) raises one
    :class:`~veomni_ops.config.ConfigError` listing those and the refusals of resolving its other fields.

    ``lock``: a plan lock (:mod:`.lock`; a path, a :class:`~veomni_ops.lock.PlanLock`, ``None``: the
    ``VEOMNI_OPS_LOCK`` variable if set, ``False``: none). Where it matches this device, these versions
    and this mode, its measured choice outranks the static priorities and the compile preferences
    for every op on ``auto``; a lock passed explicitly that does not match raises
    :class:`~veomni_ops.lock.LockMismatchError`, one found through the variable is ignored with a warning.
    """
    cfg, config_problems, source = read_any(config)
    dev = current_device(device)
    locked = active_lock(lock, dev, compile=compile, dtype=dtype)
    reg = registry if registry is not None else discover()
    local = is_local(dev)
    load = local if load is None else load
    check_requires = local if check_requires is None else check_requires
    if needs is not None:
        _checked_ops("needs", needs)
    here = cfg.for_device(dev)  # VeOmni's device-dependent values, as the kernels they are on dev
    need_map: Mapping[str, Iterable[str | tuple[str, ...]]] = _all_needs(reg, here) if needs is None else needs
    feats = {op: frozenset(f) for op, f in (features or {}).items()}
    _checked_ops("features", feats)
    entries: list[PlanEntry] = []
    refusals: list[Refusal] = []
    for op in OPS:
        for want in need_map.get(op, ()):
            req = OpRequest(op, _checked_variants(op, want), here.for_op(op), dev, dtype=dtype, training=training,
                            load=load, compile=compile,
                            features=feats.get(op, frozenset()), parallel=frozenset((parallel or {}).get(op, ())),
                            check_requires=check_requires)
            if req.name != AUTO:
                got = _resolve_named(reg, req)
            elif locked is not None:
                got = _resolve_by_lock(reg, req, locked)
            else:
                got = _resolve_auto(reg, req)
            got = _as_veomni_means(got, op, cfg.for_op(op), dev)
            if isinstance(got, Refusal):
                refusals.append(got)
            elif all((e.op, e.variant) != (got.op, got.variant) for e in entries):
                entries.append(got)
    if config_problems:
        raise config_error(config_problems, source, refusals, dev)
    if refusals:
        raise ResolutionError(refusals, dev)
    unchecked = () if check_requires else tuple(
        (e.op, e.variant, unmet) for e in entries if (unmet := unmet_requirements(e.spec.requires)))
    return KernelPlan(dev, cfg, tuple(entries), compile=compile, planned_from=None if local else str(detected_device()),
                      not_checked=unchecked, lock=locked.describe() if locked is not None else None)


def _as_veomni_means(got: PlanEntry | Refusal, op: str, written: str, dev: DeviceInfo) -> PlanEntry | Refusal:
    """What VeOmni's value ``written`` means on ``dev``, said in the plan entry (the kernel it
    stood for there) or in the refusal (what VeOmni's kernel is, and what to write instead)."""
    _, note = device_value(op, written, dev.type)
    if isinstance(got, PlanEntry):
        return dataclasses.replace(got, requested=written, reason=f"requested as {written!r}, {note}") if note else got
    if note:
        fix = off_device_fix(op, written, OP_TO_FIELD[op], dev.type)
        got = dataclasses.replace(got, requested=written, why=f"{got.why}; {note}", how=fix or got.how)
    veomni = not_provided(op, split_name(got.requested)[0], dev.type)
    if veomni is not None:
        got = dataclasses.replace(got, why=f"{got.why}. {veomni.describe()[:-1]}",
                                  how="" if got.kind is RefusalKind.UNKNOWN_NAME else got.how)
    return got


@dataclass(frozen=True)
class OpRequest:
    """What resolving one op needs: the op, the variants the model accepts (preferred first),
    the name the config writes for it (or ``auto``), and what the kernel must satisfy here
    (device, dtype, a backward, features, compile mode, parallel layout). ``load``: import the
    chosen kernel; ``check_requires``: see :func:`static_problem`."""

    op: str
    variants: tuple[str, ...]
    name: str
    device: DeviceInfo
    dtype: str | None = None
    training: bool = True
    load: bool = True
    compile: bool = False
    features: frozenset[str] = frozenset()
    parallel: frozenset[str] = frozenset()
    check_requires: bool = True

    def problem(self, spec: KernelSpec) -> Problem | None:
        return spec_problem(spec, self.device, self.dtype, self.training, self.features, self.compile, self.parallel,
                            self.check_requires)

    def usable(self, rk: RegisteredKernel) -> bool:
        """Passes the checks, and its kernel did not fail to import in this process."""
        return self.problem(rk.spec) is None and import_failure(rk) is None

    def usable_names(self, reg: Registry) -> tuple[str, ...]:
        """What a config could write here for the preferred variant (a contested name qualified)."""
        return tuple(reg.name_of(k) for k in reg.for_op(self.op, self.variants[0]) if self.usable(k))

    def refuse(self, reg: Registry, kind: RefusalKind, why: str, how: str, cause: BaseException | None = None,
               available: tuple[str, ...] | None = None) -> Refusal:
        """A :class:`Refusal` of this request; ``available`` defaults to :meth:`usable_names`."""
        avail = self.usable_names(reg) if available is None else available
        return Refusal(kind, self.op, self.name, self.variants, why, avail, how, cause)


def _entry(rk: RegisteredKernel, requested: str, reason: str, load: bool) -> PlanEntry:
    return PlanEntry(rk, requested, reason, load_kernel(rk) if load else None)


def _switch_hint(rec: PluginRecord) -> str:
    """How to switch a plugin back on, from the reason discovery recorded for it (which names
    the variable and its value)."""
    p = rec.provenance
    if ENV_DENY in rec.reason:
        return f"To use it, take {p.entry_point} / {p.distribution} out of {ENV_DENY}, or unset it."
    return f"To use it, add {p.distribution} to {ENV_ALLOW}, or unset it."


def _refuse_contested(reg: Registry, req: OpRequest, name: str) -> Refusal:
    provs = reg.distributions_of(req.op, name)
    field = OP_TO_FIELD[req.op]
    why = (f"kernel name {name!r} is registered for {req.op} by {len(provs)} distributions, "
           + " and ".join(str(p) for p in provs)
           + ", so the bare name selects neither (an installed package never takes a name from another silently)")
    how = ("Write the name qualified by its distribution: "
           + " or ".join(f"{field}: {name}@{p.qualifier}" for p in provs)
           + f". Or take one of them out: uninstall it, or {ENV_DENY}=<its distribution> ("
           + " / ".join(p.distribution for p in provs) + ").")
    return req.refuse(reg, RefusalKind.CONTESTED_NAME, why, how)


def _refuse_unknown(reg: Registry, req: OpRequest) -> Refusal:
    """Nothing registered answers to the name for this op and its variants: say why, as
    precisely as the registry can (another variant, another distribution, a plugin switched off
    or failed), else suggest a close name and how to install it."""
    op, name = req.op, req.name
    kernel, dist = split_name(name)
    anywhere = [k.spec.variant for k in reg.for_op(op)
                if k.spec.name == kernel and (dist is None or k.provenance.qualifier == dist)]
    if anywhere:
        why = (f"kernel {name!r} provides variant(s) {', '.join(anywhere)} of {op}, but this needs "
               f"{' or '.join(req.variants)}")
        return req.refuse(reg, RefusalKind.WRONG_VARIANT, why, f"Choose a kernel that provides {req.variants[0]}, "
                                                                "or 'auto'.")
    others = reg.distributions_of(op, kernel) if dist is not None else []
    if others:
        why = (f"distribution {dist!r} registers no kernel {kernel!r} for {op}; "
               + " and ".join(str(p) for p in others) + f" register{'s' if len(others) == 1 else ''} it")
        refs = [kernel] if len(others) == 1 else [f"{kernel}@{p.qualifier}" for p in others]
        return req.refuse(reg, RefusalKind.WRONG_DISTRIBUTION, why,
                          "Write " + " or ".join(f"{OP_TO_FIELD[op]}: {r}" for r in refs) + ".")
    off = reg.switched_off_for(name)
    if off:
        why = (f"no kernel {name!r} is registered for {op}: the plugin that provides it, {off[0].provenance}, is "
               f"not loaded: {off[0].reason}")
        return req.refuse(reg, RefusalKind.SWITCHED_OFF, why, _switch_hint(off[0]))
    failures = reg.failures_for(name)
    if failures:
        why = f"no kernel {name!r} is registered for {op}; its plugin failed to load: " + "; ".join(
            f.describe() for f in failures
        )
        return req.refuse(reg, RefusalKind.PLUGIN_FAILED, why,
                          "Fix or reinstall the failing plugin (see the chained exception).", failures[0].error)
    guess = difflib.get_close_matches(kernel, reg.names(op), n=1)
    why = f"no kernel {name!r} is registered for {op}" + (f" (did you mean {guess[0]!r}?)" if guess else "")
    if reg.failures:
        # Not obviously theirs, but a failed plugin may be the one that provides it.
        why += "; note that these plugins failed to load: " + ", ".join(str(f.provenance) for f in reg.failures)
    switched = [p for p in reg.plugins if p.status == "disabled"]
    if switched:
        why += "; note that these plugins are not loaded: " + ", ".join(
            f"{p.provenance} ({p.reason})" for p in switched
        )
    cause = reg.failures[0].error if len(reg.failures) == 1 else None
    return req.refuse(reg, RefusalKind.UNKNOWN_NAME, why, install_hint(name), cause)


#: The fix-it hint of a named kernel refused for one of these kinds ("{device}": the device).
PICK_ANOTHER: Mapping[RefusalKind, str] = {
    RefusalKind.DEVICE: "Pick a kernel that runs on {device}, or 'auto'.",
    RefusalKind.FEATURE: "Pick a kernel listed above (they honour what the model needs), or 'auto'.",
    RefusalKind.COMPILE: "Pick a kernel listed above (they run under torch.compile), or 'auto', or do not compile.",
    RefusalKind.PARALLEL: "Pick a kernel listed above (they run under the layout), or 'auto', or set that parallel "
                          "degree to 1.",
}


def _hint(problem: Problem, req: OpRequest, rk: RegisteredKernel) -> str:
    """The fix-it hint for a named kernel that is registered but refused, by the kind of refusal."""
    if problem.kind is RefusalKind.REQUIREMENT:
        return install_hint(req.name, rk.spec, rk.provenance.distribution)
    return PICK_ANOTHER.get(problem.kind, "").format(device=req.device)


def _resolve_named(reg: Registry, req: OpRequest) -> PlanEntry | Refusal:
    kernel, dist = split_name(req.name)
    if dist is None and reg.is_contested(req.op, kernel):
        return _refuse_contested(reg, req, kernel)
    provided = [k for v in req.variants for k in reg.providers(req.op, v, req.name)]
    if not provided:
        return _refuse_unknown(reg, req)
    problems: list[tuple[RegisteredKernel, Problem, BaseException | None]] = []
    for rk in provided:
        problem = req.problem(rk.spec)
        if problem is None:
            try:
                return _entry(rk, req.name, "requested by name", req.load)
            except Exception as e:
                if strict_mode():
                    raise _strict_import_error(rk, e, req.name) from e
                problems.append((rk, Problem(RefusalKind.IMPORT, _import_why(e)), e))
                continue
        else:
            problems.append((rk, problem, None))
    rk, problem, cause = problems[0]
    return req.refuse(reg, problem.kind, f"kernel {req.name!r} ({rk.provenance}) {problem}", _hint(problem, req, rk),
                      cause)


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
    """Compile-mode auto: the measured choice of :mod:`.compile_policy`, where it is usable here;
    and the measured choices passed over because they failed to load (said in the plan)."""
    from .compile_policy import capability_text, preferences

    failed: list[str] = []
    for pref in preferences(req.op, req.variants, req.device.type, req.device.capability):
        rk = reg.get(req.op, pref.variant, pref.kernel) if not reg.is_contested(req.op, pref.kernel) else None
        if rk is None or req.problem(rk.spec) is not None:
            continue
        try:
            entry = _entry(rk, AUTO, "", req.load)
        except Exception as e:
            if strict_mode():
                raise _strict_import_error(rk, e, reg.name_of(rk)) from e
            failed.append(f"the measured compile-mode choice {reg.name_of(rk)} ({_import_why(e)})")
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


def _resolve_auto(reg: Registry, req: OpRequest) -> PlanEntry | Refusal:
    passed: list[str] = []
    note = ""
    if req.compile:
        from .compile_policy import not_measured_here

        got, passed = _compile_preference(reg, req)
        if got is not None:
            return got
        note = not_measured_here(req.op, req.device.type, req.device.capability)
    # See AUTO_ORDER: priority, preferred variant, origin (core, first-party, others), name, distribution.
    cands = sorted((k for v in req.variants for k in reg.for_op(req.op, v)),
                   key=_auto_key({v: i for i, v in enumerate(req.variants)}))
    for i, rk in enumerate(cands):
        problem = req.problem(rk.spec)
        if problem is not None:
            passed.append(f"{reg.name_of(rk)} ({problem})")
            continue
        try:
            entry = _entry(rk, AUTO, "", req.load)
        except Exception as e:
            if strict_mode():
                raise _strict_import_error(rk, e, reg.name_of(rk)) from e
            passed.append(f"{reg.name_of(rk)} (import failed: {type(e).__name__})")
            continue
        reason = _auto_reason(reg, req, rk, cands[i + 1:], passed)
        return dataclasses.replace(entry, reason=f"{reason}; {note}" if note else reason)
    return req.refuse(reg, RefusalKind.NOTHING_USABLE,
                      "no registered kernel is usable here" + (": " + "; ".join(passed) if passed else ""),
                      "Install a backend for this op, or check why the candidates were refused.", available=())


def _resolve_by_lock(reg: Registry, req: OpRequest, lock: PlanLock) -> PlanEntry | Refusal:
    """``auto`` under a plan lock in force: the lock's measured choice for this request where it
    is usable here; otherwise the static ``auto`` (:func:`_resolve_auto`), whose reason then says
    why the lock did not decide."""
    choice = lock.choice(req.op, req.variants)
    if choice is None:
        why = f"the plan lock {lock.source} has no choice for {req.op}/{'/'.join(req.variants)}"
    else:
        found = [k for k in reg.for_op(req.op, choice.variant)
                 if k.spec.name == choice.kernel and k.provenance.distribution == choice.distribution]
        problem: str | None = None
        if not found:
            problem = "not registered here"
        else:
            rk = found[0]
            p = req.problem(rk.spec)
            if p is None:
                try:
                    entry = _entry(rk, AUTO, "", req.load)
                except Exception as e:
                    if strict_mode():
                        raise _strict_import_error(rk, e, reg.name_of(rk)) from e
                    problem = _import_why(e)
                else:
                    return dataclasses.replace(entry, reason=f"auto by plan lock {lock.source}: {choice.why}")
            else:
                problem = p.text
        why = f"passed over the plan lock's {choice.qualified_name} ({problem})"
    got = _resolve_auto(reg, req)
    if isinstance(got, PlanEntry):
        return dataclasses.replace(got, reason=f"{got.reason}; {why}")
    return got
