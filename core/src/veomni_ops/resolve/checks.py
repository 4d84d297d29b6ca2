"""Checking: can a kernel be used for a target? Metadata first (device, requirements, dtype,
backward, features, compile mode, parallel layout), then, where it matters, whether it imports.

:class:`OpRequest` is one op of a resolution: the variants the model accepts, the name the
config writes, and the :class:`~veomni_ops.target.Target` every candidate is checked against.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from importlib import metadata

from ..device import DeviceInfo, check_hardware, current_device, is_local
from ..discovery import strict_mode
from ..ops import op_def
from ..registry import RegisteredKernel, Registry
from ..spec import KernelSpec, SpecError
from ..target import GIB, Mode, Need, Target
from .load import import_failure, import_why, load_kernel, strict_import_error
from .refusal import Problem, Refusal, RefusalKind


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


def unmet_requirements(requires: Iterable[str]) -> tuple[str, ...]:
    """The requirements of ``requires`` (PEP 508) this machine's installed distributions do not satisfy."""
    return tuple(r for r in requires if requirement_problem(r) is not None)


def static_problem(spec: KernelSpec, device: DeviceInfo, dtype: str | None = None, training: bool = True,
                   features: Iterable[str] = (), compile: bool = False, parallel: Iterable[str] = (),
                   check_requires: bool = True) -> str | None:
    """Why ``spec`` cannot run here, checking metadata only (no import); ``None`` if it can.

    ``features``: what the model's places need the kernel to honour (see ``spec.FEATURES``);
    ``compile``: the model will run under ``torch.compile``; ``parallel``: what the job's
    parallel layout needs the kernel to run under (see ``spec.PARALLEL``: ``sp``, ``ep``);
    ``check_requires=False``: skip the ``requires`` check, for planning for another machine,
    whose installed packages this one cannot see. :func:`spec_problem` says it with its kind.
    """
    p = spec_problem(spec, device, dtype, training, features, compile, parallel, check_requires)
    return p.text if p is not None else None


def spec_problem(spec: KernelSpec, device: DeviceInfo, dtype: str | None = None, training: bool = True,
                 features: Iterable[str] = (), compile: bool = False, parallel: Iterable[str] = (),
                 check_requires: bool = True) -> Problem | None:
    """:func:`static_problem` with its :class:`RefusalKind`: the first check ``spec`` fails."""
    why = check_hardware(spec.hardware, device)
    if why:
        return Problem(RefusalKind.DEVICE, why)
    for r in spec.requires if check_requires else ():
        why = requirement_problem(r)
        if why:
            return Problem(RefusalKind.REQUIREMENT, why)
    if dtype is not None and dtype not in spec.dtypes:
        return Problem(RefusalKind.DTYPE, f"does not support dtype {dtype} (supports {', '.join(spec.dtypes)})")
    if training and not spec.supports_backward:
        return Problem(RefusalKind.NO_BACKWARD, "has no backward, and training needs one")
    missing = sorted(set(features) - set(spec.features))
    if missing:
        return Problem(RefusalKind.FEATURE,
                       f"does not honour {', '.join(missing)}, which the model needs here "
                       f"(its spec declares: {', '.join(spec.features) or 'no optional features'})")
    if compile and not spec.supports_compile:
        return Problem(RefusalKind.COMPILE, "does not run under torch.compile (its spec says supports_compile=False), "
                                            "and this is compile mode")
    missing = sorted(set(parallel) - set(spec.parallel))
    if missing:
        return Problem(RefusalKind.PARALLEL,
                       f"cannot run under parallel {', '.join(missing)}, which the job's parallel layout needs "
                       f"(its spec declares: parallel={list(spec.parallel)})")
    return None


def kernel_problem(rk: RegisteredKernel, device: DeviceInfo | str | None = None, *, dtype: str | None = None,
                   training: bool = True, features: Iterable[str] = (), compile: bool = False,
                   probe: bool | None = None, registry: Registry | None = None,
                   check_requires: bool | None = None) -> str | None:
    """Why ``rk`` cannot be used here, ``None`` if it can: :func:`static_problem`, and then
    whether its kernel imports. ``probe`` (default: the device is this machine's) imports the
    factory to find out; otherwise only a failure already seen in this process counts. Under
    ``VEOMNI_OPS_STRICT=1`` an import failure raises :class:`~veomni_ops.discovery.PluginLoadError`.
    This is what ``veomni-ops plugins`` reports as "usable here". ``check_requires`` (default: the
    device is this machine's, as in ``resolve``): see :func:`static_problem`."""
    dev = current_device(device)
    here = is_local(dev)
    check_requires = here if check_requires is None else check_requires
    why = static_problem(rk.spec, dev, dtype, training, features, compile, check_requires=check_requires)
    if why:
        return why
    if probe is None:
        probe = here
    if probe:
        try:
            load_kernel(rk)
        except Exception as e:
            if strict_mode():
                name = registry.name_of(rk) if registry is not None else rk.spec.name
                raise strict_import_error(rk, e, name) from e
            return import_why(e)
        return None
    failed = import_failure(rk)
    return import_why(failed) if failed is not None else None


