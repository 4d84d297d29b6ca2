"""Merging results of several runs on one device (a long benchmark split to fit a time limit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .loop import add_speedups
from .render import kernel_cell, shape_text

#: a peer may share a registered kernel's name (``liger`` and ``liger (peer)``): ``peer`` tells them apart
_ROW_KEY = ("preset", "op", "variant", "kernel", "peer", "pass", "dtype")


def merge_results(docs: Sequence[dict[str, Any]], names: Sequence[str] | None = None) -> dict[str, Any]:
    """One result from several runs on one device (a long benchmark split to fit a time limit).

    Refuses (``ValueError`` naming the files) to merge runs from different devices, library
    versions or timing settings, or two runs that measured the same row. Each part's command,
    start and ceilings are kept under ``parts``; every row records its ``part``."""
    if not docs:
        raise ValueError("nothing to merge")
    if len(docs) == 1:
        return docs[0]
    names = list(names) if names else [f"result {i + 1}" for i in range(len(docs))]
    first = docs[0]
    for name, d in zip(names[1:], docs[1:]):
        for key, what in (("device_name", "device"), ("capability", "compute capability"),
                          ("versions", "library versions"), ("timing", "timing settings"),
                          ("environment", "environment variables")):
            if d.get(key) != first.get(key):
                detail = ""
                if key in ("versions", "environment"):
                    a, b = first.get(key) or {}, d.get(key) or {}
                    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                    detail = ": " + ", ".join(f"{k} {a.get(k)} vs {b.get(k)}" for k in diff)
                else:
                    detail = f": {first.get(key)!r} vs {d.get(key)!r}"
                raise ValueError(f"cannot merge {names[0]} and {name}: they differ in {what}{detail}. "
                                 "Merge only runs from one machine and one installation, made with the same "
                                 "--warmup-ms/--rep-ms")
    rows: list[dict[str, Any]] = []
    seen: dict[tuple, str] = {}
    for i, (run_name, d) in enumerate(zip(names, docs)):
        for r in d.get("rows", []):
            row_key = tuple(str(bool(r.get(k)) if k == "peer" else r.get(k)) for k in _ROW_KEY) \
                + (shape_text(r.get("shape", {})),)
            if row_key in seen:
                raise ValueError(f"cannot merge: {run_name} and {seen[row_key]} both measured "
                                 f"{r['preset']} {r['op']}/{r['variant']} {kernel_cell(r)} {r['pass']}; "
                                 "split the runs by --preset or --op so each row is measured once")
            seen[row_key] = run_name
            rows.append({**r, "part": i})
    add_speedups(rows)
    presets: dict[str, str] = {}
    peers: dict[tuple[str, str, str], dict[str, Any]] = {}
    for d in docs:
        presets.update(d.get("presets", {}))
        for p in d.get("peers", []):
            peers.setdefault((p["op"], p["variant"], p["kernel"]), p)
    return {
        **{k: first.get(k) for k in ("device", "device_name", "capability", "date", "started", "timing",
                                     "formulas", "versions", "environment", "ceilings")},
        "command": " && ".join(d.get("command", "") for d in docs),
        "partial": any(d.get("partial") for d in docs),
        "presets": presets,
        "parts": [{"command": d.get("command", ""), "started": d.get("started"), "partial": bool(d.get("partial")),
                   "ceilings": d.get("ceilings", {})} for d in docs],
        "rows": rows,
        "skipped": [s for d in docs for s in d.get("skipped", [])],
        "peers": list(peers.values()),
    }
