"""Helpers for ``run.sh`` that let a transformers test tree from one ref run against the installed release.

    python compat.py names TESTS_DIR REF_TESTING_UTILS OUT_JSON
        Every name the test tree imports from ``transformers.testing_utils`` that the installed
        release lacks, read (as a literal) from the ref's own ``testing_utils.py``; written as a
        JSON object for the plugin (``VEOMNI_HF_COMPAT``). Names that are not literals are listed
        on stderr and left out (the test module importing them then fails to import, visibly).
    python compat.py stubs TESTS_DIR
        Every ``from .MODULE import ...`` in ``TESTS_DIR/*.py`` whose ``MODULE.py`` is absent gets a
        stand-in module whose every attribute skips the calling test (the distributed harness
        that tensor-parallel / FSDP / expert-parallel mixins import, say); their names on stdout.

Nothing of transformers is copied into this repository: both read the tree being tested.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

STUB = '''"""Stand-in written by veomni-ops tools/hf_suites/compat.py: this module is absent from the
assembled test tree; any test that reaches it is skipped."""
import unittest


def __getattr__(name):
    def _absent(*args, **kwargs):
        raise unittest.SkipTest("tests/{module}.py is absent from the assembled transformers test tree")

    return _absent
'''


def _imported_from(tree: ast.AST, module: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == module:
            out.update(a.name for a in node.names)
    return out


def names(tests_dir: Path, ref_utils: Path, out: Path) -> None:
    import transformers.testing_utils as installed

    wanted: set[str] = set()
    for f in tests_dir.rglob("*.py"):
        wanted |= _imported_from(ast.parse(f.read_text()), "transformers.testing_utils")
    missing = sorted(n for n in wanted if not hasattr(installed, n))
    literals = {}
    ref_tree = ast.parse(ref_utils.read_text())
    for node in ref_tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in missing:
                try:
                    literals[name] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    for n in missing:
        print(f"compat: transformers.testing_utils.{n}: "
              + ("taken from the test ref" if n in literals else "not a literal in the test ref; left out"),
              file=sys.stderr)
    out.write_text(json.dumps(literals, indent=1, sort_keys=True))


def stubs(tests_dir: Path) -> None:
    for f in sorted(tests_dir.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module and "." not in node.module:
                target = tests_dir / f"{node.module}.py"
                if not target.exists() and not (tests_dir / node.module).is_dir():
                    target.write_text(STUB.replace("{module}", node.module))
                    print(node.module)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "names":
        names(Path(args[0]), Path(args[1]), Path(args[2]))
    elif cmd == "stubs":
        stubs(Path(args[0]))
    else:
        raise SystemExit(__doc__)
