"""What an op's folder declares: :class:`OpDef`, and the light types it is made of.

Every ``veomni_ops/ops/<op>/__init__.py`` defines ``OP = OpDef(...)``: the op's table entry
(:class:`OpInfo`), its kernel contract (the hookspec), its legacy VeOmni values and what other
VeOmni values mean for it (:class:`DeviceChoice`, :class:`NotProvided`), its measured
compile-mode choices (:class:`Preference`) and, as ``"module:attr"`` strings relative to the
folder, its heavy parts (reference specs, binder, conformance harness, bench workloads, parallel
wrapper). Nothing here imports torch, and nothing here imports another module of the core.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OpInfo:
    """One op. ``variants``: the first is the default. ``config_field``: VeOmni's
    ``OpsImplementationConfig`` field for it (also an :class:`~veomni_ops.config.OpsConfig`
    field). ``features``: optional behaviours a kernel may honour beyond the op's contract
    (:data:`~veomni_ops.ops.FEATURES`). ``parallel``: parallel layouts a kernel may declare it
    runs under (:data:`~veomni_ops.ops.PARALLEL`)."""

    variants: tuple[str, ...]
    config_field: str
    features: tuple[str, ...] = ()
    parallel: tuple[str, ...] = ()


#: The CUDA capability every compile-mode preference was measured on (an H100): they apply there only.
MEASURED_ON = (9, 0)

#: Where the compile-mode measurements are (see :mod:`veomni_ops.compile_policy` for what each shows).
EVIDENCE = "benchmarks/results/h100-2026-11-24-compile-ablation"
#: The fused linear cross-entropy under compile (issue 13's kernel beside transformers + compile).
FLCE_EVIDENCE = "benchmarks/results/h100-2026-11-25-flce"
#: The whole step after the MoE kernels' speed-ups (experts grouped_mm vs triton under compile).
STEP_EVIDENCE = "benchmarks/results/h100-2026-11-25-step"


@dataclass(frozen=True)
class Preference:
    """A measured compile-mode choice: under ``torch.compile`` ``auto`` takes ``kernel`` for
    ``variant`` (see :mod:`veomni_ops.compile_policy`)."""

    kernel: str
    variant: str
    why: str
    evidence: str = EVIDENCE
    #: the device capability it was measured on, and the only one it applies to
    capability: tuple[int, int] = MEASURED_ON


#: Where VeOmni's config class lives (the file the ``arguments_types.py:N`` references name).
VEOMNI_SOURCE = "VeOmni d977449, veomni/arguments/arguments_types.py"


@dataclass(frozen=True)
class DeviceChoice:
    """The kernel a VeOmni value stands for: ``npu`` on an Ascend NPU, ``other`` on every other
    device (``None``: VeOmni refuses it there, and so does veomni-ops). ``why`` is VeOmni's rule,
    with its source. ``legacy``: a VeOmni spelling veomni-ops does not use (its loading warns)."""

    npu: str
    other: str | None
    why: str
    legacy: bool = True

    def on(self, device_type: str) -> str | None:
        return self.npu if device_type == "npu" else self.other


def gpu_default(npu: str, other: str, line: int, legacy: bool = True) -> DeviceChoice:
    """A VeOmni GPU default (at ``arguments_types.py:line``), which VeOmni rewrites to ``npu`` on an Ascend NPU."""
    return DeviceChoice(npu, other, f"VeOmni's GPU default, which VeOmni rewrites to {npu!r} on an Ascend NPU "
                                    f"({VEOMNI_SOURCE}:{line}, _NPU_DEFAULT_FALLBACK)", legacy)


@dataclass(frozen=True)
class NotProvided:
    """A VeOmni kernel veomni-ops does not provide: what it is in VeOmni (with its source), what
    it needs, and what to write instead. ``device``: only on this device type (``None``: anywhere)."""

    kernel: str
    needs: str
    instead: str
    device: str | None = None

    def describe(self) -> str:
        return (f"In VeOmni this is {self.kernel}; it needs {self.needs}. veomni-ops provides no such kernel: "
                f"write {self.instead}.")


@dataclass(frozen=True)
class OpWorkload:
    """One bench workload of an op, as its folder's ``bench`` module declares it (the preset it is
    in adds its name: :class:`veomni_ops.bench.workloads.Workload`). ``metric``: ``"bytes"`` or
    ``"flops"``; ``formula``: a key of the op's ``FORMULAS`` (default: the op's name);
    ``logits``: cross-entropy only, how its logits are drawn."""

    variant: str
    dtype: str
    metric: str
    shape: Mapping[str, int]
    formula: str = ""
    logits: str = ""


def load(ref: str, package: str) -> Any:
    """The object a ``"module:attr"`` string names; a module starting with ``.`` is relative to
    ``package`` (``".binder:BINDER"``). Without ``:attr``, the module itself."""
    mod, _, attr = ref.partition(":")
    module = importlib.import_module(mod, package if mod.startswith(".") else None)
    return getattr(module, attr) if attr else module


def conformance_class_name(op: str) -> str:
    """``rms_norm`` -> ``RmsNormConformance``: the name of the op's conformance base class."""
    return "".join(part.capitalize() for part in op.split("_")) + "Conformance"


