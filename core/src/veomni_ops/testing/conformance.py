"""Per-op conformance test classes for backend authors, and the engine the pytest plugin shares.

Subclass one class per op your backend implements and name your kernel::

    # tests/test_conformance.py of your distribution
    from veomni_ops.testing import RmsNormConformance, SwigluConformance

    class TestSwiglu(SwigluConformance):
        kernel_name = "mine"

    class TestRmsNorm(RmsNormConformance):
        kernel_name = "mine"
        variants = ("standard",)        # default: every variant "mine" registers for the op

pytest then runs, for every variant, dtype (those the spec declares) and case of the op, a
check of the kernel against the core's eager reference evaluated in float64, forward and
backward, within the spec's tolerance; plus ``test_registered`` (the name is registered
for the op, through the installed entry point). A kernel that cannot run on this machine
(hardware, missing requirement) is skipped with the reason. The class needs no pytest
plugin: it parametrises itself (``pytest_generate_tests``). With the kit's plugin loaded,
``--veomni-ops-size``, ``--veomni-ops-seed`` and ``--veomni-ops-dtype`` apply to it.

Class attributes: ``kernel_name`` (required), ``variants``, ``dtypes``, ``size`` (``small``
or ``full``; default: small on the CPU and under ``TRITON_INTERPRET=1``, else full),
``seed``, ``plugins`` (spec modules — import paths or module objects — to load besides the
installed entry points, e.g. to test a backend before it is installed).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from ..ops import OP_DEFS, conformance_class_name
from ..registry import Registry
from .compiles import ConformanceFailure, check_compiles


@dataclass(frozen=True)
class CaseParam:
    """One generated test: kernel ``(op, variant, name)``, dtype and case of the op."""

    op: str
    variant: str
    name: str
    dtype: str
    case: str
    index: int  # position of the case in the op's list (it determines the case's seed)

    @property
    def id(self) -> str:
        return f"{self.variant}-{self.dtype}-{self.case}"


_registries: dict[tuple[Any, ...], Registry] = {}
_prepared: dict[tuple[Any, ...], Any] = {}


def registry_with(plugins: Sequence[Any] = ()) -> Registry:
    """The installed plugins plus ``plugins`` (import paths or modules), built once per set."""
    from importlib import metadata

    from ..discovery import build_registry, discover
    from ..hookspecs import ENTRY_POINT_GROUP

    if not plugins:
        return discover()
    key = tuple(p if isinstance(p, str) else id(p) for p in plugins)
    reg = _registries.get(key)
    if reg is None:
        import importlib

        installed = {ep.value.split(":")[0] for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
        mods = []
        for p in plugins:
            if isinstance(p, str):
                if p in installed:
                    continue  # the installed entry point already provides it
                mods.append((p.split(".")[0].replace("_", "-"), importlib.import_module(p)))
            else:
                mods.append((getattr(p, "__name__", "plugin").split(".")[0].replace("_", "-"), p))
        reg = _registries[key] = build_registry(mods)
    return reg


def case_params(registry: Registry, op: str, name: str, *, variants: Sequence[str] | None = None,
                dtypes: Sequence[str] | None = None, size: str) -> list[CaseParam]:
    """Every (variant, dtype, case) to test for kernel ``name`` of ``op``."""
    from .cases import harness
    from .prepare import kernel_dtypes

    h = harness(op)
    out = []
    for rk in registry.for_op(op):
        s = rk.spec
        if s.name != name or (variants is not None and s.variant not in variants):
            continue
        for dtype in kernel_dtypes(s, dtypes):
            for i, case in enumerate(h.cases(s.variant, size)):
                out.append(CaseParam(op, s.variant, s.name, dtype, case.name, i))
    return out


def resolve_size(size: str | None) -> str:
    if size:
        return size
    from ..device import current_device
    from .execution import default_size, execution_device

    try:
        return default_size(execution_device(current_device()))
    except Exception:
        return "small"


def run_param(registry: Registry, p: CaseParam, *, size: str, seed: int) -> None:
    """Run one generated test: returns on a pass, ``pytest.skip`` where the kernel cannot run
    here (or refuses an optional input form), raises :class:`ConformanceFailure` otherwise."""
    from .case_check import check_case
    from .cases import harness
    from .execution import cpu_threads_for
    from .prepare import Unusable, case_seed, prepare

    key = (id(registry), p.op, p.variant, p.name)
    got = _prepared.get(key)
    if got is None:
        try:
            got = prepare(registry, p.op, p.variant, p.name)
        except Unusable as e:
            got = e
        except LookupError as e:
            raise ConformanceFailure(str(e)) from None
        _prepared[key] = got
    if isinstance(got, Unusable):
        pytest.skip(f"{p.op}/{p.variant} {p.name}: {got}")
    rk, fn, device = got
    h = harness(p.op)
    case = h.cases(p.variant, size)[p.index]
    with cpu_threads_for(device, size):
        res = check_case(fn, rk.spec, h, p.variant, case, p.dtype, device, seed=case_seed(seed, p.index))
    if res.status == "unsupported":
        pytest.skip(f"{p.op}/{p.variant} {p.name} {res.describe()}")
    for note in res.notes:
        warnings.warn(f"{p.op}/{p.variant} {p.name} [{p.dtype}, {p.case}]: {note}", stacklevel=2)
    if not res.ok:
        lines = [
            f"{p.op}/{p.variant} kernel {p.name!r} ({rk.provenance.distribution} {rk.provenance.version}) "
            f"on {device}, {size} shapes, seed {seed}:",
            f"  {res.describe()}",
            f"  case: {case.about}" if case.about else "",
        ]
        lines += [f"    {c.name}: error {c.ratio:.3g} (max |a-b| {c.max_abs:.3g}, unit scale {c.scale:g})"
                  for c in res.comparisons]
        raise ConformanceFailure("\n".join(x for x in lines if x))


def _option(config: Any, name: str) -> Any:
    try:
        return config.getoption(name)
    except (ValueError, AttributeError):  # the kit's plugin is not loaded
        return None


class ConformanceBase:
    """Base of the per-op classes; subclass one of those, not this."""

    op: ClassVar[str] = ""
    kernel_name: ClassVar[str | None] = None
    variants: ClassVar[tuple[str, ...] | None] = None
    dtypes: ClassVar[tuple[str, ...] | None] = None
    size: ClassVar[str | None] = None
    seed: ClassVar[int] = 0
    plugins: ClassVar[tuple[Any, ...]] = ()

    # pytest calls this for each test function of the class (no plugin needed).
    def pytest_generate_tests(self, metafunc: Any) -> None:
        if "conformance_case" not in metafunc.fixturenames:
            return
        cls = type(self)
        if not cls.op or not cls.kernel_name:
            metafunc.parametrize("conformance_case", [], ids=[])
            return
        size = cls._size(metafunc.config)
        dtypes = _option(metafunc.config, "veomni_ops_dtype") or cls.dtypes
        params = case_params(registry_with(cls.plugins), cls.op, cls.kernel_name, variants=cls.variants,
                             dtypes=dtypes, size=size)
        if not params:
            # Not registered (or no variant/dtype left): one test that fails and says why.
            params = [None]  # type: ignore[list-item]
        metafunc.parametrize("conformance_case", params,
                             ids=[p.id if p is not None else "not-registered" for p in params])

    @classmethod
    def _size(cls, config: Any) -> str:
        return resolve_size(_option(config, "veomni_ops_size") or cls.size)

    @classmethod
    def _seed(cls, config: Any) -> int:
        s = _option(config, "veomni_ops_seed")
        return cls.seed if s is None else s

    def test_registered(self) -> None:
        """The kernel name is registered for this op (through the installed plugins)."""
        cls = type(self)
        if not cls.kernel_name:
            pytest.fail(f"{cls.__name__}: set kernel_name = '<your kernel name>'")
        reg = registry_with(cls.plugins)
        mine = [rk for rk in reg.for_op(cls.op) if rk.spec.name == cls.kernel_name]
        if not mine:
            fails = "; ".join(f.describe() for f in reg.failures) or "none"
            pytest.fail(f"no kernel {cls.kernel_name!r} is registered for {cls.op} "
                        f"(registered: {', '.join(reg.names(cls.op)) or 'none'}; plugin load failures: {fails}). "
                        "Is the distribution installed, with its entry point in group 'veomni_ops.backends'?")
        if cls.variants is not None:
            missing = set(cls.variants) - {rk.spec.variant for rk in mine}
            if missing:
                pytest.fail(f"{cls.kernel_name!r} does not register variant(s) {sorted(missing)} of {cls.op}")

    def test_compiles(self) -> None:
        """Every variant whose spec says ``supports_compile`` traces fullgraph, forward and backward."""
        cls = type(self)
        reg = registry_with(cls.plugins)
        mine = [rk for rk in reg.for_op(cls.op) if rk.spec.name == cls.kernel_name
                and (cls.variants is None or rk.spec.variant in cls.variants)]
        if not mine:
            pytest.skip(f"no kernel {cls.kernel_name!r} registered for {cls.op} (test_registered says why)")
        skipped = [why for rk in mine if (why := check_compiles(reg, cls.op, rk.spec.variant, cls.kernel_name))]  # type: ignore[arg-type]
        if len(skipped) == len(mine):
            pytest.skip("; ".join(skipped))

    def test_conformance(self, conformance_case: CaseParam | None, request: Any) -> None:
        cls = type(self)
        if conformance_case is None:
            reg = registry_with(cls.plugins)
            pytest.fail(f"nothing to check: no kernel {cls.kernel_name!r} for {cls.op} with variants "
                        f"{cls.variants or 'any'} and dtypes {cls.dtypes or 'any'} is registered "
                        f"(registered for {cls.op}: {', '.join(reg.names(cls.op)) or 'none'})")
        run_param(registry_with(cls.plugins), conformance_case, size=cls._size(request.config),
                  seed=cls._seed(request.config))


def _conformance_classes() -> dict[str, type[ConformanceBase]]:
    """One base class per op (:data:`veomni_ops.ops.OP_DEFS`): ``RmsNormConformance`` for
    ``rms_norm``, ... (:func:`veomni_ops.ops.conformance_class_name`)."""
    out = {}
    for op in OP_DEFS:
        name = conformance_class_name(op)
        doc = f"The conformance tests of one ``{op}`` kernel: subclass it and set ``kernel_name``."
        out[name] = type(name, (ConformanceBase,), {"op": op, "__module__": __name__, "__doc__": doc})
    return out


#: The per-op classes by name, generated from the op folders; each is also a name of this module.
CONFORMANCE_CLASSES: dict[str, type[ConformanceBase]] = _conformance_classes()
globals().update(CONFORMANCE_CLASSES)
