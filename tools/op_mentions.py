"""How many core modules outside an op's folder name the op in their code.

    python tools/op_mentions.py core/src            # the table
    python tools/op_mentions.py core/src --max 8    # exit 1 when an op is named in more than 8 files

"One op, one folder" is measured here: for each op folder (``<top>/ops/<op>/`` with an
``__init__.py``, below the root), the modules outside that folder whose code names the op.

The rule:

* Modules are the ``.py`` files below the root that sit in a package: every folder between the
  root and the file has an ``__init__.py`` (the rule of ``tools/import_graph.py``), so a
  non-package tree such as the template under ``new_backend/backend-template`` is not counted.
* Each module is tokenized (:mod:`tokenize`). Comments are skipped, and so are docstrings: a
  string that is a statement on its own (an expression statement that is only a string
  literal, the module's, a class's or a function's docstring or any other).
* A line names op ``X`` where a ``NAME`` token is exactly ``X`` (``from .ops import rms_norm``,
  ``OPS.rms_norm``), or a string literal without whitespace -- a key, a name, a path or a
  reference -- has ``X`` among its words, the literal split on every character that cannot be in
  an identifier (``"rms_norm"``, ``"rms_norm:standard"``, ``".ops.rms_norm"``; of an f-string,
  each literal part: ``f"{op}:rms_norm"``). A literal with whitespace in it is prose, a message
  or a description ("the attention masks"): like a comment, it names nothing. A name that
  merely contains ``X`` (``attention_mask`` for ``attention``) does not name it either.
* An op's count is the number of modules outside its folder that name it on at least one line;
  each is listed with the number of its lines that do.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterable, Sequence
from pathlib import Path

#: Characters that cannot be in an identifier: a string literal's words are split on them.
_NOT_IDENTIFIER = re.compile(r"[^0-9A-Za-z_]+")
#: A string literal with whitespace in it is prose (a message, a description): it names nothing.
_WHITESPACE = re.compile(r"\s")
#: Tokens whose text is a string literal's (Python 3.12+ splits an f-string into parts).
_STRING_TYPES = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def modules(root: Path) -> list[Path]:
    """Every module below ``root``: ``.py`` files whose folders up to ``root`` are all packages."""
    found = []
    for path in sorted(root.rglob("*.py")):
        folders = [f for f in path.relative_to(root).parents if f != Path(".")]
        if folders and all((root / f / "__init__.py").is_file() for f in folders):
            found.append(path)
    return found


def op_folders(root: Path) -> dict[str, Path]:
    """Each op by name: the packages ``<top>/ops/<op>/`` below ``root``."""
    found = {}
    for init in sorted(root.glob("*/ops/*/__init__.py")):
        folder = init.parent
        if (folder.parent / "__init__.py").is_file() and (folder.parent.parent / "__init__.py").is_file():
            found[folder.name] = folder
    return found


def _docstring_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where each string that is a statement on its own starts and ends, as (line, column) pairs."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant | ast.JoinedStr):
            value = node.value
            if isinstance(value, ast.Constant) and not isinstance(value.value, str):
                continue
            assert node.end_lineno is not None and node.end_col_offset is not None
            spans.append(((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)))
    return spans


def naming_lines(source: str, names: Iterable[str]) -> dict[str, set[int]]:
    """For each of ``names``, the lines of ``source`` whose code names it (the rule above)."""
    wanted = set(names)
    spans = _docstring_spans(source)
    out: dict[str, set[int]] = {name: set() for name in wanted}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME:
            if token.string in wanted:
                out[token.string].add(token.start[0])
        elif token.type in _STRING_TYPES:
            if any(start <= token.start and token.end <= end for start, end in spans):
                continue  # a docstring
            if _WHITESPACE.search(token.string):
                continue  # prose: a message or a description, not a key, name or reference
            for line, text in enumerate(token.string.split("\n"), start=token.start[0]):
                for name in set(_NOT_IDENTIFIER.split(text)) & wanted:
                    out[name].add(line)
        # anything else (comments, operators, numbers) names nothing
    return out


def mentions(root: Path) -> dict[str, dict[str, int]]:
    """For each op folder below ``root``: the modules outside it that name the op, by path
    relative to ``root``, each with the number of its lines that do."""
    ops = op_folders(root)
    found: dict[str, dict[str, int]] = {op: {} for op in ops}
    for path in modules(root):
        lines = naming_lines(path.read_text(encoding="utf-8"), ops)
        for op, folder in ops.items():
            if lines[op] and not path.is_relative_to(folder):
                found[op][path.relative_to(root).as_posix()] = len(lines[op])
    return found


def table(found: dict[str, dict[str, int]]) -> str:
    """One block per op: its name and count, then each file with its number of lines."""
    out = []
    for op, files in found.items():
        out.append(f"{op}: {len(files)} file(s) outside its folder")
        out += [f"    {path}  {n} line(s)" for path, n in sorted(files.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the folder holding the top packages (core/src)")
    parser.add_argument("--max", type=int, default=None, metavar="N",
                        help="exit 1 when an op is named in more than N modules outside its folder")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"{args.root} is not a folder")
    found = mentions(args.root)
    print(table(found))
    if args.max is not None:
        over = {op: len(files) for op, files in found.items() if len(files) > args.max}
        for op, n in over.items():
            print(f"op {op} is named in {n} modules outside its folder, more than --max {args.max}", file=sys.stderr)
        if over:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
