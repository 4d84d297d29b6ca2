"""The import graph of a source tree: every circle in it, and every import across the ops' floor.

    python tools/import_graph.py core/src      # exit 1 naming each problem, 0 when there is none

The lint session runs it on ``core/src``. Every ``.py`` file below the root that sits in a
package (a folder with ``__init__.py``, up to the root) is a module, named by its path. Every
``import`` and ``from ... import`` counts, at module level and inside functions, classes and
``try`` blocks, relative ones resolved against the importing module; imports in the body of an
``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) block count too, as *typing-only* arrows:
they never run, but two modules that know each other only for their types are still one knot,
so a circle closed by one is a circle (the report marks each typing-only arrow). An arrow is
typing-only when every import behind it is. Only imports of modules of the tree make arrows; an
arrow points at the deepest module of the tree the import names (``from .pkg import sub`` at
``pkg.sub`` when that is a module, else at ``pkg``).

The layering rule: an op folder's heavy modules -- every module of ``<top>.ops.<op>`` but its
``checks`` (:data:`OPEN`): ``.binder``, ``.cases``, ``.bench``, ``.kernel``, ``.parallel``,
``.reference`` and what a kernel is split into -- are imported only from inside ``<top>.ops``.
Every module below ``ops/`` (the runtime, the kernels' old import paths, the tools) reaches them
through the ``"module:attr"`` strings the op folders declare, imported with ``importlib`` where
they are used (imports by string are not arrows). The light tables -- ``<top>.ops`` itself,
``<top>.ops.base``, ``<top>.ops.<op>`` -- are the ground floor: anyone may import them, and so
``<top>.ops.<op>.checks``, the op's input checks, which kernels and backends call. Typing-only imports count here too.

Not counted: the parent packages Python runs on the way to a module (every submodule's
package runs first; counting that would make each package ``__init__`` a circle with anything
it imports), and imports by string (``importlib.import_module``).

A circle is reported as a path that comes back to where it starts, ``a -> b -> a``, with the
file and line of each arrow's first import (its first runtime import, where it has one); one per
module of each strongly connected part of the graph (the shortest circle through it), so every
module caught in one is named. A layering violation is reported as ``file:line`` with the
import and how to remove it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Circles in ``core/src`` allowed for now, each as ``(a, b, ..., a)``. Temporary entries only,
#: each naming the work that removes it; an entry that is no longer found fails the check too,
#: so that it is deleted when the circle goes.
ALLOWED: tuple[tuple[str, ...], ...] = ()

#: The modules of an op folder that anyone may import: ``checks``, the op's input checks (the
#: kernels and backends call them; ``kernels/checks.py`` is their old public path). Every other
#: module of ``<top>.ops.<op>`` (``binder``, ``cases``, ``bench``, ``kernel``, ``parallel``,
#: ``reference`` and what a kernel is split into) is heavy: only ``<top>.ops`` imports it; the
#: rest of the tree reaches it through the ``"module:attr"`` strings the op's light table declares.
OPEN = ("checks",)

#: Imports across the ops' floor allowed for now, each ``(source, target, why)``. Like
#: :data:`ALLOWED`, temporary entries only, naming the work that removes each; an entry that is
#: no longer found fails the check too.
ALLOWED_LAYERING: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class Arrow:
    """One import of a module of the tree by another: where it stands."""

    source: str
    target: str
    path: Path
    line: int
    #: Every import behind the arrow is under ``if TYPE_CHECKING:`` (it never runs).
    typing_only: bool = False


def modules(root: Path) -> dict[str, Path]:
    """Every module below ``root`` by dotted name: files in folders that are packages up to ``root``."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        folders = path.relative_to(root).parents
        # Each folder between the root and the file must be a package (have an __init__.py).
        if any(not (root / folder / "__init__.py").is_file() for folder in folders if folder != Path(".")):
            continue
        if len(parts) == 1 and parts[0] == "__init__":
            continue  # an __init__.py right at the root belongs to no package
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST, typing_only: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``node``, each with whether it is typing-only (in the body
    of an ``if TYPE_CHECKING:``; its ``else`` runs)."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node, typing_only
        return
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for child in node.body:
            yield from _imports(child, True)
        for child in node.orelse:
            yield from _imports(child, typing_only)
        return
    for node_below in ast.iter_child_nodes(node):
        yield from _imports(node_below, typing_only)


def _deepest(name: str, known: dict[str, Path]) -> str | None:
    """The longest dotted prefix of ``name`` that is a module of the tree."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in known:
            return prefix
    return None


def _targets(module: str, is_package: bool, stmt: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    if isinstance(stmt, ast.Import):
        return [t for alias in stmt.names if (t := _deepest(alias.name, known))]
    if stmt.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        if stmt.level - 1 >= len(base):
            raise SyntaxError(f"{module}: a relative import (level {stmt.level}) above the top package")
        base = base[: len(base) - (stmt.level - 1)]
        full = ".".join([*base, stmt.module] if stmt.module else base)
    else:
        full = stmt.module or ""
    found = []
    for alias in stmt.names:
        target = _deepest(f"{full}.{alias.name}", known) if alias.name != "*" else _deepest(full, known)
        if target:
            found.append(target)
    return found


def arrows(root: Path) -> list[Arrow]:
    """Every import of one module of the tree by another, in file order: one arrow per pair, at
    its first runtime import, or at its first import when all are typing-only."""
    known = modules(root)
    out: dict[tuple[str, str], Arrow] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for stmt, typing_only in sorted(_imports(tree), key=lambda s: s[0].lineno):
            for target in _targets(module, is_package, stmt, known):
                if target == module:
                    continue
                had = out.get((module, target))
                if had is None or (had.typing_only and not typing_only):
                    out[(module, target)] = Arrow(module, target, path, stmt.lineno, typing_only)
    return list(out.values())


def _heavy_op_module(name: str) -> str | None:
    """The ``<top>.ops`` package whose op folder's heavy module ``name`` is, else ``None``."""
    parts = name.split(".")
    if len(parts) >= 4 and parts[1] == "ops" and parts[3] not in OPEN:
        return ".".join(parts[:2])
    return None


