"""The core's rooms stay small: no module over 450 lines, no package ``__init__`` over 150.

    pytest tools/test_core_size.py -q

A package's ``__init__`` says what the package offers (imports and ``__all__``); the work is in
modules named for it. A module past the bound is split where its parts are cohesive, each old
import path kept as a re-export (CONTRIBUTING.md, "The core's layout").
"""

from __future__ import annotations

from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "core" / "src" / "veomni_ops"
MODULE_LINES = 450
INIT_LINES = 150


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_core_module_over_its_bound():
    files = sorted(p for p in CORE.rglob("*.py") if "backend-template" not in p.parts)
    assert len(files) > 100  # the tree was found
    over = {str(p.relative_to(CORE)): n for p in files
            if (n := _lines(p)) > (INIT_LINES if p.name == "__init__.py" else MODULE_LINES)}
    assert not over, (f"over {MODULE_LINES} lines (an __init__.py: {INIT_LINES}): {over}; split each into modules "
                      "named for what they do and keep its import path as a re-export")
