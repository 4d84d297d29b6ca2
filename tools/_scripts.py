"""What the tests under tools/ share: a script that is no package's module, imported from its path,
and a throwaway source tree."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load(name: str, path: Path) -> ModuleType:
    """The script at ``path`` imported as the module ``name``, registered in ``sys.modules`` before
    it runs (dataclasses look their module up while a class is made)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (path -> source, dedented) below ``root``; return ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root
