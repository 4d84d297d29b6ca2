"""The registry: every validated kernel spec, with provenance, and every plugin that failed.

Built by :mod:`veomni_ops.discovery`; read by resolution and the CLI. Immutable once built.

Names. A kernel is identified by ``(op, variant, name)`` *and* the distribution that registers
it. Two distributions may register the same name for an op: neither plugin fails, every
kernel of both registers, and the name is *contested* for that op. A config then cannot use
the bare name (resolution refuses it, naming both distributions); it writes the name
qualified by its distribution, ``liger@veomni-liger`` (:data:`~veomni_ops.spec.QUALIFIER`).
So no installed package can take a name from another silently. One distribution registering
one ``(op, variant, name)`` twice (in one entry point or in two) is still a load failure
(:class:`DuplicateKernelError`): a qualified name could not tell those apart.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata

from .spec import OPS, KernelSpec, canonical_distribution, qualified_name, split_name

#: The core's own distribution, and ours: under ``auto``, among kernels of equal priority the
#: core's come first, then these, then everyone else's (see :func:`origin_rank`).
CORE_DISTRIBUTION = "veomni-ops"
FIRST_PARTY_DISTRIBUTIONS = ("veomni-liger", "veomni-triton", "veomni-quack", "veomni-npu", "veomni-flash")


def origin_rank(distribution: str) -> int:
    """0 for the core, 1 for our first-party backends, 2 for every other distribution."""
    d = canonical_distribution(distribution)
    if d == CORE_DISTRIBUTION:
        return 0
    return 1 if d in FIRST_PARTY_DISTRIBUTIONS else 2


ORIGINS = ("the core (veomni-ops)", "first-party (veomni-*)", "third-party")


#: The reference kernel's name: what transformers itself computes. Only the core registers it.
REFERENCE = "eager"


class DuplicateKernelError(ValueError):
    """One distribution registered the same ``(op, variant, name)`` twice."""


class ReservedNameError(ValueError):
    """A plugin registered a kernel name that configs read as something else (``auto``, the
    core's ``eager``, a VeOmni legacy name): no config could select it, and where it is
    ``eager`` the core's own reference would become ambiguous."""


def reserved_name(spec: KernelSpec, distribution: str) -> str | None:
    """Why ``distribution`` may not register ``spec`` under its name (``None``: it may).

    ``eager`` is the core's reference kernel: registered by the core, or by a module that
    registers the core's own reference kernels again (the tests' registries do), never by a
    kernel of another package."""
    from .config import AUTO, LEGACY_VALUES

    name = spec.name
    if name == AUTO:
        return f"{AUTO!r} is what a config writes to let veomni-ops pick a kernel, so no config could name this one"
    core_kernel = spec.factory_repr().partition(":")[0].startswith("veomni_ops.")
    if name == REFERENCE and canonical_distribution(distribution) != CORE_DISTRIBUTION and not core_kernel:
        return (f"{REFERENCE!r} is the core's reference kernel (transformers' own computation), which configs, "
                f"plans and the core's fallbacks name; only {CORE_DISTRIBUTION} registers it")
    new = {**LEGACY_VALUES["*"], **LEGACY_VALUES.get(spec.op, {})}.get(name)
    if new is not None:
        return (f"a config's {name!r} is VeOmni's legacy name for {new!r} and is read as that, so no config could "
                "name this kernel")
    return None


class ContestedNameError(DuplicateKernelError, LookupError):
    """A bare kernel name that more than one distribution registers for an op was looked up
    (:meth:`Registry.get`); the message lists the qualified names to use instead."""


@dataclass(frozen=True)
class Provenance:
    """Where a spec came from: the distribution, its version and the entry point."""

    distribution: str
    version: str
    entry_point: str

    def __str__(self) -> str:
        return f"{self.distribution} {self.version} (entry point {self.entry_point!r})"

    @property
    def qualifier(self) -> str:
        """The distribution as a qualified kernel name writes it (``veomni-liger``)."""
        return canonical_distribution(self.distribution)


@dataclass(frozen=True)
class RegisteredKernel:
    spec: KernelSpec
    provenance: Provenance

    @property
    def key(self) -> tuple[str, str, str]:
        return self.spec.key

    @property
    def qualified_name(self) -> str:
        """``name@distribution``: selects exactly this kernel, whatever else is installed."""
        return qualified_name(self.spec.name, self.provenance.distribution)


@dataclass(frozen=True)
class LoadFailure:
    """A plugin that could not be loaded, and why. Its specs are not registered."""

    provenance: Provenance
    phase: str  # "import" | "api" | "hooks" | "hook:<op>" | "validate"
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
    phase: str = ""  # for "failed": import | hooks | api | hook:<op> | validate
    #: for "loaded": what is worth knowing although it loaded (no plugin API range declared,
    #: a contested kernel name); ``reason`` repeats them, so every listing shows them.
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        out = {
            "distribution": self.provenance.distribution,
            "version": self.provenance.version,
            "entry_point": self.provenance.entry_point,
            "status": self.status,
            "reason": self.reason,
            "phase": self.phase,
            "kernels": [list(k) for k in self.kernels],
        }
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out


@dataclass
class Registry:
    """All registered kernels keyed by ``(op, variant, name)`` and distribution, plus load
    failures, the record of every entry point, and discovery's warnings (``notes``)."""

    #: (op, variant, name) -> {canonical distribution: kernel}
    _kernels: dict[tuple[str, str, str], dict[str, RegisteredKernel]] = field(default_factory=dict)
    failures: list[LoadFailure] = field(default_factory=list)
    plugins: list[PluginRecord] = field(default_factory=list)
    discovery_seconds: float = 0.0
    #: discovery's warnings that belong to no single kernel: a switch naming a plugin that is
    #: not installed, a contested kernel name, a plugin without a declared API range
    notes: list[str] = field(default_factory=list)

    def add_all(self, specs: Iterable[KernelSpec], provenance: Provenance) -> list[RegisteredKernel]:
        """Add one plugin's specs atomically. The same ``(op, variant, name)`` twice from one
        distribution (within this plugin, or from another entry point of the same distribution)
        raises :class:`DuplicateKernelError` naming both, and then nothing of this plugin is
        added. The same name from *another* distribution is accepted: the name becomes
        contested (:meth:`contested`) and only qualified names select either kernel."""
        staged: dict[tuple[str, str, str], RegisteredKernel] = {}
        dist = provenance.qualifier
        for spec in specs:
            if not isinstance(spec, KernelSpec):
                raise TypeError(f"hook returned {type(spec).__name__} {spec!r}, expected veomni_ops.KernelSpec")
            key = spec.key
            why = reserved_name(spec, provenance.distribution)
            if why is not None:
                raise ReservedNameError(
                    f"kernel name {spec.name!r} ({spec.op}/{spec.variant}) is reserved: {why}. {provenance} registers "
                    f"it: its authors must rename the kernel (e.g. {f'{dist}_{spec.name}'.replace('-', '_')!r}); "
                    f"until then uninstall it or disable it (VEOMNI_OPS_DISABLE={provenance.entry_point})")
            other = self._kernels.get(key, {}).get(dist) or staged.get(key)
            if other is not None:
                op, variant, name = key
                where = "twice by the same plugin" if other.provenance == provenance else "twice by one distribution"
                raise DuplicateKernelError(
                    f"kernel {name!r} for {op}/{variant} is registered {where}: by {other.provenance} and by "
                    f"{provenance}. A distribution must register each name once per op and variant (two "
                    f"distributions may share a name: a config then writes it qualified, "
                    f"{qualified_name(name, provenance.distribution)}); rename one of them, or disable one entry "
                    f"point (VEOMNI_OPS_DISABLE={provenance.entry_point})"
                )
            staged[key] = RegisteredKernel(spec, provenance)
        for key, rk in staged.items():
            self._kernels.setdefault(key, {})[dist] = rk
        return list(staged.values())

    def __iter__(self) -> Iterator[RegisteredKernel]:
        """Every kernel, by ``(op, variant, name)`` then distribution."""
        return iter([rk for key in sorted(self._kernels) for _, rk in sorted(self._kernels[key].items())])

    def __len__(self) -> int:
        return sum(len(v) for v in self._kernels.values())

    # -- lookup ------------------------------------------------------------------------------
    def providers(self, op: str, variant: str, name: str) -> list[RegisteredKernel]:
        """Every kernel that ``name`` may mean for ``(op, variant)``: the bare name's providers
        (one per distribution), or for a qualified ``name@dist`` the one of that distribution."""
        kernel, dist = split_name(name)
        found = self._kernels.get((op, variant, kernel), {})
        if dist is not None:
            return [found[dist]] if dist in found else []
        return [rk for _, rk in sorted(found.items())]

    def get(self, op: str, variant: str, name: str) -> RegisteredKernel | None:
        """The one kernel ``name`` (bare or qualified) selects for ``(op, variant)``, or None.

        A bare name that another distribution also registers for ``op`` raises
        :class:`ContestedNameError` listing the qualified names: never one of them silently."""
        kernel, dist = split_name(name)
        if dist is None and self.is_contested(op, kernel):
            raise ContestedNameError(self.contest_message(op, kernel))
        found = self.providers(op, variant, name)
        return found[0] if found else None

    def for_op(self, op: str, variant: str | None = None) -> list[RegisteredKernel]:
        return [k for k in self if k.spec.op == op and (variant is None or k.spec.variant == variant)]

    def names(self, op: str) -> list[str]:
        """Bare kernel names registered for ``op`` (a contested one once)."""
        return sorted({k.spec.name for k in self if k.spec.op == op})

    def name_of(self, rk: RegisteredKernel) -> str:
        """What a config writes to select ``rk``: its bare name, or, where that name is
        contested for its op, its qualified name."""
        return rk.qualified_name if self.is_contested(rk.spec.op, rk.spec.name) else rk.spec.name

    # -- contested names ---------------------------------------------------------------------
    def distributions_of(self, op: str, name: str) -> list[Provenance]:
        """The distinct plugins (provenances) registering bare ``name`` for ``op``, any variant."""
        seen: dict[str, Provenance] = {}
        for (o, _v, n), by_dist in self._kernels.items():
            if o == op and n == name:
                for d, rk in by_dist.items():
                    seen.setdefault(d, rk.provenance)
        return [seen[d] for d in sorted(seen, key=lambda d: (origin_rank(d), d))]

    def is_contested(self, op: str, name: str) -> bool:
        return len(self.distributions_of(op, name)) > 1

    def contested(self) -> dict[tuple[str, str], list[Provenance]]:
        """``(op, name)`` -> the distributions that all register ``name`` for ``op``."""
        out = {}
        for op, name in sorted({(o, n) for o, _v, n in self._kernels}):
            provs = self.distributions_of(op, name)
            if len(provs) > 1:
                out[(op, name)] = provs
        return out

    def contest_message(self, op: str, name: str) -> str:
        provs = self.distributions_of(op, name)
        refs = " or ".join(qualified_name(name, p.distribution) for p in provs)
        return (
            f"kernel name {name!r} for {op} is registered by {len(provs)} distributions: "
            + " and ".join(str(p) for p in provs)
            + f"; the bare name selects neither: write {refs}"
        )

    # -- why a name is missing -----------------------------------------------------------------
    def failures_for(self, name: str) -> list[LoadFailure]:
        """Failures of plugins that may have provided kernel ``name``: same entry point or
        distribution name (``liger`` ~ ``veomni-liger``); for a qualified name, its distribution."""
        return [f for f in self.failures if _may_provide(f.provenance, name)]

    def switched_off_for(self, name: str) -> list[PluginRecord]:
        """Plugins taken out by ``VEOMNI_OPS_PLUGINS`` / ``VEOMNI_OPS_DISABLE`` that may have
        provided kernel ``name`` (the same matching as :meth:`failures_for`)."""
        return [p for p in self.plugins if p.status == "disabled" and _may_provide(p.provenance, name)]

    def ops_summary(self) -> dict[str, list[str]]:
        return {op: self.names(op) for op in OPS}


#: What the core's extras install beside their plugin, per extra (``pip install
#: "veomni-ops[npu]"``): said with every install hint for that extra. Which plugin each extra
#: installs is read from the core's metadata (:func:`plugin_extras`).
EXTRA_NOTES: Mapping[str, str] = {
    "npu": (
        "the npu kernels are torch-npu's (Ascend's PyTorch adapter), which runs only on top of the Ascend CANN "
        "toolkit: install CANN and source its environment (source /usr/local/Ascend/ascend-toolkit/set_env.sh), "
        "then the torch-npu build that matches your torch (pip install torch-npu==<your torch version>, or pip "
        "install \"veomni-npu[torch-npu]\")"
    ),
}

@functools.lru_cache(maxsize=1)
def plugin_extras() -> Mapping[str, str]:
    """The core's extras that install one first-party plugin: ``{"liger": "veomni-liger", ...}``.

    Read from the installed core distribution's metadata (``Provides-Extra`` and
    ``Requires-Dist``, i.e. ``[project.optional-dependencies]`` of ``core/pyproject.toml``),
    so that the extras are declared in one place. Empty where the core is not installed as a
    distribution."""
    from packaging.requirements import Requirement

    try:
        dist = metadata.distribution(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return {}
    reqs = [Requirement(r) for r in dist.requires or ()]
    out: dict[str, str] = {}
    for extra in dist.metadata.get_all("Provides-Extra") or ():
        names = {canonical_distribution(r.name) for r in reqs
                 if r.marker is not None and r.marker.evaluate({"extra": extra})
                 and not r.marker.evaluate({"extra": ""})}
        if len(names) == 1 and names <= set(FIRST_PARTY_DISTRIBUTIONS):
            out[extra] = names.pop()
    return out


def first_party_extra(kernel: str) -> tuple[str, str] | None:
    """``(extra, distribution)`` of the first-party plugin a bare kernel name belongs to, by
    our naming rule: the name is the extra's (``liger``) or starts with it and ``_``
    (``flash_attention_4``, ``triton_batch_invariant``). None for any other name."""
    found = [(e, d) for e, d in plugin_extras().items() if kernel == e or kernel.startswith(e + "_")]
    return max(found, key=lambda ed: len(ed[0])) if found else None


def extra_of(distribution: str) -> str | None:
    """The core's extra that installs the first-party plugin ``distribution``, or None."""
    d = canonical_distribution(distribution)
    return next((e for e, dist in plugin_extras().items() if dist == d), None)


def _may_provide(prov: Provenance, name: str) -> bool:
    kernel, dist = split_name(name)
    mine = prov.qualifier
    if dist is not None:
        return mine == dist
    ep = canonical_distribution(prov.entry_point)
    guess = canonical_distribution(kernel)
    ours = first_party_extra(kernel)
    return guess in (ep, mine) or mine == f"veomni-{guess}" or (ours is not None and mine == ours[1])