@dataclass(frozen=True)
class OpRequest:
    """What resolving one op needs: the op, what the model needs of it (:class:`~veomni_ops.target.Need`:
    the variants it accepts, preferred first), the name the config writes for it (or ``auto``),
    and the :class:`~veomni_ops.target.Target` a kernel must satisfy (device, dtype, mode, the
    op's features and parallel layout). ``load``: import the chosen kernel; ``check_requires``:
    see :func:`static_problem`."""

    op: str
    need: Need
    name: str
    target: Target
    load: bool = True
    check_requires: bool = True

    @property
    def variants(self) -> tuple[str, ...]:
        return self.need.variants

    @property
    def device(self) -> DeviceInfo:
        return self.target.device

    @property
    def mode(self) -> Mode:
        return self.target.mode

    @property
    def features(self) -> frozenset[str]:
        return self.target.features.get(self.op, frozenset())

    @property
    def parallel(self) -> frozenset[str]:
        return self.target.parallel.get(self.op, frozenset())

    def named(self, name: str) -> OpRequest:
        """The same request for the kernel ``name``."""
        return replace(self, name=name)

    def problem(self, spec: KernelSpec) -> Problem | None:
        return spec_problem(spec, self.device, self.target.dtype, self.mode.training, self.features, self.mode.compile,
                            self.parallel, self.check_requires)

    def extra_memory(self, spec: KernelSpec) -> int | None:
        """Bytes ``spec`` needs beyond its inputs at the target's shapes for this op, with what its
        variant's path holds beyond the op's other variants (:class:`~veomni_ops.ops.base.PathMemory`);
        ``None`` where the target has no memory budget, no shapes for the op, or nothing is known."""
        budget = self.target.memory
        shapes = budget.shapes.get(self.op) if budget is not None else None
        path = op_def(self.op).path_memory.get(spec.variant)
        if shapes is None or (spec.extra_memory is None and path is None):
            return None
        try:
            own = int(spec.extra_memory(shapes)) if spec.extra_memory is not None else 0
            return own + (int(path.bytes(shapes)) if path is not None else 0)
        except Exception as e:
            raise SpecError(f"kernel {spec.name!r} ({self.op}/{spec.variant}): its extra memory could not be "
                            f"computed for the shapes {dict(shapes)}: {type(e).__name__}: {e}; fix the formula, or "
                            f"give the MemoryBudget the shapes it reads") from e

    def memory_problem(self, spec: KernelSpec) -> str | None:
        """Why ``auto`` passes over ``spec`` for memory: what it needs beyond its inputs is more than
        the target's budget has free. ``None`` where it fits or nothing is known."""
        need = self.extra_memory(spec)
        budget = self.target.memory
        if need is None or budget is None or need <= budget.free_bytes:
            return None
        tokens = budget.shapes[self.op].get("tokens")
        at = f" at {tokens} tokens" if tokens is not None else ""
        path = op_def(self.op).path_memory.get(spec.variant)
        with_path = f", {path.what} included" if path is not None else ""
        return f"needs {need / GIB:.2f} GiB beyond its inputs{at}{with_path}; {budget.describe()}"

    def usable(self, rk: RegisteredKernel) -> bool:
        """Passes the checks, and its kernel did not fail to import in this process."""
        return self.problem(rk.spec) is None and import_failure(rk) is None

    def usable_names(self, reg: Registry) -> tuple[str, ...]:
        """What a config could write here for the preferred variant (a contested name qualified)."""
        return tuple(reg.name_of(k) for k in reg.for_op(self.op, self.variants[0]) if self.usable(k))

    def refuse(self, reg: Registry, kind: RefusalKind, why: str, how: str, cause: BaseException | None = None,
               available: tuple[str, ...] | None = None) -> Refusal:
        """A :class:`~.explain.Refusal` of this request; ``available`` defaults to :meth:`usable_names`."""
        avail = self.usable_names(reg) if available is None else available
        return Refusal(kind, self.op, self.name, self.variants, why, avail, how, cause)
