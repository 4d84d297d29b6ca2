"""Find every installed backend through its entry point, once per process.

Each entry point in the group ``veomni_ops.backends`` names a light module of hook
implementations. Entry points are loaded one at a time; a plugin that fails to import,
raises in a hook, implements a hook that does not exist or returns an invalid spec becomes
a :class:`~veomni_ops.registry.LoadFailure` and the others go on. Resolution later
explains such failures; ``VEOMNI_OPS_STRICT=1`` makes any of them fatal here.

Plugin API. A spec module declares the plugin API versions it was built for
(``VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"``, see :data:`~veomni_ops.hookspecs.PLUGIN_API_ATTR`).
Outside the range the core provides (:data:`~veomni_ops.hookspecs.PLUGIN_API_VERSION`), the
plugin is a load failure at phase ``api`` naming both versions and what to upgrade; a plugin
that declares nothing loads, with a warning on its record.

Names. Two distributions registering one kernel name for an op both load; the name is
*contested* and recorded as a warning on both records (see :mod:`veomni_ops.registry`).

Environment switches (comma-separated entry-point or distribution names):

``VEOMNI_OPS_PLUGINS``  allowlist; unset = all plugins, empty = none. The core's own
                        reference backend is always loaded. A name that matches no installed
                        plugin is a warning that lists the installed ones.
``VEOMNI_OPS_DISABLE``  denylist (a name matching nothing installed: the same warning).
``VEOMNI_OPS_STRICT``   ``1``: any load failure raises :class:`PluginLoadError`, and so does
                        a kernel whose module fails to import when resolution imports it.
``VEOMNI_OPS_TRACE``    ``1``: log every plugin load and hook call (logger ``veomni_ops``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from .hookspecs import (
    ENTRY_POINT_GROUP,
    PLUGIN_API_ATTR,
    PLUGIN_API_VERSION,
    PROJECT,
    OpHookspecs,
    PluginAPIError,
    api_range_problem,
)
from .registry import CORE_DISTRIBUTION, LoadFailure, PluginRecord, Provenance, RegisteredKernel, Registry
from .spec import OPS

log = logging.getLogger("veomni_ops")

ENV_ALLOW = "VEOMNI_OPS_PLUGINS"
ENV_DENY = "VEOMNI_OPS_DISABLE"
ENV_STRICT = "VEOMNI_OPS_STRICT"
ENV_TRACE = "VEOMNI_OPS_TRACE"


class PluginLoadError(RuntimeError):
    """Strict mode: a plugin failed to load."""


class PluginHookError(ValueError):
    """A plugin implements a hook that does not exist, or with the wrong signature."""


class PluginExitError(RuntimeError):
    """A plugin raised a ``BaseException`` that is not an ``Exception`` while loading (``sys.exit``,
    ``SystemExit``, ...): it becomes the plugin's load failure instead of ending the process."""


def _contained(e: BaseException, prov: Provenance, doing: str) -> BaseException:
    """The load failure's error for what a plugin raised while ``doing`` (importing its module,
    calling a hook). ``KeyboardInterrupt`` is not contained: the user's Ctrl-C stops discovery as it
    stops anything else. Any other ``BaseException`` (``sys.exit`` at import, ...) would end every
    command with no word of which plugin did it: it is named, as an ``Exception`` is."""
    if isinstance(e, KeyboardInterrupt):
        raise e
    if isinstance(e, Exception):
        return e
    what = (f"called sys.exit({e.code!r})" if isinstance(e, SystemExit)
            else f"raised {type(e).__module__}.{type(e).__qualname__}: {e}")
    err = PluginExitError(
        f"{doing} {what}, which would end the process; veomni-ops went on without this plugin. A plugin must raise "
        f"an exception, not exit: fix or uninstall {prov.distribution} (pip uninstall {prov.distribution}), or "
        f"disable it with {ENV_DENY}={prov.entry_point}")
    err.__cause__ = e
    return err


