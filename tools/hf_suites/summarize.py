"""Counts and bound-only failures from the JUnit XML files ``run.sh`` writes.

    python summarize.py OUT_DIR [--against OTHER_OUT_DIR]

Reads ``OUT_DIR/<model>-plain.xml`` and ``OUT_DIR/<model>-bound.xml``; prints, per model, passed /
failed / skipped / errors for each mode, then every test that passes plain and fails (or errors)
bound (and every one it skips bound), with the first line of its message. ``--against`` takes the plain results from another run.
"""

from __future__ import annotations

import argparse
import re
import xml.etree.ElementTree as ET
from pathlib import Path

KINDS = ("passed", "failed", "skipped", "errors")


def outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, one-line message)."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = f"{case.get('classname', '')}::{case.get('name', '')}"
        kind, msg = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                k = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                m = (child.get("message") or child.text or "").strip()
                first = m.splitlines()[0] if m else ""
                # a failure beats an error beats a skip (a call failure with a teardown error is a failure)
                if kind == "passed" or KINDS.index(k) < KINDS.index(kind) or (kind == "skipped"):
                    kind, msg = k, first
        out[tid] = (kind, re.sub(r"\s+", " ", msg)[:300])
    return out


def counts(res: dict[str, tuple[str, str]]) -> dict[str, int]:
    c = dict.fromkeys(KINDS, 0)
    for kind, _ in res.values():
        c[kind] += 1
    return c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--against", type=Path, help="take the plain results from this run's folder")
    a = ap.parse_args()
    models = sorted({p.name.rsplit("-", 1)[0] for p in a.out_dir.glob("*-bound.xml")}
                    | {p.name.rsplit("-", 1)[0] for p in a.out_dir.glob("*-plain.xml")})
    print("| model | mode | passed | failed | skipped | errors |")
    print("|---|---|---|---|---|---|")
    regressions: list[tuple[str, str, str]] = []
    hidden: list[tuple[str, str, str]] = []
    for m in models:
        plain_xml = (a.against or a.out_dir) / f"{m}-plain.xml"
        bound_xml = a.out_dir / f"{m}-bound.xml"
        plain = outcomes(plain_xml) if plain_xml.exists() else {}
        bound = outcomes(bound_xml) if bound_xml.exists() else {}
        for mode, res in (("plain", plain), ("bound", bound)):
            if res:
                c = counts(res)
                print(f"| {m} | {mode} | " + " | ".join(str(c[k]) for k in KINDS) + " |")
        for tid, (kind, msg) in sorted(bound.items()):
            if plain.get(tid, ("",))[0] == "passed":
                if kind in ("failed", "errors"):
                    regressions.append((tid, kind, msg))
                elif kind == "skipped":
                    hidden.append((tid, kind, msg))
    print(f"\npasses plain, fails bound: {len(regressions)}")
    for tid, kind, msg in regressions:
        print(f"- {tid} [{kind}] {msg}")
    print(f"\npasses plain, skipped bound: {len(hidden)}")
    for tid, kind, msg in hidden:
        print(f"- {tid} [{kind}] {msg}")


if __name__ == "__main__":
    main()
