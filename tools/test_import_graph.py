"""The import-graph check (``tools/import_graph.py``): the core has no circle, and the check
finds one wherever an import can close it. The lint session runs this file.

    pytest tools/test_import_graph.py -q
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("import_graph", HERE / "import_graph.py")
assert _spec is not None and _spec.loader is not None
ig = importlib.util.module_from_spec(_spec)
sys.modules["import_graph"] = ig  # dataclasses look their module up while the class is made
_spec.loader.exec_module(ig)

CORE_SRC = HERE.parent / "core" / "src"


def tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (path -> source) below ``root``; return ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def circles(root: Path) -> list[tuple[str, ...]]:
    return ig.cycles(ig.arrows(root))


def test_the_core_has_no_import_cycle_but_the_allowed_ones():
    problems = ig.check(CORE_SRC, ig.ALLOWED)
    assert not problems, "\n".join(problems)


def test_a_module_level_circle_is_named_as_a_path_with_its_lines(tmp_path, capsys):
    root = tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import os\nfrom . import b\n",
        "pkg/b.py": "from .c import thing\n",
        "pkg/c.py": "\n\nfrom pkg.a import x\nthing = 1\n",
    })
    assert circles(root) == [("pkg.a", "pkg.b", "pkg.c", "pkg.a")]
    assert ig.main([str(root)]) == 1
    err = capsys.readouterr().err
    assert "import cycle: pkg.a -> pkg.b -> pkg.c -> pkg.a" in err
    assert "pkg.c -> pkg.a: pkg/c.py:3" in err and "pkg.a -> pkg.b: pkg/a.py:2" in err


def test_imports_inside_functions_count_and_type_checking_ones_do_not(tmp_path):
    root = tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": """
            from typing import TYPE_CHECKING
            import typing
            if TYPE_CHECKING:
                from .high import High
            if typing.TYPE_CHECKING:
                from . import high
            else:
                pass
            def f():
                try:
                    from .mid import g
                except ImportError:
                    pass
        """,
        "pkg/mid.py": "from .low import f\n",
        "pkg/high.py": "from .low import f\n",
    })
    assert circles(root) == [("pkg.low", "pkg.mid", "pkg.low")]


def test_a_runtime_import_in_the_else_of_type_checking_counts(tmp_path):
    root = tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    from . import b\n",
        "pkg/b.py": "import pkg.a\n",
    })
    assert circles(root) == [("pkg.a", "pkg.b", "pkg.a")]


def test_the_package_face_counts_as_a_module(tmp_path):
    # The back-up arrow: a submodule reading a name from the package that imports it.
    root = tree(tmp_path, {
        "pkg/__init__.py": "from .discovery import discover\n__version__ = '1'\n",
        "pkg/discovery.py": "def discover():\n    from . import __version__\n",
    })
    assert circles(root) == [("pkg", "pkg.discovery", "pkg")]


def test_relative_imports_resolve_from_packages_and_modules(tmp_path):
    root = tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "from .leaf import x\n",  # pkg.sub -> pkg.sub.leaf
        "pkg/sub/leaf.py": "from ..other import y\nx = 1\n",  # pkg.sub.leaf -> pkg.other
        "pkg/other.py": "from .sub import leaf\ny = 2\n",  # pkg.other -> pkg.sub.leaf (a submodule)
    })
    found = {(a.source, a.target) for a in ig.arrows(root)}
    assert found == {("pkg.sub", "pkg.sub.leaf"), ("pkg.sub.leaf", "pkg.other"), ("pkg.other", "pkg.sub.leaf")}
    assert circles(root) == [("pkg.other", "pkg.sub.leaf", "pkg.other")]


def test_parent_packages_run_on_the_way_are_not_arrows(tmp_path):
    root = tree(tmp_path, {
        "pkg/__init__.py": "from . import a\n",
        "pkg/a.py": "import pkg.b\nimport json\n",
        "pkg/b.py": "",
    })
    assert circles(root) == []
    assert {(a.source, a.target) for a in ig.arrows(root)} == {("pkg", "pkg.a"), ("pkg.a", "pkg.b")}


def test_every_circle_of_a_knot_is_named(tmp_path):
    # One strongly connected part with two circles through the hub: both are reported.
    root = tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/hub.py": "def f():\n    from . import one, two\n",
        "pkg/one.py": "from .hub import f\n",
        "pkg/two.py": "from .hub import f\n",
    })
    assert circles(root) == [("pkg.hub", "pkg.one", "pkg.hub"), ("pkg.hub", "pkg.two", "pkg.hub")]


def test_allowed_circles_pass_and_a_stale_allowance_fails(tmp_path):
    root = tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "from . import a\n",
        "pkg/c.py": "",
    })
    assert ig.check(root, [("pkg.b", "pkg.a", "pkg.b")]) == []  # any turn of the circle matches
    problems = ig.check(root, [("pkg.a", "pkg.b", "pkg.a"), ("pkg.a", "pkg.c", "pkg.a")])
    assert len(problems) == 1 and problems[0].startswith("allowed import cycle no longer found: pkg.a -> pkg.c")


def test_folders_that_are_not_packages_are_not_modules(tmp_path):
    root = tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "",
        "pkg/scripts/run.py": "from pkg import a\n",  # no __init__.py: not part of the package
    })
    assert set(ig.modules(root)) == {"pkg", "pkg.a"}


def test_a_relative_import_above_the_top_package_is_an_error(tmp_path):
    root = tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from .. import b\n"})
    with pytest.raises(SyntaxError, match="above the top package"):
        ig.arrows(root)
