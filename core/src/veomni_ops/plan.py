"""``KernelPlan``: the frozen outcome of resolution — per op and variant, which kernel and why."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .config import OpsConfig
from .device import DeviceInfo
from .registry import RegisteredKernel
from .spec import KernelSpec
from .target import Mode


@dataclass(frozen=True, eq=False)
class PlanEntry:
    """One ``(op, variant)`` of a plan: the registered kernel resolution chose (its spec and
    provenance, referenced, not copied), what the config asked for, why, and the loaded
    callable (``None`` when resolved without loading). ``op``, ``variant``, ``kernel`` (the
    name), ``distribution``, ``version`` and ``spec`` read through to the registered kernel."""

    registered: RegisteredKernel
    requested: str
    reason: str
    fn: Callable[..., Any] | None = None

    @property
    def spec(self) -> KernelSpec:
        return self.registered.spec

    @property
    def op(self) -> str:
        return self.registered.spec.op

    @property
    def variant(self) -> str:
        return self.registered.spec.variant

    @property
    def kernel(self) -> str:
        """The kernel's (bare) name."""
        return self.registered.spec.name

    @property
    def distribution(self) -> str:
        return self.registered.provenance.distribution

    @property
    def version(self) -> str:
        return self.registered.provenance.version

    def _shown(self) -> tuple[tuple[str, str], ...]:
        """What an entry is, as its repr, equality and hash see it (not the spec or the callable)."""
        return (("op", self.op), ("variant", self.variant), ("requested", self.requested), ("kernel", self.kernel),
                ("distribution", self.distribution), ("version", self.version), ("reason", self.reason))

    def __repr__(self) -> str:
        return "PlanEntry(" + ", ".join(f"{k}={v!r}" for k, v in self._shown()) + ")"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlanEntry):
            return NotImplemented
        return self._shown() == other._shown()

    def __hash__(self) -> int:
        return hash(self._shown())

    def to_dict(self) -> dict[str, Any]:
        return {
            **dict(self._shown()),
            "factory": self.spec.factory_repr(),
            "supports_backward": self.spec.supports_backward,
            "supports_compile": self.spec.supports_compile,
        }


def text_columns(rows: Sequence[tuple[str, ...]], indent: str = "") -> list[str]:
    """Rows as aligned text columns with a rule under the first (the header); the last column,
    free text, is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for i, r in enumerate(rows):
        out.append((indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]).rstrip())
        if i == 0:
            out.append(indent + "  ".join("-" * w for w in widths) + "  " + "-" * len(r[-1]))
    return out


class KernelNotLoadedError(RuntimeError):
    pass


@dataclass(frozen=True)
class KernelPlan:
    """Per ``(op, variant)`` the chosen kernel. Immutable; bind it with ``veomni_ops.apply``."""

    device: DeviceInfo
    config: OpsConfig
    entries: tuple[PlanEntry, ...]
    #: how the model runs (training or inference, eager or under torch.compile: then only
    #: supports_compile kernels); the plan's JSON and table name it as ``mode.execution``
    mode: Mode = Mode.TRAINING | Mode.EAGER
    #: the plan lock in force (``veomni_ops.lock``: which file, how it was named, where it was tuned), if any
    lock: str | None = None
    #: planned for another device than this machine's: this machine's device (e.g. ``cpu``); None here
    planned_from: str | None = None
    #: per ``(op, variant)``, the requirements of its kernel this machine does not meet and that were
    #: not checked (planning for another machine, whose installed packages cannot be seen from here)
    not_checked: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    #: ops on ``auto`` with no kernel usable here, each with why, left to the model's own code
    #: (resolved for a :class:`~veomni_ops.target.Target` with ``leaves_to_model``)
    left: tuple[tuple[str, str], ...] = ()
    #: what resolution took beside what the config names, one sentence each (a need's fallback)
    notes: tuple[str, ...] = ()

    @property
    def compile(self) -> bool:
        """Resolved for a model that runs under torch.compile (only supports_compile kernels)."""
        return self.mode.compile

    def get(self, op: str, variant: str) -> PlanEntry | None:
        for e in self.entries:
            if e.op == op and e.variant == variant:
                return e
        return None

    def for_op(self, op: str) -> list[PlanEntry]:
        return [e for e in self.entries if e.op == op]

    def kernel(self, op: str, variant: str) -> Callable[..., Any]:
        """The loaded kernel callable for ``(op, variant)``."""
        e = self.get(op, variant)
        if e is None:
            have = ", ".join(f"{x.op}/{x.variant}" for x in self.entries) or "nothing"
            raise KeyError(f"the plan has no kernel for {op}/{variant}; it covers: {have}")
        if e.fn is None:
            raise KernelNotLoadedError(
                f"the plan for {op}/{variant} ({e.kernel}) was resolved without loading kernels "
                f"(device {self.device.describe()}); resolve on the device that runs it to load it"
            )
        return e.fn

    def not_checked_entries(self) -> list[tuple[PlanEntry, tuple[str, ...]]]:
        """The entries whose kernel's requirements were not checked here, each with those requirements."""
        out = []
        for op, variant, requires in self.not_checked:
            e = self.get(op, variant)
            if e is not None:
                out.append((e, requires))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device.to_dict(),
            "mode": self.mode.execution,
            "lock": self.lock,
            "config": self.config.to_dict(),
            "entries": [e.to_dict() for e in self.entries],
            "planned_from": self.planned_from,
            "not_checked": [{"op": e.op, "variant": e.variant, "kernel": e.kernel, "distribution": e.distribution,
                             "requires": list(r)} for e, r in self.not_checked_entries()],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self) -> str:
        head = ("op", "variant", "kernel", "from", "why")
        rows = [head] + [
            (e.op, e.variant, e.kernel, f"{e.distribution} {e.version}", e.reason) for e in self.entries
        ]
        title = (f"KernelPlan for {self.device}" + (f" ({self.device.name})" if self.device.name else "")
                 + f", mode {self.mode.execution}"
                 + (" (torch.compile: supports_compile kernels only)" if self.compile else "")
                 + (f"; plan lock {self.lock}" if self.lock else ""))
        lines = [title, *text_columns(rows)]
        if self.planned_from is not None:
            unchecked = self.not_checked_entries()
            loaded = any(e.fn is not None for e in self.entries)
            lines += ["", f"planned for {self.device} from this {self.planned_from} machine: "
                      + ("" if loaded else "no kernel was imported, and ")
                      + "requirements this machine does not meet were not checked (the target's installed packages "
                      "cannot be seen from here)" + (":" if unchecked else ".")]
            lines += [f"  not checked here: {e.op}/{e.variant} {e.kernel} ({e.distribution}) requires {', '.join(r)}"
                      for e, r in unchecked]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
