"""What a backend declares about one kernel: :class:`KernelSpec` and its parts.

Spec objects are small frozen dataclasses that validate and normalise themselves on
construction, so a plugin's mistake surfaces where the plugin made it. Nothing here
imports torch: spec modules must stay cheap to import (see ``discovery``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Union

# The ops, their variants, features and parallel layouts (one table, veomni_ops.ops), as spec has always named them.
from .ops import FEATURES, OPS, PARALLEL

#: Device types a hardware requirement may name. ``any`` matches every device.
DEVICE_TYPES = ("cuda", "rocm", "npu", "xpu", "mps", "cpu", "any")

#: dtype names a spec may declare (strings, so spec modules need not import torch).
DTYPES = ("float32", "bfloat16", "float16", "float64")

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")

Factory = Union[str, Callable[[], Callable[..., Any]]]


class SpecError(ValueError):
    """A KernelSpec (or one of its parts) is malformed."""


#: Separator of a qualified kernel reference: ``liger@veomni-liger`` is the kernel ``liger``
#: as registered by the distribution ``veomni-liger``.
QUALIFIER = "@"

_DIST_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def canonical_distribution(name: str) -> str:
    """A distribution name in its canonical form (PEP 503): ``Veomni_Liger`` -> ``veomni-liger``."""
    return re.sub(r"[-_.]+", "-", str(name).strip()).lower()


def _normalize_kernel_name(name: str, what: str = "kernel name") -> str:
    out = re.sub(r"[\s\-.]+", "_", name.strip().lower())
    if not _NAME_RE.match(out):
        raise SpecError(
            f"{what} {name!r} is not valid: after normalisation ({out!r}) it must start with a "
            "letter and contain only letters, digits and underscores"
        )
    return out


def normalize_name(name: str) -> str:
    """Canonical form of what a config names: a kernel name, or a *qualified* one.

    ``"Flash-Attention-4"`` and ``"flash_attention_4"`` name the same kernel: lower case,
    ``-``/``.``/spaces become ``_``. ``"liger@Veomni_Liger"`` is the kernel ``liger`` of the
    distribution ``veomni-liger`` (:data:`QUALIFIER`); the distribution part is normalised as
    PEP 503 does (``liger@veomni-liger``). A qualified name is how a config selects a kernel
    whose name two installed distributions both register (see :mod:`veomni_ops.registry`).
    A :class:`KernelSpec` name is never qualified: the registry adds the distribution.
    """
    if not isinstance(name, str):
        raise SpecError(f"kernel name must be a string, got {type(name).__name__} {name!r}")
    kernel, sep, dist = name.partition(QUALIFIER)
    if not sep:
        return _normalize_kernel_name(name)
    try:
        out = _normalize_kernel_name(kernel)
    except SpecError:
        raise SpecError(
            f"kernel name {name!r} is not valid: before {QUALIFIER!r} comes a kernel name, which must start with "
            "a letter and contain only letters, digits, '_', '-' and '.'"
        ) from None
    canon = canonical_distribution(dist)
    if not _DIST_RE.match(canon):
        raise SpecError(
            f"kernel name {name!r} is not valid: after {QUALIFIER!r} comes the distribution that registers the "
            f"kernel (e.g. 'liger{QUALIFIER}veomni-liger'), and {dist.strip()!r} is not a distribution name"
        )
    return f"{out}{QUALIFIER}{canon}"


def split_name(ref: str) -> tuple[str, str | None]:
    """``"liger@veomni-liger"`` -> ``("liger", "veomni-liger")``; ``"liger"`` -> ``("liger", None)``.

    The argument is normalised first (:func:`normalize_name`)."""
    kernel, sep, dist = normalize_name(ref).partition(QUALIFIER)
    return kernel, (dist if sep else None)


def qualified_name(name: str, distribution: str) -> str:
    """What a config writes to select kernel ``name`` of ``distribution``: ``name@distribution``."""
    return f"{_normalize_kernel_name(name)}{QUALIFIER}{canonical_distribution(distribution)}"


def _parse_capability(value: Any, what: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, str):
        m = re.fullmatch(r"(?:sm_?)?(\d+)[.](\d+)|sm_?(\d+)(\d)", value.strip().lower())
        if not m:
            raise SpecError(f"{what} {value!r} is not a compute capability; write e.g. (9, 0) or '9.0'")
        major, minor = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        return int(major), int(minor)
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return int(value[0]), int(value[1])
    raise SpecError(f"{what} {value!r} is not a compute capability; write e.g. (9, 0) or '9.0'")


@dataclass(frozen=True)
class HardwareRequirement:
    """Where a kernel can run.

    ``device_types``: any of :data:`DEVICE_TYPES`; ``("any",)`` runs everywhere.
    ``min_capability`` / ``max_capability``: inclusive CUDA/ROCm compute-capability range,
    e.g. ``(9, 0)`` for Hopper only; ``None`` leaves that end open. A capability bound on a
    device type that has none (``cpu``, ``npu``) is ignored for that type.
    """

    device_types: tuple[str, ...] = ("any",)
    min_capability: tuple[int, int] | None = None
    max_capability: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        types = self.device_types
        if isinstance(types, str):
            types = (types,)
        types = tuple(str(t).strip().lower() for t in types)
        if not types:
            raise SpecError("HardwareRequirement.device_types is empty; use ('any',) to run everywhere")
        for t in types:
            if t not in DEVICE_TYPES:
                raise SpecError(f"unknown device type {t!r} in HardwareRequirement; known: {', '.join(DEVICE_TYPES)}")
        object.__setattr__(self, "device_types", types)
        lo = _parse_capability(self.min_capability, "min_capability")
        hi = _parse_capability(self.max_capability, "max_capability")
        if lo and hi and lo > hi:
            raise SpecError(f"min_capability {lo} is above max_capability {hi}")
        object.__setattr__(self, "min_capability", lo)
        object.__setattr__(self, "max_capability", hi)

    def describe(self) -> str:
        types = "/".join(self.device_types)
        cap = ""
        if self.min_capability or self.max_capability:
            lo = "%d.%d" % self.min_capability if self.min_capability else ""
            hi = "%d.%d" % self.max_capability if self.max_capability else ""
            cap = f" sm {lo}..{hi}" if lo != hi else f" sm {lo}"
        return types + cap

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_types": list(self.device_types),
            "min_capability": list(self.min_capability) if self.min_capability else None,
            "max_capability": list(self.max_capability) if self.max_capability else None,
        }


@dataclass(frozen=True)
class Tolerance:
    """Largest accepted difference from the float64 reference: ``|a-b| <= atol + rtol*|b|``."""

    atol: float
    rtol: float

    def __post_init__(self) -> None:
        for k in ("atol", "rtol"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise SpecError(f"Tolerance.{k} must be a non-negative number, got {v!r}")
            object.__setattr__(self, k, float(v))


#: Tolerances used when a spec declares none for a dtype (fp32 math, cast at the end).
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(1e-10, 1e-8),
    "float32": Tolerance(1e-5, 1e-4),
    "bfloat16": Tolerance(2e-2, 2e-2),
    "float16": Tolerance(2e-3, 2e-3),
}

# Named tolerance presets for KernelSpec.tolerances, so that a backend declares which kind of
# arithmetic its kernel does instead of restating numbers. A kernel whose error was measured
# wider (grouped GEMMs with atomics, TF32) declares its own table next to the reason.

#: fp32 math inside the kernel, one or two roundings to the input dtype at the end (norms,
#: RoPE, SwiGLU, a cross-entropy over given logits): :data:`DEFAULT_TOLERANCES` without float64.
ELEMENTWISE: Mapping[str, Tolerance] = {d: DEFAULT_TOLERANCES[d] for d in ("float32", "bfloat16", "float16")}

#: One GEMM in the input dtype before fp32 math, and reductions over every token (a fused
#: linear cross-entropy: logits from ``hidden @ weight.T``, ``dW`` summed over all tokens).
MATMUL: Mapping[str, Tolerance] = {
    "float32": Tolerance(1e-4, 1e-4),
    "bfloat16": Tolerance(2e-2, 2e-2),
    "float16": Tolerance(5e-3, 5e-3),
}


@dataclass(frozen=True)
class KernelSpec:
    """One kernel for one variant of one op, as a backend declares it.

    Fields:
        name: what a user writes in the config (``rms_norm_implementation: liger``).
            Normalised (:func:`normalize_name`).
        op / variant: one of :data:`OPS` and one of that op's variants.
        factory: how to get the kernel, imported only once resolution accepts the spec.
            Either ``"package.module:attr"`` (the attribute *is* the kernel callable) or a
            zero-argument callable that imports what it needs and returns the kernel.
        hardware: where it runs (:class:`HardwareRequirement`).
        requires: distribution requirements checked from installed metadata before any
            import, e.g. ``("liger-kernel>=0.6.0",)``.
        supports_backward: the kernel is differentiable as the op contract says.
        supports_compile: ``torch.compile(fullgraph=True)`` traces through it.
        dtypes: dtype names it accepts (``"bfloat16"``, ...).
        priority: rank for ``auto`` (higher wins); the core's eager reference is 0.
        tolerances: per dtype name, the :class:`Tolerance` the conformance checks use;
            dtypes not listed use :data:`DEFAULT_TOLERANCES`.
        description: one line for humans.
        install_hint: what to run to get its requirements, shown in refusals.
        features: optional behaviours it honours (:data:`FEATURES` of its op), e.g.
            ``("softcap", "sliding_window")`` for an attention kernel.
        parallel: parallel layouts it runs under (:data:`PARALLEL` of its op): ``("sp",)``
            for an attention kernel that can run under Ulysses sequence parallelism,
            ``("ep",)`` for an experts kernel that can run expert-parallel. A layout that
            needs one refuses kernels that do not declare it.
        extra_memory: bytes the kernel allocates beyond its inputs and the gradients it returns
            (the peak of one training call), as a function of the op's shapes (a mapping of
            names to ints; ``cross_entropy`` ``fused_linear``: ``tokens``, ``hidden``, ``vocab``,
            ``itemsize``); ``None``: unknown. ``auto`` passes over a kernel whose extra memory
            exceeds the device memory free for the job (:class:`~veomni_ops.target.MemoryBudget`);
            a kernel with ``None`` is never passed over for memory.
    """

    name: str
    op: str
    variant: str
    factory: Factory
    hardware: HardwareRequirement = field(default_factory=HardwareRequirement)
    requires: tuple[str, ...] = ()
    supports_backward: bool = True
    supports_compile: bool = False
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    priority: int = 0
    tolerances: Any = ()
    description: str = ""
    install_hint: str = ""
    features: tuple[str, ...] = ()
    parallel: tuple[str, ...] = ()
    extra_memory: Callable[[Mapping[str, int]], int] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise SpecError(f"kernel name must be a string, got {type(self.name).__name__} {self.name!r}")
        # Never qualified: the registry records the distribution (provenance) itself.
        object.__setattr__(self, "name", _normalize_kernel_name(self.name))
        if self.op not in OPS:
            raise SpecError(f"kernel {self.name!r}: unknown op {self.op!r}; known ops: {', '.join(OPS)}")
        if self.variant not in OPS[self.op]:
            raise SpecError(
                f"kernel {self.name!r}: op {self.op!r} has no variant {self.variant!r}; "
                f"its variants are: {', '.join(OPS[self.op])}"
            )
        f = self.factory
        if isinstance(f, str):
            mod, sep, attr = f.partition(":")
            if not sep or not mod or not attr or " " in f:
                raise SpecError(
                    f"kernel {self.name!r} ({self.op}/{self.variant}): factory {f!r} must be 'package.module:attr'"
                )
        elif not callable(f):
            raise SpecError(
                f"kernel {self.name!r} ({self.op}/{self.variant}): factory must be 'module:attr' or a callable, "
                f"got {type(f).__name__}"
            )
        if not isinstance(self.hardware, HardwareRequirement):
            raise SpecError(f"kernel {self.name!r}: hardware must be a HardwareRequirement, got {self.hardware!r}")
        req = self.requires
        if isinstance(req, str):
            req = (req,)
        req = tuple(req)
        for r in req:
            _parse_requirement(r, self.name)
        object.__setattr__(self, "requires", req)
        dts = (self.dtypes,) if isinstance(self.dtypes, str) else tuple(self.dtypes)
        for d in dts:
            if d not in DTYPES:
                raise SpecError(f"kernel {self.name!r}: unknown dtype {d!r}; known: {', '.join(DTYPES)}")
        if not dts:
            raise SpecError(f"kernel {self.name!r}: dtypes is empty")
        object.__setattr__(self, "dtypes", dts)
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise SpecError(f"kernel {self.name!r}: priority must be an int, got {self.priority!r}")
        tol = self.tolerances
        items = tol.items() if isinstance(tol, Mapping) else tuple(tol)
        norm = []
        for d, t in items:
            if d not in DTYPES:
                raise SpecError(f"kernel {self.name!r}: tolerance for unknown dtype {d!r}")
            if isinstance(t, (tuple, list)):
                t = Tolerance(*t)
            if not isinstance(t, Tolerance):
                raise SpecError(f"kernel {self.name!r}: tolerance for {d} must be a Tolerance or (atol, rtol)")
            norm.append((d, t))
        object.__setattr__(self, "tolerances", tuple(sorted(norm)))
        object.__setattr__(self, "features", _declared(self, self.features, FEATURES, "feature"))
        object.__setattr__(self, "parallel", _declared(self, self.parallel, PARALLEL, "parallel mode"))
        for b in ("supports_backward", "supports_compile"):
            if not isinstance(getattr(self, b), bool):
                raise SpecError(f"kernel {self.name!r}: {b} must be True or False")
        if self.extra_memory is not None and not callable(self.extra_memory):
            raise SpecError(
                f"kernel {self.name!r} ({self.op}/{self.variant}): extra_memory must be a function of the op's "
                f"shapes returning bytes (e.g. lambda shapes: 4 * shapes['vocab'] * shapes['hidden']) or None, "
                f"got {type(self.extra_memory).__name__} {self.extra_memory!r}"
            )

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.op, self.variant, self.name)

    def tolerance(self, dtype: str) -> Tolerance:
        """The tolerance for ``dtype`` (a name such as ``"bfloat16"``, or a torch dtype)."""
        dtype = str(dtype).removeprefix("torch.")
        for d, t in self.tolerances:
            if d == dtype:
                return t
        return DEFAULT_TOLERANCES[dtype]

    def factory_repr(self) -> str:
        f = self.factory
        return f if isinstance(f, str) else _callable_repr(f)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op": self.op,
            "variant": self.variant,
            "factory": self.factory_repr(),
            "hardware": self.hardware.to_dict(),
            "requires": list(self.requires),
            "supports_backward": self.supports_backward,
            "supports_compile": self.supports_compile,
            "dtypes": list(self.dtypes),
            "priority": self.priority,
            "tolerances": {d: [t.atol, t.rtol] for d, t in self.tolerances},
            "features": list(self.features),
            "parallel": list(self.parallel),
            "extra_memory": _callable_repr(self.extra_memory) if self.extra_memory is not None else None,
            "description": self.description,
        }


def _callable_repr(f: Callable[..., Any]) -> str:
    return f"{getattr(f, '__module__', '?')}:{getattr(f, '__qualname__', repr(f))}"


class SpecDefaults:
    """What the kernels of one backend share, so that its ``specs.py`` is a list of declarations.

    Keyword arguments: any :class:`KernelSpec` field but ``op``, ``variant``, ``factory`` and
    ``description`` (those are each kernel's own), plus ``kernels``: the package the factories
    live in. A field not given keeps :class:`KernelSpec`'s default. :meth:`spec` declares one
    kernel::

        _TRITON = SpecDefaults(name="triton", kernels="veomni_triton.kernels", hardware=_CUDA_SM80,
                               requires=("triton>=3.0",), supports_compile=True, priority=30,
                               tolerances=ELEMENTWISE, install_hint='pip install "veomni-ops[triton]"')

        @hookimpl
        def swiglu() -> list[KernelSpec]:
            return [_TRITON.spec("swiglu", "standard", "swiglu:silu_mul", "Triton silu(gate) * up, fused")]
    """

    def __init__(self, *, kernels: str = "", **defaults: Any) -> None:
        _check_shared_fields(defaults, "SpecDefaults")
        self.kernels = kernels
        self.defaults: dict[str, Any] = defaults

    def spec(self, op: str, variant: str, factory: Factory, description: str = "", **overrides: Any) -> KernelSpec:
        """One :class:`KernelSpec`: these defaults, then ``overrides`` (the same fields).

        A string ``factory`` is relative to ``kernels`` (``"rms_norm:rms_norm_standard"`` ->
        ``"veomni_triton.kernels.rms_norm:rms_norm_standard"``). A tolerance table given as a
        mapping keeps only the dtypes the kernel takes, so one preset serves kernels that take
        fewer dtypes (``dtypes=("bfloat16", "float16")`` with :data:`MATMUL`).
        """
        _check_shared_fields(overrides, "SpecDefaults.spec")
        values = {**self.defaults, **overrides}
        if isinstance(factory, str) and self.kernels:
            factory = f"{self.kernels}.{factory}"
        tol = values.get("tolerances")
        if isinstance(tol, Mapping):
            dtypes = values.get("dtypes", KernelSpec.__dataclass_fields__["dtypes"].default)
            dtypes = (dtypes,) if isinstance(dtypes, str) else tuple(dtypes)
            values["tolerances"] = {d: t for d, t in tol.items() if d in dtypes}
        return KernelSpec(op=op, variant=variant, factory=factory, description=description, **values)

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.defaults.items())
        return f"SpecDefaults(kernels={self.kernels!r}, {given})"


def _check_shared_fields(given: Mapping[str, Any], what: str) -> None:
    own = ("op", "variant", "factory", "description")
    shared = [f.name for f in fields(KernelSpec) if f.name not in own]
    unknown = sorted(set(given) - set(shared))
    if unknown:
        raise SpecError(
            f"{what}: unknown field(s) {', '.join(unknown)}; a backend's kernels share these KernelSpec fields: "
            f"{', '.join(shared)} (op, variant, factory and description are each kernel's own: .spec() arguments)"
        )


def _declared(spec: KernelSpec, value: Any, table: Mapping[str, tuple[str, ...]], what: str) -> tuple[str, ...]:
    """``value`` (a name or names) checked against ``table[spec.op]``, sorted and deduplicated."""
    names = (value,) if isinstance(value, str) else tuple(value)
    for n in names:
        if n not in table.get(spec.op, ()):
            known = ", ".join(table.get(spec.op, ())) or "none"
            raise SpecError(f"kernel {spec.name!r}: unknown {what} {n!r} for op {spec.op}; known: {known}")
    return tuple(sorted(set(names)))


def _parse_requirement(text: str, kernel: str):
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(text)
    except (InvalidRequirement, TypeError) as e:
        raise SpecError(f"kernel {kernel!r}: requirement {text!r} is not a valid requirement string ({e})") from None
