"""The README's tables of measured speed hold what the committed result files hold (issue 32).

A table with a ``files`` column is one of measurements. Each of its rows names the JSON files its
figures come from (paths under ``benchmarks/results/``, written as their unique ending there:
``callA-x2/cli-one.json``), and then:

- every ``tokens/s`` and ``against`` figure (``196.7k``) is the ``tokens_per_s`` of a run in those
  files, to the digits shown;
- every ``ratio`` (``1.22x``) is its row's ``tokens/s`` over its ``against``, to the digits shown;
  several figures in a cell (``87.8k / 88.0k``) pair up in order, and one figure pairs with each
  of the other side's.

A claim no committed file holds (issue 32: "``train.compile`` under dp2 = 0.60x eager", whose run's
files never came back) has no file to name, and fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
RESULTS = REPO / "benchmarks" / "results"

_FIGURE = re.compile(r"(\d+(?:\.\d+)?)k\b")
_RATIO = re.compile(r"(\d+(?:\.\d+)?)x\b")


def measured_tables(markdown: str) -> list[tuple[int, list[str], list[tuple[int, list[str]]]]]:
    """(line, header cells, [(line, cells)]) of every table whose header has a ``files`` column."""
    tables = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        cells = _cells(lines[i])
        if cells and any(c.lower().startswith("files") for c in cells) and i + 1 < len(lines) \
                and set(lines[i + 1].strip()) <= set("|-: "):
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                rows.append((j + 1, _cells(lines[j])))
                j += 1
            tables.append((i + 1, cells, rows))
            i = j
        else:
            i += 1
    return tables


def _cells(line: str) -> list[str]:
    line = line.strip()
    if not line.startswith("|"):
        return []
    return [c.strip() for c in line.strip("|").split("|")]


def result_file(name: str) -> Path:
    """The one file under benchmarks/results/ whose path ends with ``name``."""
    found = [p for p in RESULTS.rglob(Path(name).name) if p.as_posix().endswith("/" + name.lstrip("/"))]
    assert len(found) == 1, (f"{name} must name exactly one file under benchmarks/results/; "
                             f"it names {len(found)}: {found}")
    return found[0]


def tokens_per_s(data: Any) -> list[float]:
    """Every ``tokens_per_s`` in a result document (a run, or a comparison's runs)."""
    if isinstance(data, dict):
        own = [float(data["tokens_per_s"])] if isinstance(data.get("tokens_per_s"), (int, float)) else []
        return own + [v for key, value in data.items() if key != "tokens_per_s" for v in tokens_per_s(value)]
    if isinstance(data, list):
        return [v for item in data for v in tokens_per_s(item)]
    return []


def _shown(value: float, text: str) -> bool:
    """``value`` rounds to ``text`` at the digits ``text`` shows."""
    digits = len(text.split(".")[1]) if "." in text else 0
    return round(value, digits) == float(text)


def check_row(header: list[str], cells: list[str], where: str) -> None:
    col = {name.split()[0].lower().strip("()"): i for i, name in enumerate(header)}
    assert {"tokens/s", "against", "ratio", "files"} <= set(col), f"{where}: columns {header}"
    assert len(cells) == len(header), f"{where}: {len(cells)} cells under {len(header)} columns"
    names = re.findall(r"`([^`]+\.json)`", cells[col["files"]])
    assert names, f"{where}: the row names no committed file its figures come from"
    runs = [v for name in names for v in tokens_per_s(json.loads(result_file(name).read_text()))]
    assert runs, f"{where}: {names} hold no tokens_per_s"

    def figures(cell: str) -> list[float]:
        """The runs' own values behind the cell's figures (the ratios are of those, not of the rounded)."""
        out = []
        for text in _FIGURE.findall(cells[col[cell]]):
            match = [v for v in runs if _shown(v / 1000, text)]
            assert match, (f"{where}: {text}k ({cell}) is no run's tokens_per_s in {names}: "
                           f"{sorted(round(v / 1000, 1) for v in runs)}")
            out.append(match[0])
        return out

    mine, against = figures("tokens/s"), figures("against")
    ratios = _RATIO.findall(cells[col["ratio"]])
    assert mine, f"{where}: no tokens/s figure"
    if not ratios:
        assert not against, f"{where}: a figure to compare against, and no ratio"
        return
    n = len(ratios)
    assert len(mine) in (1, n) and len(against) in (1, n), (
        f"{where}: {n} ratio(s) for {len(mine)} figure(s) over {len(against)}: pair them up in order")
    for k, ratio in enumerate(ratios):
        a, b = mine[k % len(mine)], against[k % len(against)]
        assert _shown(a / b, ratio), f"{where}: {ratio}x, but {a / 1000:.1f}k / {b / 1000:.1f}k = {a / b:.4f}"


def _rows() -> list[Any]:
    out = []
    for line, header, rows in measured_tables(README.read_text(encoding="utf-8")):
        out += [pytest.param(f"README.md:{row_line} (table at line {line})", header, cells, id=f"line{row_line}")
                for row_line, cells in rows]
    return out


def test_the_readme_has_a_measured_speed_table() -> None:
    assert _rows(), "README.md has no table with a files column: the parallel section's speed table has one"


@pytest.mark.parametrize("where, header, cells", _rows())
def test_each_figure_is_its_committed_files(where: str, header: list[str], cells: list[str]) -> None:
    check_row(header, cells, where)


@pytest.mark.parametrize("cells, why", [
    # session 8's claim: a figure whose run's files never came back
    (["`dp_shard: 2` + `train.compile`", "small", "E", "146.6k", "eager dp2 244.7k", "0.60x", ""],
     "names no committed file"),
    (["`dp_shard: 2` + `train.compile`", "small", "F", "146.6k", "eager dp2 234.3k", "0.63x",
      "`callF-h200x4/x2/cli-dp2-compile.json`, `callF-h200x4/x2/cli-dp2.json`"], "146.6k (tokens/s) is no run's"),
    (["`dp_shard: 2` + `train.compile`", "small", "F", "252.1k", "eager dp2 234.3k", "0.60x",
      "`callF-h200x4/x2/cli-dp2-compile.json`, `callF-h200x4/x2/cli-dp2.json`"], "0.60x, but"),
    (["one GPU", "small", "A", "161.5k", "", "", "`cli-one.json`"], "exactly one file"),
])
def test_a_figure_without_its_file_fails(cells: list[str], why: str) -> None:
    header = ["run", "model", "call", "tokens/s", "against (same call)", "ratio", "files"]
    with pytest.raises(AssertionError, match=re.escape(why)):
        check_row(header, cells, "example")
