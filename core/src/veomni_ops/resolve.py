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
import importlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Union

from .config import AUTO, OP_TO_FIELD, OpsConfig, as_config
from .device import DeviceInfo, check_hardware, current_device, is_local
from .discovery import ENV_ALLOW, ENV_DENY, ENV_STRICT, PluginLoadError, discover, strict_mode
from .plan import KernelPlan, PlanEntry
from .registry import FIRST_PARTY_DISTRIBUTIONS, ORIGINS, RegisteredKernel, Registry, origin_rank
from .spec import OPS, KernelSpec, canonical_distribution, split_name

#: What a model needs per op: a list of requirements, each a variant or a tuple of
#: acceptable variants in order of preference (e.g. ``("fused_linear", "logits")``).
Needs = Mapping[str, Sequence[Union[str, tuple[str, ...]]]]

#: Our own backends' kernel names, and the extra of the core that installs each, i.e. the
#: plugin distribution ``veomni-<extra>`` (for refusal messages).
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

#: What a plugin distribution alone does not bring: said with every install hint for it.
VENDOR_NOTES: Mapping[str, str] = {
    "veomni-npu": (
        "the npu kernels are torch-npu's (Ascend's PyTorch adapter), which runs only on top of the Ascend CANN "
        "toolkit: install CANN and source its environment (source /usr/local/Ascend/ascend-toolkit/set_env.sh), "
        "then the torch-npu build that matches your torch (pip install torch-npu==<your torch version>, or pip "
        "install \"veomni-npu[torch-npu]\")"
    ),
}

