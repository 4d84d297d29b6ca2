"""What the core's distribution requires (core/pyproject.toml), against the versions CI tested
together (constraints.txt). The install itself is tested in a fresh venv by the packaging session
(tests/packaging/test_install_paths.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def test_the_core_requires_numpy_at_a_range_holding_the_tested_release():
    """torch does not require numpy, and warns "Failed to initialize NumPy" at import without it:
    on every veomni-ops command, in a venv with only the core and torch."""
    deps = [Requirement(d) for d in tomllib.loads((ROOT / "core/pyproject.toml").read_text())["project"]["dependencies"]]
    numpy = [d for d in deps if d.name == "numpy"]
    assert len(numpy) == 1, f"core/pyproject.toml's dependencies name numpy {len(numpy)} times: {deps}"
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M))
    assert numpy[0].specifier.contains(pins["numpy"]), (numpy[0], pins["numpy"])
