"""The import-graph check (``tools/import_graph.py``): the core has no circle, and the check
finds one wherever an import can close it. The lint session runs this file.

    pytest tools/test_import_graph.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _scripts import ROOT, load, tree

ig = load("import_graph", ROOT / "tools" / "import_graph.py")
CORE_SRC = ROOT / "core" / "src"


def circles(root: Path) -> list[tuple[str, ...]]:
    return ig.cycles(ig.arrows(root))


def test_the_core_has_no_import_cycle_and_no_layering_violation_but_the_allowed_ones(capsys):
    problems = ig.check(CORE_SRC, ig.ALLOWED, ig.ALLOWED_LAYERING)
    assert not problems, "\n".join(problems)
    # the report says so, and counts the typing-only imports among the arrows it looked at
    assert ig.main([str(CORE_SRC)]) == 0
    out = capsys.readouterr().out
    assert "no import cycle in" in out and "typing-only, counted too" in out
    assert "no import of an op's heavy module from outside ops/" in out
    for source, target, _why in ig.ALLOWED_LAYERING:
        assert f"but this one, allowed for now: {source} -> {target}" in out


def test_the_core_reaches_op_kernels_below_ops_only_by_string():
    # the kernels' old import paths (veomni_ops.kernels.<module>) resolve lazily: no arrow
    found = ig.layering(ig.arrows(CORE_SRC))
    assert not [a for a in found if a.source.startswith("veomni_ops.kernels")]
    assert {(a.source, a.target) for a in found} == {(s, t) for s, t, _ in ig.ALLOWED_LAYERING}


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


def test_imports_inside_functions_count_and_type_checking_ones_too(tmp_path, capsys):
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
    # the circle through high is closed by typing-only imports: a circle all the same
    assert circles(root) == [("pkg.high", "pkg.low", "pkg.high"), ("pkg.low", "pkg.mid", "pkg.low")]
    typing_only = {(a.source, a.target): a.typing_only for a in ig.arrows(root)}
    assert typing_only == {("pkg.low", "pkg.high"): True, ("pkg.low", "pkg.mid"): False,
                           ("pkg.mid", "pkg.low"): False, ("pkg.high", "pkg.low"): False}
    assert ig.main([str(root), "--no-allow"]) == 1
    err = capsys.readouterr().err
    assert "pkg.low -> pkg.high: pkg/low.py:5 (typing only)" in err
    assert "pkg.low -> pkg.mid: pkg/low.py:12\n" in err  # a runtime arrow is not marked


def test_a_pair_imported_at_runtime_and_for_types_is_a_runtime_arrow(tmp_path):
    root = tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\ndef f():\n    from . import b\n",
        "pkg/b.py": "",
    })
    [arrow] = ig.arrows(root)
    assert (arrow.source, arrow.target, arrow.line, arrow.typing_only) == ("pkg.a", "pkg.b", 5, False)


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


OPS_TREE = {
    "pkg/__init__.py": "",
    "pkg/ops/__init__.py": "from . import base\n",
    "pkg/ops/base.py": "",
    "pkg/ops/norm/__init__.py": "from ..base import x\n",
    "pkg/ops/norm/kernel.py": "",
    "pkg/ops/norm/binder.py": "from .kernel import f\n",  # inside ops/: allowed
    "pkg/ops/norm/checks.py": "",
    "pkg/ops/norm/reference.py": "",
    "pkg/runtime/__init__.py": "",
}


def test_a_module_below_ops_importing_an_op_heavy_module_is_a_violation(tmp_path, capsys):
    root = tree(tmp_path, {
        **OPS_TREE,
        "pkg/runtime/use.py": """
            import importlib
            from ..ops import norm                  # the light table: the ground floor
            from ..ops.norm import checks           # the op's input checks: open to all
            from ..ops.base import x
            def f():
                from ..ops.norm.binder import BINDER
                return importlib.import_module("pkg.ops.norm.kernel")  # by string: not an arrow
        """,
        "pkg/runtime/types.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                import pkg.ops.norm.kernel
        """,
    })
    found = ig.layering(ig.arrows(root))
    assert sorted((a.source, a.target, a.line, a.typing_only) for a in found) == [
        ("pkg.runtime.types", "pkg.ops.norm.kernel", 4, True),
        ("pkg.runtime.use", "pkg.ops.norm.binder", 7, False),
    ]
    assert ig.main([str(root), "--no-allow"]) == 1  # (the core's allowances do not apply here)
    err = capsys.readouterr().err
    assert "pkg/runtime/use.py:7: pkg.runtime.use imports pkg.ops.norm.binder, an op's heavy module" in err
    assert "pkg/runtime/types.py:4: pkg.runtime.types imports pkg.ops.norm.kernel" in err and "(typing only)" in err
    assert '    fix: import it by the op folder\'s "module:attr" string' in err
    assert "2 problem(s)" in err


def test_a_split_kernel_module_and_the_reference_are_heavy_too(tmp_path):
    root = tree(tmp_path, {**OPS_TREE, "pkg/ops/norm/packing.py": "",
                           "pkg/runtime/use.py": "from ..ops.norm import reference\nfrom ..ops.norm.packing import f\n"})
    assert sorted((a.target, a.line) for a in ig.layering(ig.arrows(root))) == [
        ("pkg.ops.norm.packing", 2), ("pkg.ops.norm.reference", 1)]


def test_allowed_layering_passes_and_a_stale_allowance_fails(tmp_path):
    root = tree(tmp_path, {**OPS_TREE, "pkg/runtime/use.py": "from ..ops.norm.kernel import f\n"})
    assert ig.check(root, (), [("pkg.runtime.use", "pkg.ops.norm.kernel", "why")]) == []
    problems = ig.check(root, (), [("pkg.runtime.use", "pkg.ops.norm.kernel", "why"),
                                   ("pkg.runtime", "pkg.ops.norm.bench", "gone")])
    assert problems == ["allowed layering exception no longer found: pkg.runtime -> pkg.ops.norm.bench\n"
                        "    fix: delete its entry from ALLOWED_LAYERING in tools/import_graph.py"]
