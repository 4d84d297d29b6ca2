"""Shared setup of the veomni-quack tests: the stand-in Quack goes first on sys.path.

Quack's kernels are CuTe-DSL programs that compile for a GPU (and nvidia-cutlass-dsl needs
one to import), so these tests run the adapters against ``tests/fakes/quack``: a plain-torch
stand-in with the real function names and signatures, the real kernels' roundings and the
real layout assertions. ``tests/fakes`` also holds stand-in distribution metadata
(quack-kernels 0.6.5, nvidia-cutlass-dsl 4.8.1) so resolution's requirement check passes.
The adapters accept CPU tensors only because this file widens their device check.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
FAKES = HERE / "fakes"

for p in (str(FAKES), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

_loaded = sys.modules.get("quack")
if _loaded is not None and not getattr(_loaded, "IS_STAND_IN", False):
    raise pytest.UsageError(
        "a real quack is already imported in this process; the veomni-quack unit tests run against the stand-in "
        "in tests/fakes. On a GPU, check the kernels with `veomni-ops check --backend veomni-quack` instead"
    )


@pytest.fixture(autouse=True)
def _cpu_allowed(monkeypatch) -> None:
    import veomni_quack.kernels._common as common

    monkeypatch.setattr(common.CHECKS, "device_types", ("cuda", "cpu"))
    torch.manual_seed(0)
