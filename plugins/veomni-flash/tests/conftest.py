"""Test setup: the float64 stand-ins for flash_attn / flash_attn.cute / flash_attn_interface.

The stand-in packages live in tests/standins/full (all three generations) and are put first
on sys.path before any veomni_flash.kernels module is imported, so the adapters bind to them.
Tests that need a different environment (no package, FA4 only) run in a subprocess.
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDINS = os.path.join(HERE, "standins")
FULL = os.path.join(STANDINS, "full")
FA4_ONLY = os.path.join(STANDINS, "fa4_only")

for p in (FULL, STANDINS):
    if p not in sys.path:
        sys.path.insert(0, p)

for mod in ("flash_attn", "flash_attn.cute", "flash_attn_interface"):
    loaded = sys.modules.get(mod)
    if loaded is not None and not (getattr(loaded, "__file__", "") or "").startswith(STANDINS):
        raise RuntimeError(f"a real {mod} is already imported ({loaded}); the CPU tests need the stand-ins")


@pytest.fixture
def calls():
    import flash_reference

    flash_reference.CALLS.clear()
    yield flash_reference.CALLS
    flash_reference.CALLS.clear()
