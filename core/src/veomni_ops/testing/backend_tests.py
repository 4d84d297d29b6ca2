"""What a backend's own unit tests share: its ``tests/conftest.py`` and helpers build on this.

Every backend's tests are laid out alike: ``tests/conftest.py``, the test modules, a helpers
module beside them, and, where the vendor library cannot run here, plain-PyTorch stand-ins of
it in ``tests/standins/``. The conftest sets up the environment before any kernel module is
imported and takes the fixtures it wants by importing them::

    # tests/conftest.py of a backend whose vendor library is stood in for
    from pathlib import Path

    from veomni_ops.testing.backend_tests import seeded, use_standins  # noqa: F401  (seeded: a fixture)

    use_standins(Path(__file__).parent / "standins", "my_vendor", fix="check on a GPU: veomni-ops check")

    # tests/conftest.py of a Triton backend
    from veomni_ops.testing.backend_tests import seeded, triton_interpreter_unless_cuda  # noqa: F401

    triton_interpreter_unless_cuda()

The helpers hold a kernel to the tolerance its own spec declares (:func:`assert_close`, with
:func:`spec_for`), find the core's reference kernels (:func:`core_reference`) and read a
kernel's signature as the op contracts are compared (:func:`signature`). The conformance kit
(:mod:`veomni_ops.testing`) is the other half: it checks every kernel against the float64
reference on the kit's cases; these are for a backend's own, narrower tests.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from ..spec import KernelSpec, Tolerance
from .execution import interpreter_active

__all__ = [
    "all_specs",
    "assert_close",
    "core_reference",
    "kernel_device",
    "seeded",
    "signature",
    "spec_for",
    "triton_interpreter_unless_cuda",
    "use_standins",
]


# -------------------------------------------------------------------------- conftest set-up
def use_standins(standins: Path, *modules: str, fix: str, also: tuple[Path, ...] = ()) -> None:
    """Put ``standins`` (and the folders ``also`` names, after it) first on ``sys.path``, so that
    ``import <module>`` finds the stand-ins; refuse to go on if a real one of ``modules`` is
    imported already (a test would then check the real library on the wrong device).

    A module is a stand-in when it says so (``IS_STAND_IN = True``) or was imported from below
    ``standins``. ``fix`` ends the refusal: where the real library is checked instead.
    """
    for folder in reversed((standins, *also)):
        path = str(folder)
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    root = standins.resolve()
    for name in modules:
        loaded = sys.modules.get(name)
        if loaded is None or getattr(loaded, "IS_STAND_IN", False):
            continue
        file = getattr(loaded, "__file__", None)
        if file is not None and Path(file).resolve().is_relative_to(root):
            continue
        raise pytest.UsageError(
            f"a real {name} is already imported in this process ({loaded}); these tests run the adapters against "
            f"the stand-in in {standins}. {fix}"
        )


def triton_interpreter_unless_cuda() -> None:
    """``TRITON_INTERPRET=1`` on a machine without CUDA, unless the caller chose a mode already.

    Triton decides interpreter or compiled when a kernel is *defined* (its module imported), so
    a conftest calls this before any test module imports a Triton kernel.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def kernel_device(interpreter: bool | None = None) -> torch.device:
    """Where a Triton backend's kernels run in its tests: the CPU under Triton's interpreter
    (``interpreter``; default: ``TRITON_INTERPRET`` says so), else CUDA; neither skips the test."""
    if interpreter_active() if interpreter is None else interpreter:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.skip("no CUDA device and TRITON_INTERPRET is off: nothing can run these Triton kernels")


@pytest.fixture(autouse=True)
def seeded() -> Iterator[None]:
    """Every test starts from ``torch.manual_seed(0)``."""
    torch.manual_seed(0)
    yield


# -------------------------------------------------------------------------- helpers
def all_specs(specs: ModuleType) -> list[KernelSpec]:
    """Every spec a backend's spec module declares, in the order of the ops."""
    from ..spec import OPS

    return [s for op in OPS if hasattr(specs, op) for s in getattr(specs, op)()]


def spec_for(specs: ModuleType, op: str, variant: str | None = None, name: str | None = None) -> KernelSpec:
    """The first spec ``specs`` declares for ``op`` of ``variant`` and kernel ``name`` (each: any, if None)."""
    found = [s for s in getattr(specs, op)() if variant in (None, s.variant) and name in (None, s.name)]
    if not found:
        raise LookupError(f"{specs.__name__} declares no {op} kernel"
                          + (f" of variant {variant!r}" if variant else "") + (f" named {name!r}" if name else ""))
    return found[0]


def signature(fn: Any) -> list[tuple[str, object, object]]:
    """``fn``'s parameters as the op contracts are compared: (name, kind, default or None)."""
    return [(p.name, p.kind, None if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(fn).parameters.values()]


def core_reference(module: str) -> ModuleType:
    """The core's eager reference ``veomni_ops.kernels.<module>``, or skip the test saying why."""
    try:
        return importlib.import_module(f"veomni_ops.kernels.{module}")
    except ModuleNotFoundError as e:
        pytest.skip(f"core reference veomni_ops.kernels.{module} is not importable ({e})")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance, what: str, *,
                 scale: float | None = None, dtype: torch.dtype | None = None) -> None:
    """``|actual - expected| <= atol * scale + rtol * |expected|`` elementwise, in float64.

    ``tol``: the tolerance the backend's spec declares for the dtype (``dtype``, default
    ``actual``'s, only names it in the message). ``scale`` widens atol; by default
    ``max(1, max|expected|)``: for tensors of order one exactly the spec's atol, for sums over
    many terms (a loss summed over tokens, a weight gradient summed over rows) atol grows with
    the magnitude, as the rounding error does. A non-finite value where ``expected`` is finite fails.
    """
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    shown = dtype or actual.dtype
    assert torch.isfinite(a)[torch.isfinite(e)].all(), f"{what} ({shown}): non-finite values where the reference is finite"
    if scale is None:
        scale = max(1.0, e.abs().max().item()) if e.numel() else 1.0
    err = (a - e).abs()
    bad = err > tol.atol * scale + tol.rtol * e.abs()
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(
            f"{what} ({shown}): {int(bad.sum())}/{bad.numel()} elements out of tolerance "
            f"(atol={tol.atol}*{scale:.3g}, rtol={tol.rtol}); first at flat index {i}: "
            f"got {a.flatten()[i].item():.6g}, expected {e.flatten()[i].item():.6g}; max err {err.max().item():.3g}"
        )
