"""Shared setup of the veomni-quack tests: the stand-in Quack goes first on sys.path.

Quack's kernels are CuTe-DSL programs that compile for a GPU (and nvidia-cutlass-dsl needs
one to import), so these tests run the adapters against ``tests/standins/quack``: a plain-torch
stand-in with the real function names and signatures, the real kernels' roundings and the
real layout assertions. ``tests/standins`` also holds stand-in distribution metadata
(quack-kernels 0.6.5, nvidia-cutlass-dsl 4.8.1) so resolution's requirement check passes.
The adapters accept CPU tensors only because this file widens their device check. The set-up
every backend's tests share is :mod:`veomni_ops.testing.backend_tests`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from veomni_ops.testing.backend_tests import seeded, use_standins  # noqa: F401  (seeded: an autouse fixture)

HERE = Path(__file__).resolve().parent
STANDINS = HERE / "standins"

use_standins(STANDINS, "quack", also=(HERE,),
             fix="On a GPU, check the kernels with `veomni-ops check --backend veomni-quack` instead")


@pytest.fixture(autouse=True)
def _cpu_allowed(monkeypatch) -> None:
    import veomni_quack.kernels._common as common

    monkeypatch.setattr(common.CHECKS, "device_types", ("cuda", "cpu"))
