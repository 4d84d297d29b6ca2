"""Find every installed backend through its entry point, once per process.

Each entry point in the group ``veomni_ops.backends`` names a light module of hook
implementations. Entry points are loaded one at a time; a plugin that fails to import,
raises in a hook, implements a hook that does not exist or returns an invalid spec becomes
a :class:`~veomni_ops.registry.LoadFailure` and the others go on. Resolution later
explains such failures; ``VEOMNI_OPS_STRICT=1`` makes any of them fatal here.

Environment switches (comma-separated entry-point or distribution names):

``VEOMNI_OPS_PLUGINS``  allowlist; unset = all plugins, empty = none. The core's own
                        reference backend is always loaded.
``VEOMNI_OPS_DISABLE``  denylist.
``VEOMNI_OPS_STRICT``   ``1``: any load failure raises :class:`PluginLoadError`.
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

from .hookspecs import ENTRY_POINT_GROUP, PROJECT, OpHookspecs
from .registry import LoadFailure, PluginRecord, Provenance, Registry
from .spec import OPS

log = logging.getLogger("veomni_ops")

CORE_DISTRIBUTION = "veomni-ops"
ENV_ALLOW = "VEOMNI_OPS_PLUGINS"
ENV_DENY = "VEOMNI_OPS_DISABLE"
ENV_STRICT = "VEOMNI_OPS_STRICT"
ENV_TRACE = "VEOMNI_OPS_TRACE"


class PluginLoadError(RuntimeError):
    """Strict mode: a plugin failed to load."""


class PluginHookError(ValueError):
    """A plugin implements a hook that does not exist, or with the wrong signature."""


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def _names(v: str) -> set[str]:
    return {n.strip().lower().replace("_", "-") for n in v.split(",") if n.strip()}


def _selected(prov: Provenance, env: dict[str, str]) -> tuple[bool, str]:
    """Whether the allow/deny lists let this plugin load, and why not."""
    if prov.distribution == CORE_DISTRIBUTION:
        return True, ""
    ids = {prov.entry_point.lower().replace("_", "-"), prov.distribution.lower().replace("_", "-")}
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

    for src in sources:
        prov = src.provenance
        ok, why = _selected(prov, env)
        if not ok:
            reg.plugins.append(PluginRecord(prov, "disabled", why))
            if trace:
                log.info("veomni_ops: skip %s: %s", prov, why)
            continue
        failure, kernels = _load_one(src, reg, trace)
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
            reg.plugins.append(PluginRecord(prov, "loaded", "", tuple(k.key for k in kernels)))
    reg.discovery_seconds = time.perf_counter() - t0
    return reg


def _load_one(src: _Source, reg: Registry, trace: bool):
    prov = src.provenance
    try:
        module = src.load()
    except BaseException as e:  # noqa: BLE001 - a plugin's import may raise anything
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return LoadFailure(prov, "import", e), []
    if trace:
        log.info("veomni_ops: loaded %s from %s", prov.entry_point, getattr(module, "__name__", module))

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
        return LoadFailure(prov, "hooks", err), []

    specs = []
    for op in OPS:
        for impl in getattr(pm.hook, op).get_hookimpls():
            if trace:
                log.info("veomni_ops: call %s.%s()", prov.entry_point, op)
            try:
                result = impl.function()
                got = list(result or ())
            except Exception as e:
                return LoadFailure(prov, f"hook:{op}", e), []
            for s in got:
                if getattr(s, "op", op) != op:
                    return LoadFailure(
                        prov, f"hook:{op}", ValueError(f"hook {op}() returned a spec for op {s.op!r} ({s.name!r})")
                    ), []
            specs.extend(got)
    try:
        added = reg.add_all(specs, prov)
    except Exception as e:
        return LoadFailure(prov, "validate", e), []
    return None, added


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
