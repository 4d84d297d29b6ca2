import os
import types

import pytest
from veomni_ops import HardwareRequirement, KernelSpec, build_registry, hookimpl


def make_plugin(name: str, **hooks) -> types.ModuleType:
    """A plugin module whose hooks return the given spec lists."""
    mod = types.ModuleType(name)
    for op, specs in hooks.items():
        def impl(_specs=specs):
            return list(_specs)

        impl.__name__ = op
        setattr(mod, op, hookimpl(impl))
    return mod


@pytest.fixture
def toy_registry():
    """A registry with no entry points: a portable kernel and a Hopper-only one."""
    plugin = make_plugin(
        "toy",
        rms_norm=[
            KernelSpec(name="portable", op="rms_norm", variant="standard", factory="math:sqrt", priority=1),
            KernelSpec(name="portable", op="rms_norm", variant="offset", factory="math:sqrt", priority=1),
            KernelSpec(name="hopper", op="rms_norm", variant="standard", factory="math:floor", priority=9,
                       hardware=HardwareRequirement(("cuda",), min_capability=(9, 0), max_capability=(9, 0))),
        ],
        swiglu=[KernelSpec(name="portable", op="swiglu", variant="standard", factory="math:ceil")],
    )
    return build_registry([("toy", plugin)], include_entry_points=False, env={})


def pytest_configure(config):
    config.addinivalue_line("markers", "parallel: real multi-process jobs (torch.distributed, gloo on the CPU; "
                                       "test_parallel.py, about a minute on 2 cores)")


#: Set by the nox session that installs what optional tests need (core_optional): there a skip
#: means the set-up is broken, so it fails instead of passing unseen.
NO_SKIP = "VEOMNI_OPS_TEST_NO_SKIP"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get(NO_SKIP) == "1" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"skipped where {NO_SKIP}=1 (a session that installs what this test needs): {reason}. "
                           "Install what it names in that session (noxfile.py, CORE_OPTIONAL).")
