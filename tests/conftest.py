"""Cross-package tests of veomni-ops (packaging, discovery, fault injection, models).

Markers registered here so that nox sessions can select them with ``-m``:

``packaging``  builds real wheels of the core, the plugins and the fault-injection
               distributions in ``tests/fixtures/dists``, installs them into a fresh venv
               and drives ``veomni-ops`` there (about 4 minutes on 2 CPU cores).
"""

from __future__ import annotations


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "packaging: builds wheels and a fresh virtual environment, then tests discovery through real entry points",
    )
