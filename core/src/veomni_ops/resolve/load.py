"""Loading kernels: import a spec's factory once per process, and remember what failed.

A kernel whose factory failed to import in this process is not offered as usable again
(:func:`import_failure`); under ``VEOMNI_OPS_STRICT=1`` such a failure raises
:class:`~veomni_ops.discovery.PluginLoadError` (:func:`strict_import_error`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ..discovery import ENV_DENY, ENV_STRICT, PluginLoadError, strict_mode
from ..plan import PlanEntry
from ..registry import RegisteredKernel

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


def import_why(e: BaseException) -> str:
    """How a failed import reads in a refusal or a plan entry's reason."""
    return f"its kernel failed to import ({type(e).__name__}: {e})"


def strict_import_error(rk: RegisteredKernel, e: BaseException, name: str) -> PluginLoadError:
    """The error ``VEOMNI_OPS_STRICT=1`` raises for a kernel (configured as ``name``) whose factory failed."""
    s = rk.spec
    err = PluginLoadError(
        f"kernel {name!r} for {s.op}/{s.variant} ({rk.provenance}) failed to import its factory "
        f"{s.factory_repr()}: {type(e).__name__}: {e}\n({ENV_STRICT}=1 makes a kernel that fails to import fatal, "
        f"as it does every plugin load failure; fix or reinstall {rk.provenance.distribution}, or disable it with "
        f"{ENV_DENY}={rk.provenance.entry_point})"
    )
    err.__cause__ = e
    return err


def plan_entry(rk: RegisteredKernel, requested: str, reason: str, load: bool) -> PlanEntry:
    """The plan entry of ``rk`` (its kernel loaded where ``load``); a failed import raises."""
    return PlanEntry(rk, requested, reason, load_kernel(rk) if load else None)


def try_entry(rk: RegisteredKernel, requested: str, reason: str, load: bool, name: str) -> PlanEntry | Exception:
    """:func:`plan_entry`, with a failed import returned instead of raised, except under
    ``VEOMNI_OPS_STRICT=1``, where it raises :func:`strict_import_error` (``name``: how the config
    or the plan names the kernel)."""
    try:
        return plan_entry(rk, requested, reason, load)
    except Exception as e:
        if strict_mode():
            raise strict_import_error(rk, e, name) from e
        return e