@dataclass(frozen=True)
class PathMemory:
    """What one variant's path holds beyond the inputs every variant of the op takes, as a
    function of the op's shapes (bytes), and what that is in words. ``auto`` under a memory
    budget counts it toward each kernel of the variant (:class:`~veomni_ops.target.MemoryBudget`):
    ``cross_entropy``'s ``logits`` kernels take the ``[N, V]`` logits the head makes for them,
    which the ``fused_linear`` ones never hold."""

    bytes: Callable[[Mapping[str, int]], int]
    what: str


@dataclass(frozen=True)
class OpDef:
    """Everything the core knows about one op, as its folder declares it.

    ``name``: the op (and its folder's, its hook's name). ``order``: its place among the ops
    (resolution goes through them, and a plan lists them, in this order). ``contract``: the
    op's kernel contract, the docstring of its hook (:class:`veomni_ops.hookspecs.OpHookspecs`):
    the kernel's signature, layouts, dtypes, what backward produces, edge cases. ``package``:
    the folder's module (``__name__``), which the relative references below are resolved against.

    ``legacy``: legacy VeOmni values -> today's kernel names (accepted with a warning, see
    :data:`veomni_ops.config.LEGACY_VALUES`); ``legacy_notes``: what a legacy value meant
    beyond its kernel, said in its warning. ``compile_preferences``: device type -> the
    measured compile-mode choices, best first (:mod:`veomni_ops.compile_policy`).
    ``path_memory``: variant -> :class:`PathMemory`, what that variant's path holds beyond the
    inputs of the op's other variants (for ``auto`` under a memory budget). ``veomni_values``:
    VeOmni values whose kernel depends on the device -> :class:`DeviceChoice`
    (:data:`veomni_ops.veomni.DEVICE_VALUES`); ``veomni_not_provided``: VeOmni values veomni-ops
    has no kernel for -> :class:`NotProvided` (:data:`veomni_ops.veomni.NOT_PROVIDED`).

    The heavy parts, as ``"module:attr"`` (imported only when used): ``reference``, a function
    returning the core's own ``KernelSpec`` s for the op (registered by
    :mod:`veomni_ops.backends.reference`); ``binder``, its
    :class:`~veomni_ops.binding.place.Binder`; ``harness``, its conformance
    :class:`~veomni_ops.testing.cases.OpHarness`; ``bench``, its bench module (formulas,
    workloads, inputs: :mod:`veomni_ops.bench.workloads`); ``wrapper``, where a parallel layout
    wraps its kernel (``None``: never; :meth:`veomni_ops.parallel.runtime.ParallelRuntime.wrap_plan`).
    """

    name: str
    order: int
    info: OpInfo
    contract: str
    package: str
    legacy: Mapping[str, str] = field(default_factory=dict)
    legacy_notes: Mapping[str, str] = field(default_factory=dict)
    compile_preferences: Mapping[str, tuple[Preference, ...]] = field(default_factory=dict)
    path_memory: Mapping[str, PathMemory] = field(default_factory=dict)
    veomni_values: Mapping[str, DeviceChoice] = field(default_factory=dict)
    veomni_not_provided: Mapping[str, NotProvided] = field(default_factory=dict)
    reference: str = ".reference:specs"
    binder: str = ".binder:BINDER"
    harness: str = ".cases:HARNESS"
    bench: str = ".bench"
    wrapper: str | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name != self.name.lower():
            raise ValueError(f"op {self.name!r}: an op's name is a lower-case Python identifier (its hook's name)")
        if not self.info.variants:
            raise ValueError(f"op {self.name!r}: OpInfo.variants lists at least one variant (the first is the default)")
        if not isinstance(self.contract, str) or not self.contract.strip():
            raise ValueError(f"op {self.name!r}: its contract is the text of its kernel contract (the hook's docstring)")

    def part(self, which: str) -> Any:
        """The heavy part ``which`` (``"reference"``, ``"binder"``, ``"harness"``, ``"bench"``,
        ``"wrapper"``), imported now."""
        ref = getattr(self, which)
        if ref is None:
            raise LookupError(f"op {self.name!r} has no {which}")
        return load(ref, self.package)
