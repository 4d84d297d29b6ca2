"""The conformance kit: check any kernel against the core's eager reference, in float64.

Three ways in:

* ``veomni-ops check [--backend NAME] [--op OP]`` — every usable kernel on this machine,
  a pass/fail table with the worst error (:mod:`veomni_ops.testing.check`).
* ``pytest --veomni-ops-backend NAME`` — one pytest test per kernel, dtype and case; skips
  with the reason where the hardware or a requirement is missing
  (:mod:`veomni_ops.testing.pytest_plugin`, registered through ``pytest11``).
* Base classes a backend author subclasses in their own tests::

      from veomni_ops.testing import SwigluConformance

      class TestMySwiglu(SwigluConformance):
          kernel_name = "mine"

What is checked, per op, is described as data in :mod:`veomni_ops.testing.cases` (one
module per op: input generators with odd sizes, non-contiguous layouts and each op's edge
cases); how it is compared is :mod:`veomni_ops.testing.runner` (the rule; its parts live in
``execution``, ``compare``, ``case_check`` and ``results``). This package imports no torch
until a check runs, so the CLI can build its parser cheaply.
"""

from __future__ import annotations

from typing import Any

from ..ops import OP_DEFS, conformance_class_name

#: The per-op conformance base classes (``SwigluConformance``, ...), one per op folder.
_CLASSES = tuple(conformance_class_name(op) for op in OP_DEFS)

__all__ = ["ConformanceBase", *_CLASSES, "check_kernel", "run_checks"]

_LAZY = {
    "check_kernel": "veomni_ops.testing.runner",
    "run_checks": "veomni_ops.testing.runner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "ConformanceBase" or name in _CLASSES:
        from . import conformance

        return getattr(conformance, name)
    raise AttributeError(f"module 'veomni_ops.testing' has no attribute {name!r}")