#: How ``auto`` ranks the usable kernels of an op; the first one wins. The plan entry's reason
#: says when the winner tied with another usable kernel at its priority, and which rule split them.
AUTO_ORDER = (
    "highest priority; then the variant the model prefers; then origin: the core (veomni-ops), then our "
    "first-party backends (veomni-liger, veomni-triton, veomni-quack, veomni-npu, veomni-flash), then every other "
    "distribution; then kernel name; then distribution name"
)


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
                   check_requires: bool = True) -> str | None:
    """Why ``rk`` cannot be used here, ``None`` if it can: :func:`static_problem`, and then
    whether its kernel imports. ``probe`` (default: the device is this machine's) imports the
    factory to find out; otherwise only a failure already seen in this process counts. Under
    ``VEOMNI_OPS_STRICT=1`` an import failure raises :class:`PluginLoadError`. This is what
    ``veomni-ops plugins`` reports as "usable here". ``check_requires``: see :func:`static_problem`."""
    dev = current_device(device)
    why = static_problem(rk.spec, dev, dtype, training, features, compile, check_requires=check_requires)
    if why:
        return why
    if probe is None:
        probe = is_local(dev)
    if probe:
        try:
            load_kernel(rk)
        except Exception as e:
            if strict_mode():
                name = registry.name_of(rk) if registry is not None else rk.spec.name
                raise _strict_import_error(rk, e, name) from e
            return _import_why(e)
        return None
    e = import_failure(rk)
    return _import_why(e) if e is not None else None


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
                   features: Iterable[str] = (), compile: bool = False, parallel: Iterable[str] = (),
                   check_requires: bool = True) -> str | None:
    """Why ``spec`` cannot run here, checking metadata only (no import); ``None`` if it can.

    ``features``: what the model's places need the kernel to honour (see ``spec.FEATURES``);
    ``compile``: the model will run under ``torch.compile``; ``parallel``: what the job's
    parallel layout needs the kernel to run under (see ``spec.PARALLEL``: ``sp``, ``ep``);
    ``check_requires=False``: skip the ``requires`` check, for planning for another machine,
    whose installed packages this one cannot see.
    """
    why = check_hardware(spec.hardware, device)
    if why:
        return why
    for r in spec.requires if check_requires else ():
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
    missing = sorted(set(parallel) - set(spec.parallel))
    if missing:
        return (f"cannot run under parallel {', '.join(missing)}, which the job's parallel layout needs "
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


def _ours(name: str) -> tuple[str | None, str | None]:
    """(core extra, distribution) of one of our backends' kernel names, else (None, None)."""
    extra = KNOWN_EXTRAS.get(name)
    return (extra, f"veomni-{extra}") if extra else (None, None)


def install_hint(name: str, spec: KernelSpec | None = None, distribution: str | None = None) -> str:
    """How to get kernel ``name`` (bare or qualified): the spec's own hint where it has one
    (its plugin is installed, a requirement is not), else the plugin to install. For our own
    backends, from a source checkout, the editable install of the plugin beside the core."""
    kernel, qualifier = split_name(name)
    extra, dist = _ours(kernel)
    if distribution is not None or qualifier is not None:
        dist = canonical_distribution(distribution or qualifier or "")
        extra = dist.removeprefix("veomni-") if dist in FIRST_PARTY_DISTRIBUTIONS else None
    local = checkout_plugin_dir(dist) if dist in FIRST_PARTY_DISTRIBUTIONS else None
    note = VENDOR_NOTES.get(dist or "")
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
        if note:
            text += f"; {note}"
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
    check_requires: bool = True,
) -> KernelPlan:
    """Resolve ``config`` for ``device`` into a :class:`KernelPlan`.

    ``needs`` restricts resolution to what a model needs (see :data:`Needs`); without it
    every op and variant is resolved. ``dtype`` (e.g. ``"bfloat16"``) and ``training``
    (kernel must have a backward) filter kernels, and so do ``features`` (per op, what the
    model's places need honoured, e.g. ``{"attention": {"softcap"}}``) and ``compile``
    (the model will run under ``torch.compile``: only ``supports_compile`` kernels), and so does ``parallel`` (per
    op, what the job's parallel layout needs, e.g. ``{"attention": {"sp"}}``). ``check_requires=False``
    skips the check of each kernel's ``requires`` (planning for another machine). ``load=False`` checks everything but
    the import (for resolving for another device); the default loads unless the device is
    one this machine is not (``VEOMNI_OPS_DEVICE=cuda:9.0`` on a CPU box). Raises :class:`ResolutionError` listing
    every refusal.
    """
    cfg = as_config(config)
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
    ctx = _Ctx(dev, dtype, training, load, compile, check_requires=check_requires)
    for op in OPS:
        for req in need_map.get(op, ()):
            alts = _alternatives(req)
            for v in alts:
                if v not in OPS[op]:
                    raise ValueError(f"op {op} has no variant {v!r}; its variants: {', '.join(OPS[op])}")
            requested = cfg.for_op(op)
            c = dataclasses.replace(ctx, features=feats.get(op, frozenset()),
                                    parallel=frozenset((parallel or {}).get(op, ())))
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


@dataclass(frozen=True)
class _Ctx:
    """What a kernel must satisfy besides its name: device, dtype, backward, features, compile."""

    dev: DeviceInfo
    dtype: str | None
    training: bool
    load: bool
    compile: bool
    features: frozenset[str] = frozenset()
    parallel: frozenset[str] = frozenset()
    check_requires: bool = True

    def problem(self, spec: KernelSpec) -> str | None:
        return static_problem(spec, self.dev, self.dtype, self.training, self.features, self.compile, self.parallel,
                              self.check_requires)

    def usable(self, rk: RegisteredKernel) -> bool:
        """Passes the checks, and its kernel did not fail to import in this process."""
        return self.problem(rk.spec) is None and import_failure(rk) is None


def _usable_names(reg: Registry, op: str, variant: str, c: _Ctx) -> tuple[str, ...]:
    """What a config could write here for ``op``/``variant`` (a contested name qualified)."""
    return tuple(reg.name_of(k) for k in reg.for_op(op, variant) if c.usable(k))


def _entry(rk: RegisteredKernel, requested: str, reason: str, load: bool) -> PlanEntry:
    fn = load_kernel(rk) if load else None
    s = rk.spec
    return PlanEntry(s.op, s.variant, requested, s.name, rk.provenance.distribution, rk.provenance.version, reason, s, fn)


