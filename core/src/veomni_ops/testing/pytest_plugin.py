"""pytest plugin of the conformance kit (entry point ``pytest11: veomni_ops``).

    pytest --veomni-ops-backend mine                  conformance tests for every kernel named/provided by "mine"
    pytest --veomni-ops-backend mine --veomni-ops-op swiglu
    pytest --veomni-ops-backend mine --veomni-ops-plugin my_backend.specs   (not installed yet)

With ``--veomni-ops-backend`` the plugin adds one test per kernel, variant, dtype and case
(``veomni-ops::swiglu.standard.mine[float32-2d-3x17]``) beside whatever else pytest
collected; ``-k`` selects among them as usual. A kernel that cannot run here (hardware,
missing requirement) is skipped with the reason; a backend name that matches nothing is a
failing test that says what is registered. Without the option the plugin does nothing.

The options ``--veomni-ops-size``, ``--veomni-ops-seed`` and ``--veomni-ops-dtype`` also
apply to the per-op base classes (:mod:`veomni_ops.testing.conformance`).

This module is imported by every pytest run where veomni-ops is installed: it imports
nothing heavy until the option is used.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..ops import OP_TABLE

#: The ops an option may name: read from the op folders (:mod:`veomni_ops.ops`, light: no torch).
OPS = tuple(OP_TABLE)


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("veomni-ops", "veomni-ops kernel conformance kit")
    group.addoption("--veomni-ops-backend", action="append", default=[], metavar="NAME",
                    help="generate conformance tests for every kernel of this backend (kernel name, "
                         "entry point or distribution; repeatable)")
    group.addoption("--veomni-ops-op", action="append", default=[], metavar="OP", choices=OPS,
                    help="only this op (repeatable)")
    group.addoption("--veomni-ops-dtype", action="append", default=[], metavar="DTYPE",
                    choices=("float32", "bfloat16", "float16", "float64"), help="only this dtype (repeatable)")
    group.addoption("--veomni-ops-size", choices=("small", "full"), default=None,
                    help="case shapes (default: small on the CPU and under TRITON_INTERPRET=1, else full)")
    group.addoption("--veomni-ops-seed", type=int, default=None, help="seed of the random inputs (default 0)")
    group.addoption("--veomni-ops-plugin", action="append", default=[], metavar="MODULE",
                    help="also load this spec module as a backend plugin (e.g. one not installed yet)")


class ConformanceItem(pytest.Item):
    """One kernel, variant, dtype and case."""

    def __init__(self, *, param: Any, registry: Any, size: str, seed: int, **kw: Any):
        super().__init__(**kw)
        self.param = param
        self.registry = registry
        self.size = size
        self.seed = seed

    def runtest(self) -> None:
        from .conformance import run_param

        run_param(self.registry, self.param, size=self.size, seed=self.seed)

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        from .conformance import ConformanceFailure

        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"veomni-ops conformance: {self.name}"


class _NothingToCheck(pytest.Item):
    def __init__(self, *, message: str, **kw: Any):
        super().__init__(**kw)
        self.message = message

    def runtest(self) -> None:
        raise AssertionError(self.message)

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        return self.message

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, "veomni-ops conformance"


class ConformanceCollector(pytest.Collector):
    """The tests ``--veomni-ops-backend`` asks for, as one virtual collector under the session."""

    def collect(self) -> list[pytest.Item]:
        from .conformance import case_params, registry_with, resolve_size
        from .runner import selected_kernels

        config = self.config
        backends = config.getoption("veomni_ops_backend")
        ops = config.getoption("veomni_ops_op") or None
        dtypes = config.getoption("veomni_ops_dtype") or None
        size = resolve_size(config.getoption("veomni_ops_size"))
        seed = config.getoption("veomni_ops_seed") or 0
        registry = registry_with(tuple(config.getoption("veomni_ops_plugin")))
        items: list[pytest.Item] = []
        for backend in backends:
            kernels = [rk for op in (ops or [None]) for rk in selected_kernels(registry, backend, op)]
            if not kernels:
                fails = "; ".join(f.describe() for f in registry.failures) or "none"
                msg = (f"--veomni-ops-backend {backend}: no registered kernel matches"
                       + (f" for op(s) {', '.join(ops)}" if ops else "")
                       + f". Registered backends: {', '.join(sorted({k.spec.name for k in registry})) or 'none'}; "
                       f"plugin load failures: {fails}")
                items.append(_NothingToCheck.from_parent(self, name=f"{backend}[nothing-to-check]", message=msg))
                continue
            for rk in kernels:
                s = rk.spec
                for p in case_params(registry, s.op, s.name, variants=(s.variant,), dtypes=dtypes, size=size):
                    items.append(ConformanceItem.from_parent(
                        self, name=f"{s.op}.{s.variant}.{s.name}[{p.dtype}-{p.case}]", param=p,
                        registry=registry, size=size, seed=seed))
        return items


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    # tryfirst: our items exist before -k / -m deselection runs.
    if not config.getoption("veomni_ops_backend"):
        return
    collector = ConformanceCollector.from_parent(session, name="veomni-ops", nodeid="veomni-ops")
    # Through pytest's collection hooks, as pytest collects a test file: the terminal counts
    # collect reports, not the items list, so items added without one are left out of
    # "collected N items" (it said "collected 0 items" before "16 passed"); and an exception
    # while collecting is then a collection error that names the collector.
    collector.ihook.pytest_collectstart(collector=collector)
    report = collector.ihook.pytest_make_collect_report(collector=collector)
    report.__dict__.pop("call", None)  # as pytest's own collection does: a report carries no CallInfo
    collector.ihook.pytest_collectreport(report=report)
    if report.passed:
        items.extend(x for x in report.result if isinstance(x, pytest.Item))


def pytest_report_header(config: Any) -> list[str] | None:
    backends = config.getoption("veomni_ops_backend")
    if not backends:
        return None
    from .conformance import resolve_size

    size = resolve_size(config.getoption("veomni_ops_size"))
    return [f"veomni-ops conformance: backend(s) {', '.join(backends)}, {size} shapes, "
            f"seed {config.getoption('veomni_ops_seed') or 0}"]
