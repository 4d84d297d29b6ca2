"""Test setup: the float64 stand-ins for flash_attn / flash_attn.cute / flash_attn_interface.

The stand-in packages live in tests/standins/full (all three generations) and are put first
on sys.path before any veomni_flash.kernels module is imported, so the adapters bind to them.
Tests that need a different environment (no package, FA4 only) run in a subprocess. The
set-up every backend's tests share is :mod:`veomni_ops.testing.backend_tests`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from veomni_ops.testing.backend_tests import seeded, use_standins  # noqa: F401  (seeded: an autouse fixture)

STANDINS = Path(__file__).resolve().parent / "standins"

use_standins(STANDINS, "flash_attn", "flash_attn.cute", "flash_attn_interface", also=(STANDINS / "full",),
             fix="On a GPU, check the kernels with gpu/check_flash.py or `veomni-ops check --backend veomni-flash`")


@pytest.fixture
def calls():
    import flash_reference

    flash_reference.CALLS.clear()
    yield flash_reference.CALLS
    flash_reference.CALLS.clear()