def _switch_hint(rec) -> str:
    """How to switch a plugin back on, from the reason discovery recorded for it (which names
    the variable and its value)."""
    p = rec.provenance
    if ENV_DENY in rec.reason:
        return f"To use it, take {p.entry_point} / {p.distribution} out of {ENV_DENY}, or unset it."
    return f"To use it, add {p.distribution} to {ENV_ALLOW}, or unset it."


def _refuse_contested(reg: Registry, op: str, alts, name: str, c: _Ctx) -> Refusal:
    provs = reg.distributions_of(op, name)
    field = OP_TO_FIELD[op]
    why = (f"kernel name {name!r} is registered for {op} by {len(provs)} distributions, "
           + " and ".join(str(p) for p in provs)
           + ", so the bare name selects neither (an installed package never takes a name from another silently)")
    how = ("Write the name qualified by its distribution: "
           + " or ".join(f"{field}: {name}@{p.qualifier}" for p in provs)
           + f". Or take one of them out: uninstall it, or {ENV_DENY}=<its distribution> ("
           + " / ".join(p.distribution for p in provs) + ").")
    return Refusal(op, name, alts, why, _usable_names(reg, op, alts[0], c), how)


def _resolve_named(reg, op, alts, name, c: _Ctx) -> PlanEntry | Refusal:
    kernel, dist = split_name(name)
    if dist is None and reg.is_contested(op, kernel):
        return _refuse_contested(reg, op, alts, kernel, c)
    provided = [k for v in alts for k in reg.providers(op, v, name)]
    if not provided:
        anywhere = [k.spec.variant for k in reg.for_op(op)
                    if k.spec.name == kernel and (dist is None or k.provenance.qualifier == dist)]
        if anywhere:
            why = (
                f"kernel {name!r} provides variant(s) {', '.join(anywhere)} of {op}, but this needs "
                f"{' or '.join(alts)}"
            )
            return Refusal(op, name, alts, why, _usable_names(reg, op, alts[0], c),
                           f"Choose a kernel that provides {alts[0]}, or 'auto'.")
        usable = _usable_names(reg, op, alts[0], c)
        others = reg.distributions_of(op, kernel) if dist is not None else []
        off = reg.switched_off_for(name)
        failures = reg.failures_for(name)
        if others:
            why = (f"distribution {dist!r} registers no kernel {kernel!r} for {op}; "
                   + " and ".join(str(p) for p in others) + f" register{'s' if len(others) == 1 else ''} it")
            field = OP_TO_FIELD[op]
            refs = [kernel] if len(others) == 1 else [f"{kernel}@{p.qualifier}" for p in others]
            how = "Write " + " or ".join(f"{field}: {r}" for r in refs) + "."
            return Refusal(op, name, alts, why, usable, how)
        if off:
            rec = off[0]
            why = (f"no kernel {name!r} is registered for {op}: the plugin that provides it, {rec.provenance}, is "
                   f"not loaded: {rec.reason}")
            return Refusal(op, name, alts, why, usable, _switch_hint(rec))
        if failures:
            why = f"no kernel {name!r} is registered for {op}; its plugin failed to load: " + "; ".join(
                f.describe() for f in failures
            )
            how = "Fix or reinstall the failing plugin (see the chained exception)."
            cause = failures[0].error
        else:
            known = reg.names(op)
            guess = difflib.get_close_matches(kernel, known, n=1)
            why = f"no kernel {name!r} is registered for {op}" + (f" (did you mean {guess[0]!r}?)" if guess else "")
            if reg.failures:
                # Not obviously theirs, but a failed plugin may be the one that provides it.
                why += "; note that these plugins failed to load: " + ", ".join(
                    str(f.provenance) for f in reg.failures
                )
            switched = [p for p in reg.plugins if p.status == "disabled"]
            if switched:
                why += "; note that these plugins are not loaded: " + ", ".join(
                    f"{p.provenance} ({p.reason})" for p in switched
                )
            how = install_hint(name)
            cause = reg.failures[0].error if len(reg.failures) == 1 else None
        return Refusal(op, name, alts, why, usable, how, cause)
    problems = []
    for rk in provided:
        why = c.problem(rk.spec)
        if why is None:
            try:
                return _entry(rk, name, "requested by name", c.load)
            except Exception as e:
                if strict_mode():
                    raise _strict_import_error(rk, e, name) from e
                problems.append((rk, _import_why(e), e))
                continue
        problems.append((rk, why, None))
    rk, why, cause = problems[0]
    if "requires" in why:
        how = install_hint(name, rk.spec, rk.provenance.distribution)
    elif "device" in why or "capability" in why:
        how = f"Pick a kernel that runs on {c.dev}, or 'auto'."
    elif "honour" in why:
        how = "Pick a kernel listed above (they honour what the model needs), or 'auto'."
    elif "compile" in why:
        how = "Pick a kernel listed above (they run under torch.compile), or 'auto', or do not compile."
    elif "parallel" in why:
        how = "Pick a kernel listed above (they run under the layout), or 'auto', or set that parallel degree to 1."
    else:
        how = ""
    return Refusal(op, name, alts, f"kernel {name!r} ({rk.provenance}) {why}",
                   _usable_names(reg, op, alts[0], c), how, cause)


