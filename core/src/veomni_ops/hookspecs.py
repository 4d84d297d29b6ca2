"""The plugin API: one hook per op. Each docstring is that op's *kernel contract*, written in
the op's folder (``veomni_ops/ops/<op>/__init__.py``) and gathered here into :class:`OpHookspecs`.

A backend is a Python distribution with an entry point in the group
``veomni_ops.backends`` naming a *light* module (no torch extension, Triton, vendor or
model import at module level). That module implements any of the hooks below with
:data:`hookimpl`; each returns an iterable of :class:`~veomni_ops.spec.KernelSpec` for
that op. The kernel itself is imported only when a config selects it (``factory``).

Every kernel must match the contract of its op, forward and backward, within the
tolerances of its spec, against the core's ``eager`` reference; ``veomni-ops check``
and the conformance kit (``veomni_ops.testing``) verify exactly this.

A complete backend, ``pyproject.toml``::

    [project.entry-points."veomni_ops.backends"]
    mybackend = "my_backend.specs"

and ``my_backend/specs.py``::

    from veomni_ops import HardwareRequirement, KernelSpec, hookimpl

    VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"   # the plugin API versions this backend was built for

    @hookimpl
    def swiglu():
        return [KernelSpec(name="mybackend", op="swiglu", variant="standard",
                           factory="my_backend.kernels:swiglu",
                           hardware=HardwareRequirement(("cuda",), min_capability=(8, 0)),
                           priority=10)]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import pluggy

from .ops import OP_DEFS
from .spec import KernelSpec

PROJECT = "veomni_ops"
ENTRY_POINT_GROUP = "veomni_ops.backends"

#: The version of the plugin API this core provides, ``"MAJOR.MINOR"``. MAJOR goes up when a
#: backend written for the previous one may break: a hook removed or renamed, a kernel contract
#: (signature, layout, what backward produces) or the meaning of a ``KernelSpec`` field
#: changed. MINOR goes up when something is only added: a new op hook, a new variant or
#: feature, a new optional ``KernelSpec`` field. Published as ``veomni_ops.PLUGIN_API_VERSION``.
PLUGIN_API_VERSION = "1.0"

#: The module-level attribute of a spec module (the entry point's module) that declares the
#: plugin API versions the backend was built for, as a version range: ``">=1.0,<2"``.
#: Clauses are ``>=``, ``>``, ``<=``, ``<``, ``==``, ``!=`` or ``~=`` with a version ``N`` or
#: ``N.M`` (``==N.*`` too), joined by commas, as in PEP 440. A backend outside the range is a
#: load failure (phase ``api``) that says whether to upgrade the core or the backend; a backend
#: that declares nothing loads, with a recorded warning.
PLUGIN_API_ATTR = "VEOMNI_OPS_PLUGIN_API"


class PluginAPIError(RuntimeError):
    """A backend was built for plugin API versions this core does not provide, or declares an
    invalid range."""


_CLAUSE = re.compile(r"^(>=|<=|==|!=|~=|>|<)\s*(\d+)(?:\.(\d+))?(\.\*)?$")


def _version(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)(?:\.(\d+))?", text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a plugin API version (MAJOR.MINOR)")
    return int(m.group(1)), int(m.group(2) or 0)


def parse_api_range(declared: object) -> list[tuple[str, tuple[int, int], bool]]:
    """``">=1.0,<2"`` -> ``[(">=", (1, 0), False), ("<", (2, 0), False)]`` (the bool: ``.*``).

    Raises :class:`PluginAPIError` saying what is wrong."""
    if not isinstance(declared, str) or not declared.strip():
        raise PluginAPIError(
            f"{PLUGIN_API_ATTR} must be a version range string such as '>=1.0,<2', got "
            f"{type(declared).__name__} {declared!r}"
        )
    out = []
    for raw in declared.split(","):
        m = _CLAUSE.match(raw.strip())
        if not m or (m.group(4) and m.group(1) not in ("==", "!=")) or (m.group(1) == "~=" and m.group(3) is None):
            raise PluginAPIError(
                f"{PLUGIN_API_ATTR}={declared!r} is not a version range: {raw.strip()!r} is not a clause such as "
                "'>=1.0', '<2' or '==1.*' (operators >=, >, <=, <, ==, !=, ~=; versions N or N.M)"
            )
        op, major, minor, star = m.group(1), int(m.group(2)), m.group(3), bool(m.group(4))
        if star and minor is not None:
            raise PluginAPIError(f"{PLUGIN_API_ATTR}={declared!r}: write '==N.*' (a major version), not {raw.strip()!r}")
        out.append((op, (major, int(minor or 0)), star))
    return out


def _satisfies(v: tuple[int, int], op: str, w: tuple[int, int], star: bool) -> bool:
    if star:
        return (v[0] == w[0]) == (op == "==")
    return {
        ">=": v >= w, ">": v > w, "<=": v <= w, "<": v < w, "==": v == w, "!=": v != w,
        "~=": v >= w and v[0] == w[0],
    }[op]


def api_range_problem(declared: object, provided: str = PLUGIN_API_VERSION) -> tuple[str, str] | None:
    """``None`` if plugin API ``provided`` is in the ``declared`` range, else ``(side, why)``:
    ``side`` is ``"core"`` when the backend needs a newer core, ``"plugin"`` when it was built
    for an older API than this core provides. Raises :class:`PluginAPIError` for a bad range."""
    clauses = parse_api_range(declared)
    v = _version(provided)
    failed = [c for c in clauses if not _satisfies(v, *c)]
    if not failed:
        return None
    # A lower bound above us: the backend is newer than this core.
    newer = any((w[0] > v[0]) if star else (w >= v if op == ">" else w > v)
                for op, w, star in failed if op in (">=", ">", "==", "~="))
    return ("core" if newer else "plugin"), f"{str(declared).strip()} does not include {provided}"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


_EXAMPLE = """
Example::

    @hookimpl
    def {op}():
        return [KernelSpec(name="mine", op="{op}", variant="{variant}",
                           factory="my_backend.kernels.{op}:{op}")]
"""


def _hookspec(op: str, contract: str, variant: str) -> Callable[..., Iterable[KernelSpec]]:
    """The hook of ``op``: no argument, returns the backend's specs for it; its docstring is the
    op's kernel contract (from the op's folder) and an example implementation."""

    def hook(self: Any) -> Iterable[KernelSpec]:
        ...  # pluggy reads a hookspec's name and signature, never runs it

    hook.__name__, hook.__qualname__ = op, f"OpHookspecs.{op}"
    hook.__doc__ = contract + _EXAMPLE.format(op=op, variant=variant)
    return hookspec(hook)


def _op_hookspecs() -> type:
    """One hook per op (:data:`veomni_ops.ops.OP_DEFS`), named after it."""
    methods = {op: _hookspec(op, d.contract, d.info.variants[0]) for op, d in OP_DEFS.items()}
    doc = "One hook per op; each returns the :class:`KernelSpec` objects a backend offers for it."
    return type("OpHookspecs", (), {"__module__": __name__, "__doc__": doc, **methods})


#: The hookspecs: one method per op, whose docstring is the op's kernel contract (``help(OpHookspecs.swiglu)``).
OpHookspecs = _op_hookspecs()
