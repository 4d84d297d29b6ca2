"""The registry: every validated kernel spec, with provenance, and every plugin that failed.

Built by :mod:`veomni_ops.discovery`; read by resolution and the CLI. Immutable once built.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .spec import OPS, KernelSpec


class DuplicateKernelError(ValueError):
    """Two plugins registered the same ``(op, variant, name)``."""


@dataclass(frozen=True)
class Provenance:
    """Where a spec came from: the distribution, its version and the entry point."""

    distribution: str
    version: str
    entry_point: str

    def __str__(self) -> str:
        return f"{self.distribution} {self.version} (entry point {self.entry_point!r})"


@dataclass(frozen=True)
class RegisteredKernel:
    spec: KernelSpec
    provenance: Provenance

    @property
    def key(self) -> tuple[str, str, str]:
        return self.spec.key


@dataclass(frozen=True)
class LoadFailure:
    """A plugin that could not be loaded, and why. Its specs are not registered."""

    provenance: Provenance
    phase: str  # "import" | "hooks" | "hook:<op>" | "validate"
    error: BaseException

    @property
    def message(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"

    def describe(self) -> str:
        return f"plugin {self.provenance} failed at {self.phase}: {self.message}"

    def traceback(self) -> str:
        return "".join(traceback.format_exception(type(self.error), self.error, self.error.__traceback__))


@dataclass(frozen=True)
class PluginRecord:
    """One entry point as discovery saw it."""

    provenance: Provenance
    status: str  # "loaded" | "failed" | "disabled"
    reason: str = ""
    kernels: tuple[tuple[str, str, str], ...] = ()
    phase: str = ""  # for "failed": import | hooks | hook:<op> | validate

    def to_dict(self) -> dict:
        return {
            "distribution": self.provenance.distribution,
            "version": self.provenance.version,
            "entry_point": self.provenance.entry_point,
            "status": self.status,
            "reason": self.reason,
            "phase": self.phase,
            "kernels": [list(k) for k in self.kernels],
        }


@dataclass
class Registry:
    """All registered kernels keyed by ``(op, variant, name)``, plus load failures."""

    _kernels: dict[tuple[str, str, str], RegisteredKernel] = field(default_factory=dict)
    failures: list[LoadFailure] = field(default_factory=list)
    plugins: list[PluginRecord] = field(default_factory=list)
    discovery_seconds: float = 0.0

    def add_all(self, specs: Iterable[KernelSpec], provenance: Provenance) -> list[RegisteredKernel]:
        """Add one plugin's specs atomically: a duplicate (within the plugin or against the
        registry) raises :class:`DuplicateKernelError` naming both distributions, and then
        nothing of this plugin is added."""
        staged: dict[tuple[str, str, str], RegisteredKernel] = {}
        for spec in specs:
            if not isinstance(spec, KernelSpec):
                raise TypeError(f"hook returned {type(spec).__name__} {spec!r}, expected veomni_ops.KernelSpec")
            key = spec.key
            other = self._kernels.get(key) or staged.get(key)
            if other is not None:
                op, variant, name = key
                raise DuplicateKernelError(
                    f"kernel {name!r} for {op}/{variant} is registered twice: by {other.provenance} and by "
                    f"{provenance}. Kernel names must be unique per op and variant; rename one of them or "
                    f"uninstall/disable one plugin (VEOMNI_OPS_DISABLE={provenance.entry_point})"
                )
            staged[key] = RegisteredKernel(spec, provenance)
        self._kernels.update(staged)
        return list(staged.values())

    def __iter__(self) -> Iterator[RegisteredKernel]:
        return iter(sorted(self._kernels.values(), key=lambda k: k.key))

    def __len__(self) -> int:
        return len(self._kernels)

    def get(self, op: str, variant: str, name: str) -> RegisteredKernel | None:
        return self._kernels.get((op, variant, name))

    def for_op(self, op: str, variant: str | None = None) -> list[RegisteredKernel]:
        return [k for k in self if k.spec.op == op and (variant is None or k.spec.variant == variant)]

    def names(self, op: str) -> list[str]:
        return sorted({k.spec.name for k in self if k.spec.op == op})

    def failures_for(self, name: str) -> list[LoadFailure]:
        """Failures of plugins that may have provided kernel ``name``: same entry point or
        distribution name (``liger`` ~ ``veomni-liger``)."""
        out = []
        for f in self.failures:
            p = f.provenance
            dist = p.distribution.lower().replace("_", "-")
            if p.entry_point == name or dist in (name, f"veomni-{name.replace('_', '-')}"):
                out.append(f)
        return out

    def ops_summary(self) -> dict[str, list[str]]:
        return {op: self.names(op) for op in OPS}