def _auto_key(order: Mapping[str, int]):
    def key(k: RegisteredKernel):
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


def _compile_preference(reg, op, alts, c: _Ctx) -> PlanEntry | None:
    """Compile-mode auto: the measured choice of :mod:`.compile_policy`, where it is usable here."""
    from .compile_policy import EVIDENCE, preference

    pref = preference(op, tuple(alts), c.dev.type)
    if pref is None:
        return None
    rk = reg.get(op, pref.variant, pref.kernel) if not reg.is_contested(op, pref.kernel) else None
    if rk is None or c.problem(rk.spec) is not None:
        return None
    try:
        entry = _entry(rk, AUTO, "", c.load)
    except Exception:
        return None
    return dataclasses.replace(entry, reason=f"auto (compile mode): {pref.kernel} by measurement: {pref.why} "
                                             f"[{EVIDENCE}]")


def _resolve_auto(reg, op, alts, c: _Ctx) -> PlanEntry | Refusal:
    if c.compile:
        got = _compile_preference(reg, op, alts, c)
        if got is not None:
            return got
    cands = [k for v in alts for k in reg.for_op(op, v)]
    # See AUTO_ORDER: priority, preferred variant, origin (core, first-party, others), name, distribution.
    order = {v: i for i, v in enumerate(alts)}
    cands.sort(key=_auto_key(order))
    passed: list[str] = []
    for i, rk in enumerate(cands):
        why = c.problem(rk.spec)
        if why is None:
            try:
                entry = _entry(rk, AUTO, "", c.load)
            except Exception as e:
                if strict_mode():
                    raise _strict_import_error(rk, e, reg.name_of(rk)) from e
                passed.append(f"{reg.name_of(rk)} (import failed: {type(e).__name__})")
                continue
            reason = f"auto: highest priority usable here (priority {rk.spec.priority})"
            tied = [k for k in cands[i + 1:] if k.spec.priority == rk.spec.priority
                    and k.spec.variant == rk.spec.variant and c.usable(k)]
            if tied:
                reason += (f"; tie at priority {rk.spec.priority} with "
                           + ", ".join(k.qualified_name for k in tied)
                           + f", broken by {_tie_rule(rk, tied[0])}")
            if passed:
                reason += "; passed over " + ", ".join(passed)
            if reg.is_contested(op, rk.spec.name):
                reason += f"; its name is contested: select it by name as {rk.qualified_name}"
            return dataclasses.replace(entry, reason=reason)
        passed.append(f"{reg.name_of(rk)} ({why})")
    return Refusal(op, AUTO, alts, "no registered kernel is usable here" + (": " + "; ".join(passed) if passed else ""),
                   (), "Install a backend for this op, or check why the candidates were refused.")