def core_version() -> str:
    """This veomni-ops' version, from its distribution's metadata (``core/pyproject.toml`` is the
    one place it is written); ``"0+unknown"`` where the sources run without being installed.
    ``veomni_ops.__version__`` reads it, so no module of the core imports the package face."""
    try:
        return metadata.version(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def strict_mode(env: dict[str, str] | None = None) -> bool:
    """Is ``VEOMNI_OPS_STRICT`` on (in ``env``, default the process environment)?"""
    return _truthy((os.environ if env is None else env).get(ENV_STRICT))


def _names(v: str) -> set[str]:
    return {n.strip().lower().replace("_", "-") for n in v.split(",") if n.strip()}


def _ids(prov: Provenance) -> set[str]:
    """The names the switches match for this plugin: entry point and distribution."""
    return {prov.entry_point.lower().replace("_", "-"), prov.distribution.lower().replace("_", "-")}


def _selected(prov: Provenance, env: dict[str, str]) -> tuple[bool, str]:
    """Whether the allow/deny lists let this plugin load, and why not."""
    if prov.distribution == CORE_DISTRIBUTION:
        return True, ""
    ids = _ids(prov)
    if ENV_ALLOW in env:
        allow = _names(env[ENV_ALLOW])
        if not ids & allow:
            return False, f"not in {ENV_ALLOW}={env[ENV_ALLOW]!r}"
    deny = _names(env.get(ENV_DENY, ""))
    if ids & deny:
        return False, f"disabled by {ENV_DENY}={env[ENV_DENY]!r}"
    return True, ""


class _Source:
    """One plugin to load: an entry point, or a module given directly (tests, notebooks)."""

    def __init__(self, provenance: Provenance, load: Any):
        self.provenance = provenance
        self.load = load


def _switch_notes(sources: Sequence[_Source], env: dict[str, str]) -> list[str]:
    """Warnings for allow/deny list entries that match no installed plugin (a typo, or a
    plugin that is not installed: the user asked for something that cannot happen)."""
    known: set[str] = {CORE_DISTRIBUTION, "eager"}
    for src in sources:
        known |= _ids(src.provenance)
    installed = ", ".join(
        sorted({f"{s.provenance.entry_point} ({s.provenance.distribution})" for s in sources
                if s.provenance.distribution != CORE_DISTRIBUTION})
    ) or "none"
    notes = []
    for var in (ENV_ALLOW, ENV_DENY):
        if var not in env:
            continue
        unknown = sorted(_names(env[var]) - known)
        if unknown:
            what = "is" if len(unknown) == 1 else "are"
            notes.append(
                f"{var}={env[var]!r} names {', '.join(unknown)}, which {what} not an installed plugin (entry point or "
                f"distribution); installed plugins: {installed}"
            )
    return notes


def _entry_point_sources() -> list[_Source]:
    out = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        name = dist.metadata["Name"] if dist is not None else "<unknown>"
        version = dist.version if dist is not None else "?"
        out.append(_Source(Provenance(name, version, ep.name), ep.load))
    # Deterministic order: the core first, then by distribution and entry point.
    out.sort(key=lambda s: (s.provenance.distribution != CORE_DISTRIBUTION, s.provenance.distribution, s.provenance.entry_point))
    return out


def build_registry(
    modules: Sequence[tuple[str, ModuleType | object]] | None = None,
    *,
    include_entry_points: bool = True,
    env: dict[str, str] | None = None,
) -> Registry:
    """Build a fresh registry (no caching).

    ``modules``: extra ``(name, module)`` plugins to load as if they were entry points of a
    distribution called ``name`` (for tests and interactive use).
    """
    env = dict(os.environ if env is None else env)
    strict = _truthy(env.get(ENV_STRICT))
    trace = _truthy(env.get(ENV_TRACE))
    if trace and not log.handlers:
        # The switch must show something even where the application configured no logging.
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    t0 = time.perf_counter()
    reg = Registry()
    sources = _entry_point_sources() if include_entry_points else []
    for name, mod in modules or ():
        sources.append(_Source(Provenance(name, "local", name), (lambda m=mod: m)))

    for note in _switch_notes(sources, env):
        reg.notes.append(note)
        log.warning("veomni_ops: %s", note)
    for src in sources:
        prov = src.provenance
        ok, why = _selected(prov, env)
        if not ok:
            reg.plugins.append(PluginRecord(prov, "disabled", why))
            if trace:
                log.info("veomni_ops: skip %s: %s", prov, why)
            continue
        failure, kernels, warnings = _load_one(src, reg, trace)
        if failure is not None:
            reg.failures.append(failure)
            reg.plugins.append(PluginRecord(prov, "failed", failure.message, phase=failure.phase))
            log.warning("veomni_ops: %s", failure.describe())
            if strict:
                raise PluginLoadError(
                    f"{failure.describe()}\n({ENV_STRICT}=1 makes every plugin load failure fatal; fix or "
                    f"uninstall the plugin, or disable it with {ENV_DENY}={prov.entry_point})"
                ) from failure.error
        else:
            for w in warnings:
                reg.notes.append(f"plugin {prov}: {w}")
                log.warning("veomni_ops: plugin %s: %s", prov, w)
            reg.plugins.append(PluginRecord(prov, "loaded", "; ".join(warnings), tuple(k.key for k in kernels),
                                            warnings=tuple(warnings)))
    _record_contests(reg)
    reg.discovery_seconds = time.perf_counter() - t0
    return reg


def _record_contests(reg: Registry) -> None:
    """Every contested kernel name is a warning, on the registry and on each plugin involved."""
    extra: dict[Provenance, list[str]] = {}
    for (op, name), provs in reg.contested().items():
        msg = reg.contest_message(op, name)
        reg.notes.append(msg)
        log.warning("veomni_ops: %s", msg)
        for p in provs:
            extra.setdefault(p, []).append(msg)
    if not extra:
        return
    for i, rec in enumerate(reg.plugins):
        if rec.status == "loaded" and rec.provenance in extra:
            ws = rec.warnings + tuple(extra[rec.provenance])
            reg.plugins[i] = PluginRecord(rec.provenance, rec.status, "; ".join(ws), rec.kernels, rec.phase, ws)


def _api_check(prov: Provenance, module: Any) -> tuple[LoadFailure | None, list[str]]:
    """The plugin API range the module declares, against the one this core provides."""
    where = getattr(module, "__name__", None) or prov.entry_point
    declared = getattr(module, PLUGIN_API_ATTR, None)
    if declared is None:
        if prov.distribution == CORE_DISTRIBUTION:
            return None, []
        return None, [
            f"declares no plugin API range ({PLUGIN_API_ATTR} in {where}); loaded as if built for plugin API "
            f"{PLUGIN_API_VERSION}, the one this veomni-ops provides. Its authors should add "
            f"{PLUGIN_API_ATTR} = \">={PLUGIN_API_VERSION},<{int(PLUGIN_API_VERSION.split('.')[0]) + 1}\""
        ]
    try:
        problem = api_range_problem(declared)
    except PluginAPIError as e:
        return LoadFailure(prov, "api", PluginAPIError(f"{where}: {e}")), []
    if problem is None:
        return None, []
    side, _ = problem
    built = (f"{prov.distribution} {prov.version} was built for veomni-ops plugin API {declared.strip()} "
             f"({PLUGIN_API_ATTR} in {where}), but this veomni-ops {core_version()} provides plugin API "
             f"{PLUGIN_API_VERSION}")
    if side == "core":
        fix = (f"upgrade veomni-ops to a release whose plugin API is in {declared.strip()} "
               f"(pip install -U veomni-ops), or install a release of {prov.distribution} built for plugin API "
               f"{PLUGIN_API_VERSION}")
    else:
        fix = (f"upgrade {prov.distribution} to a release built for plugin API {PLUGIN_API_VERSION} "
               f"(pip install -U {prov.distribution}), or install a veomni-ops whose plugin API is in "
               f"{declared.strip()}")
    return LoadFailure(prov, "api", PluginAPIError(f"{built}: {fix}")), []


def _call_hooks(pm: pluggy.PluginManager, prov: Provenance, trace: bool) -> tuple[list[Any], LoadFailure | None]:
    """Every spec one plugin's hooks return, or the failure of the first hook that raised or
    returned a spec for another op."""
    specs: list[Any] = []
    for op in OPS:
        for impl in getattr(pm.hook, op).get_hookimpls():
            if trace:
                log.info("veomni_ops: call %s.%s()", prov.entry_point, op)
            try:
                result = impl.function()
                got = list(result or ())
            except BaseException as e:  # noqa: BLE001 - a plugin's hook may raise anything (see _contained)
                return [], LoadFailure(prov, f"hook:{op}", _contained(e, prov, f"its hook {op}()"))
            for s in got:
                if getattr(s, "op", op) != op:
                    return [], LoadFailure(
                        prov, f"hook:{op}", ValueError(f"hook {op}() returned a spec for op {s.op!r} ({s.name!r})"))
            specs.extend(got)
    return specs, None


def _load_one(src: _Source, reg: Registry, trace: bool
              ) -> tuple[LoadFailure | None, list[RegisteredKernel], list[str]]:
    """``(failure, kernels added, warnings)`` for one plugin."""
    prov = src.provenance
    try:
        module = src.load()
    except BaseException as e:  # noqa: BLE001 - a plugin's import may raise anything (see _contained)
        return LoadFailure(prov, "import", _contained(e, prov, "importing it")), [], []
    if trace:
        log.info("veomni_ops: loaded %s from %s", prov.entry_point, getattr(module, "__name__", module))
    failure, warnings = _api_check(prov, module)
    if failure is not None:
        return failure, [], []

    # One plugin manager per plugin: check_pending() then blames exactly this plugin.
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(OpHookspecs)
    try:
        pm.register(module, name=prov.entry_point)
        pm.check_pending()
    except Exception as e:
        known = ", ".join(OPS)
        err = PluginHookError(f"{e} (the hooks a backend may implement are: {known})")
        err.__cause__ = e
        return LoadFailure(prov, "hooks", err), [], []

    specs, failure = _call_hooks(pm, prov, trace)
    if failure is not None:
        return failure, [], []
    try:
        added = reg.add_all(specs, prov)
    except Exception as e:
        return LoadFailure(prov, "validate", e), [], []
    return None, added, warnings


_lock = threading.Lock()
_cached: Registry | None = None


def discover(refresh: bool = False) -> Registry:
    """The process-wide registry, built on first use from installed entry points."""
    global _cached
    with _lock:
        if _cached is None or refresh:
            _cached = build_registry()
        return _cached


def registered_kernels(op: str) -> Iterable[str]:
    return discover().names(op)