def layering(found: Sequence[Arrow]) -> list[Arrow]:
    """The arrows that cross the ops' floor: into an op's heavy module (any but :data:`OPEN`) from a
    module outside its ``<top>.ops`` package."""
    out = []
    for arrow in found:
        ops = _heavy_op_module(arrow.target)
        if ops is not None and arrow.source != ops and not arrow.source.startswith(ops + "."):
            out.append(arrow)
    return out


def _strong_parts(graph: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively; only those with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        parts.append(sorted(part))
    return sorted(parts)


def _shortest_circle(start: str, graph: dict[str, list[str]], within: set[str]) -> tuple[str, ...]:
    """The shortest path from ``start`` back to itself inside one strongly connected part."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in graph[node]:
            if nxt not in within:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return (*reversed(path), start)
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is in a strongly connected part but no circle comes back to it")


def _canonical(circle: Sequence[str]) -> tuple[str, ...]:
    """A circle turned to start at its smallest module, so that one circle has one spelling."""
    ring = list(circle[:-1])
    turn = ring.index(min(ring))
    ring = ring[turn:] + ring[:turn]
    return (*ring, ring[0])


def cycles(found: Sequence[Arrow]) -> list[tuple[str, ...]]:
    """The circles of the graph ``found`` makes: for each module caught in one, the shortest
    circle through it, each circle once, starting at its smallest module."""
    graph: dict[str, list[str]] = {}
    for arrow in found:
        graph.setdefault(arrow.source, []).append(arrow.target)
        graph.setdefault(arrow.target, [])
    out: set[tuple[str, ...]] = set()
    for part in _strong_parts(graph):
        within = set(part)
        for start in part:
            out.add(_canonical(_shortest_circle(start, graph, within)))
    return sorted(out)


def describe(circle: Sequence[str], found: Sequence[Arrow], root: Path) -> str:
    """``a -> b -> a`` and, under it, the import behind each arrow."""
    where = {(a.source, a.target): a for a in found}
    lines = [" -> ".join(circle)]
    for source, target in zip(circle, circle[1:], strict=False):
        arrow = where[(source, target)]
        kind = " (typing only)" if arrow.typing_only else ""
        lines.append(f"    {source} -> {target}: {arrow.path.relative_to(root)}:{arrow.line}{kind}")
    return "\n".join(lines)


def check(
    root: Path, allowed: Iterable[Sequence[str]] = (), allowed_layering: Iterable[Sequence[str]] = ()
) -> list[str]:
    """What is wrong with the tree below ``root``: each circle not in ``allowed`` (typing-only
    arrows included), each import across the ops' floor not in ``allowed_layering`` (entries
    ``(source, target, why)``), and each allowance that is no longer needed. Empty when all is well."""
    found = arrows(root)
    circles = cycles(found)
    allow = {_canonical(c) for c in allowed}
    problems = [
        f"import cycle: {describe(circle, found, root)}\n"
        "    fix: move what both need (the shared types, say) into a module neither imports, or import "
        "the other side's module where it is used only if that does not close the circle (a "
        "typing-only import closes one too)"
        for circle in circles
        if circle not in allow
    ]
    problems += [
        f"allowed import cycle no longer found: {' -> '.join(c)}\n"
        "    fix: delete its entry from ALLOWED in tools/import_graph.py"
        for c in sorted(allow - set(circles))
    ]
    crossing = layering(found)
    allow_layer = {(entry[0], entry[1]) for entry in allowed_layering}
    problems += [
        f"{a.path.relative_to(root)}:{a.line}: {a.source} imports {a.target}, an op's heavy module, from outside "
        f"{_heavy_op_module(a.target)}{' (typing only)' if a.typing_only else ''}\n"
        "    fix: import it by the op folder's \"module:attr\" string where it is used (importlib), or move "
        "what you need into the op's light table or a module below ops/"
        for a in crossing
        if (a.source, a.target) not in allow_layer
    ]
    problems += [
        f"allowed layering exception no longer found: {source} -> {target}\n"
        "    fix: delete its entry from ALLOWED_LAYERING in tools/import_graph.py"
        for source, target in sorted(allow_layer - {(a.source, a.target) for a in crossing})
    ]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the folder holding the top packages (core/src)")
    parser.add_argument("--no-allow", action="store_true",
                        help="report the ALLOWED circles and ALLOWED_LAYERING imports too")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"{args.root} is not a folder")
    allowed = () if args.no_allow else ALLOWED
    allowed_layering = () if args.no_allow else ALLOWED_LAYERING
    problems = check(args.root, allowed, allowed_layering)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s) in the import graph of {args.root}", file=sys.stderr)
        return 1
    found = arrows(root=args.root)
    typing_only = sum(a.typing_only for a in found)
    print(f"no import cycle in {args.root} ({len(found)} imports between its modules, {typing_only} of them "
          "typing-only, counted too)"
          + "".join(f"\n    but this one, allowed for now: {' -> '.join(c)}" for c in allowed)
          + "\nno import of an op's heavy module from outside ops/"
          + "".join(f"\n    but this one, allowed for now: {s} -> {t} ({why})" for s, t, why in allowed_layering))
    return 0


if __name__ == "__main__":
    sys.exit(main())
