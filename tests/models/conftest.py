"""Fixtures for the model tests: in-process registries (no entry points), plugin helpers."""

from __future__ import annotations

import sys
import types
from collections import Counter
from pathlib import Path

import pytest

# models_support.py sits beside this file; make it importable whatever pytest's rootdir.
sys.path.insert(0, str(Path(__file__).parent))

import veomni_ops  # noqa: E402
import veomni_ops.backends.reference as reference  # noqa: E402
from veomni_ops import KernelSpec, build_registry, hookimpl  # noqa: E402


def make_plugin(name: str, **hooks) -> types.ModuleType:
    """A plugin module whose hooks return the given spec lists (as core/tests/conftest.py)."""
    mod = types.ModuleType(name)
    for op, specs in hooks.items():
        def impl(_specs=specs):
            return list(_specs)

        impl.__name__ = op
        setattr(mod, op, hookimpl(impl))
    return mod


def eager_registry(*extra: tuple[str, types.ModuleType]) -> veomni_ops.Registry:
    return build_registry(modules=[("eager", reference), *extra], include_entry_points=False, env={})


@pytest.fixture(scope="session")
def registry() -> veomni_ops.Registry:
    """The core's reference backend only (eager + sdpa/chunked/grouped_mm)."""
    return eager_registry()


# -- a counting backend: every kernel wraps the eager one and counts its calls ---------------

_WRAPPED = {
    ("rms_norm", "standard"): ("veomni_ops.kernels.rms_norm", "rms_norm_standard"),
    ("rms_norm", "offset"): ("veomni_ops.kernels.rms_norm", "rms_norm_offset"),
    ("residual_rms_norm", "standard"): ("veomni_ops.ops.residual_rms_norm.kernel", "residual_rms_norm"),
    ("rotary", "full"): ("veomni_ops.kernels.rotary", "apply_rotary"),
    ("rotary", "partial"): ("veomni_ops.kernels.rotary", "apply_rotary"),
    ("swiglu", "standard"): ("veomni_ops.kernels.swiglu", "silu_mul"),
    ("cross_entropy", "logits"): ("veomni_ops.kernels.cross_entropy", "cross_entropy_sum"),
    ("cross_entropy", "fused_linear"): ("veomni_ops.kernels.cross_entropy", "fused_linear_cross_entropy_sum"),
    ("moe_router", "standard"): ("veomni_ops.ops.moe_router.kernel", "moe_router"),
    ("moe_experts", "standard"): ("veomni_ops.kernels.moe", "moe_experts_eager"),
    ("load_balancing_loss", "standard"): ("veomni_ops.kernels.load_balancing", "load_balancing_loss"),
    ("attention", "standard"): ("veomni_ops.kernels.attention", "eager_attention"),
}
#: What the wrapped kernels honour (eager attention honours every attention feature).
_FEATURES = {"attention": ("softcap", "sinks", "sliding_window", "dropout")}


def counting_plugin(counter: Counter, name: str = "counting", priority: int = 50) -> types.ModuleType:
    """Kernels named ``name`` for every op and variant; each call adds 1 to ``counter[(op, variant)]``."""

    def factory(op: str, variant: str):
        def load():
            import importlib

            mod, attr = _WRAPPED[(op, variant)]
            inner = getattr(importlib.import_module(mod), attr)

            def kernel(*args, **kwargs):
                counter[(op, variant)] += 1
                return inner(*args, **kwargs)

            kernel.__name__ = f"{name}_{op}_{variant}"
            return kernel

        return load

    hooks: dict[str, list[KernelSpec]] = {}
    for op, variant in _WRAPPED:
        hooks.setdefault(op, []).append(
            KernelSpec(name=name, op=op, variant=variant, factory=factory(op, variant), priority=priority,
                       dtypes=("float32", "bfloat16", "float16", "float64"), description="counts calls, then eager",
                       features=_FEATURES.get(op, ()))
        )
    return make_plugin(name, **hooks)


@pytest.fixture(scope="session")
def plugin():
    """``make_plugin`` for tests that build their own in-process backends."""
    return make_plugin


@pytest.fixture(scope="session")
def registry_with():
    """``registry_with(("name", plugin_module), ...)``: the eager reference plus those plugins."""
    return eager_registry


_COUNTER: Counter = Counter()


@pytest.fixture
def counter() -> Counter:
    """Calls per (op, variant) of the ``counting`` kernels, zeroed for each test."""
    _COUNTER.clear()
    return _COUNTER


@pytest.fixture(scope="session")
def counting_registry() -> veomni_ops.Registry:
    """eager reference + ``counting`` (priority 50, so ``auto`` would take it).

    One per session: the core caches loaded kernels per process by name and provenance,
    so a second ``counting`` plugin with another counter would get the first one's kernels.
    """
    return eager_registry(("counting", counting_plugin(_COUNTER)))
