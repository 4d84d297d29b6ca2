"""Rendering a result: the text table ``veomni-ops bench`` prints, and the Markdown written
beside the JSON."""

from __future__ import annotations

import json
import os
from typing import Any

from .timing import NO_SHARE, WALL_FLUSHED


def shape_text(shape: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def _fmt(x: Any, spec: str = ".3f") -> str:
    if x is None:
        return "-"
    return format(x, spec)


def row_ceilings(result: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
    """The ceilings measured in the run that produced ``r`` (a merged result keeps each part's)."""
    parts = result.get("parts")
    if parts and r.get("part") is not None:
        return parts[r["part"]].get("ceilings", {})
    return result.get("ceilings", {})


def rate_cells(r: dict[str, Any], ceilings: dict[str, Any]) -> tuple[str, str]:
    if r.get("tbps") is not None:
        c = ceilings.get("copy_tbps")
        return f"{r['tbps']:.3g} TB/s", (f"{100 * r['tbps'] / c:.0f}%" if c else "-")
    if r.get("tflops") is not None:
        c = ceilings.get("matmul_tflops")
        return f"{r['tflops']:.3g} TFLOP/s", (f"{100 * r['tflops'] / c:.0f}%" if c else "-")
    return "-", "-"


def share_refused(result: dict[str, Any]) -> str | None:
    """Why ``result``'s rows get no share of its ceilings (None: they do). Only a run whose calls
    were timed with the caches flushed (CUDA) compares with a ceiling measured through memory; a
    run timed warm (the CPU) read its small workloads from cache, past the ceiling."""
    return None if (result.get("timing") or {}).get("wall") == WALL_FLUSHED else NO_SHARE


def row_cells(result: dict[str, Any], r: dict[str, Any]) -> tuple[str, str]:
    """The rate and "of ceiling" cells of ``r`` in ``result``: an error where it has no time, "-"
    for the share where the run gives none (:func:`share_refused`)."""
    if r.get("error") and r.get("wall_ms") is None:
        return f"error: {r['error']}", "-"
    rate, frac = rate_cells(r, row_ceilings(result, r))
    return rate, "-" if share_refused(result) else frac


TABLE_HEAD = ("preset", "op", "variant", "pass", "kernel", "dtype", "wall ms", "kernel ms", "rate", "of ceiling",
              "peak GiB", "extra GiB", "vs eager")


def kernel_cell(r: dict[str, Any]) -> str:
    """The kernel column: a peer (another project's kernel, not registered) says so."""
    return f"{r['kernel']} (peer)" if r.get("peer") else r["kernel"]


def vs_eager_cell(result: dict[str, Any], r: dict[str, Any]) -> str:
    """The speed-up over eager; ``(wall)`` where it compares wall times in a run that has kernel times
    (one of the two rows has none), so a reader knows which number it is."""
    vs = r.get("vs_eager")
    if not vs:
        return "-"
    wall = r.get("vs_eager_on") == "wall_ms" and (result.get("timing") or {}).get("kernel")
    return f"{vs:.2f}x" + (" (wall)" if wall else "")


VS_EAGER = ("vs eager: eager's time over the row's, kernel time where both rows have it (CUDA), wall time "
            "otherwise (marked \"(wall)\" in a run with kernel times).")


def peer_lines(result: dict[str, Any]) -> list[str]:
    """One line per peer of the run: how it is called and what its numbers include."""
    return [f"{p['kernel']} (peer) {p['op']}/{p['variant']} ({p['distribution']} {p['version']}): {p['about']}"
            for p in result.get("peers", [])]


def table_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for r in result["rows"]:
        rate, frac = row_cells(result, r)
        rate = rate[:60]
        out.append((r["preset"], r["op"], r["variant"], r["pass"], kernel_cell(r), r["dtype"],
                    _fmt(r["wall_ms"]), _fmt(r["kernel_ms"]), rate, frac, _fmt(r["peak_gib"], ".2f"),
                    _fmt(r.get("extra_gib"), ".3f"), vs_eager_cell(result, r)))
    return out


def render_text(result: dict[str, Any]) -> str:
    c = result.get("ceilings", {})
    lines = [f"veomni-ops bench on {result['device_name']} ({result['device']}), {result['date']}",
             f"ceilings: copy {_fmt(c.get('copy_tbps'), '.3g')} TB/s, matmul {_fmt(c.get('matmul_tflops'), '.3g')} "
             f"TFLOP/s ({c.get('matmul', '')})"]
    rows = [TABLE_HEAD] + table_rows(result)
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEAD))]
    for i, r in enumerate(rows):
        lines.append("  ".join(x.ljust(wd) for x, wd in zip(r, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * wd for wd in widths))
    for s in result.get("skipped", []):
        lines.append(f"skipped {s['preset']} {s['op']}/{s['variant']} {kernel_cell(s)}: {s['reason']}")
    lines.append(VS_EAGER)
    if share_refused(result):
        lines.append(f"of ceiling: {share_refused(result)}.")
    lines += peer_lines(result)
    return "\n".join(lines)


def render_markdown(result: dict[str, Any]) -> str:
    c = result.get("ceilings", {})
    t = result.get("timing", {})
    lines = [
        f"# veomni-ops bench: {result['device_name']} ({result['device']}), {result['date']}",
        "",
        f"Command: `{result.get('command', '')}`",
        "",
        f"Ceilings measured in the same run: device-to-device copy {_fmt(c.get('copy_tbps'), '.3g')} TB/s "
        f"(bytes read + written), matmul {_fmt(c.get('matmul_tflops'), '.3g')} TFLOP/s ({c.get('matmul', '')}).",
        f"Timing: median wall time ({t.get('wall')}; warm-up {t.get('warmup_ms')} ms, repeats {t.get('rep_ms')} ms)"
        + (f"; kernel time: {t['kernel']}" if t.get("kernel") else "; no kernel time off CUDA") + ".",
        "",
        "Peak GiB: the largest allocation during one call, inputs included; extra GiB: beyond the inputs "
        "and the gradients the call returns. A (peer) row is another project's kernel as its users call it "
        "(not a registered kernel); the Peers list below says how each is called and what its numbers include.",
        "",
        VS_EAGER,
        "",
        *([f"Of ceiling: {share_refused(result)}.", ""] if share_refused(result) else []),
        "Versions: " + ", ".join(f"{k} {v}" for k, v in result.get("versions", {}).items()),
        "",
    ]
    if result.get("environment"):
        lines += ["Environment: " + ", ".join(f"`{k}={v}`" for k, v in result["environment"].items()), ""]
    if result.get("parts"):
        lines += [f"Merged from {len(result['parts'])} runs on this device (`--from` repeated); each row's "
                  "\"of ceiling\" uses the ceilings measured in its own run:", ""]
        for i, part in enumerate(result["parts"]):
            pc = part.get("ceilings", {})
            lines.append(f"{i + 1}. `{part.get('command', '')}` ({part.get('started', '')}; copy "
                         f"{_fmt(pc.get('copy_tbps'), '.3g')} TB/s, matmul {_fmt(pc.get('matmul_tflops'), '.3g')} "
                         f"TFLOP/s{'; cut short' if part.get('partial') else ''})")
        lines.append("")
    by_preset: dict[str, list[dict[str, Any]]] = {}
    for r in result["rows"]:
        by_preset.setdefault(r["preset"], []).append(r)
    for preset, rows in by_preset.items():
        desc = result.get("presets", {}).get(preset, "")
        lines += [f"## {preset}", "", desc, ""]
        head = ("op", "variant", "shape", "pass", "kernel", "wall ms", "kernel ms", "rate", "of ceiling",
                "peak GiB", "extra GiB", "vs eager")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in rows:
            rate, frac = row_cells(result, r)
            cells = (r["op"], r["variant"], f"{shape_text(r['shape'])} {r['dtype']}", r["pass"],
                     f"{kernel_cell(r)} ({r['distribution']} {r['version']})", _fmt(r["wall_ms"]),
                     _fmt(r["kernel_ms"]), rate, frac, _fmt(r["peak_gib"], ".2f"), _fmt(r.get("extra_gib"), ".3f"),
                     vs_eager_cell(result, r))
            lines.append("| " + " | ".join(str(x).replace("|", "/") for x in cells) + " |")
        lines.append("")
    if result.get("peers"):
        lines += ["## Peers", ""]
        lines += [f"- {x}" for x in peer_lines(result)]
        lines.append("")
    if result.get("skipped"):
        lines += ["## Not run here", ""]
        lines += [f"- {s['preset']} {s['op']}/{s['variant']} `{kernel_cell(s)}` ({s['distribution']}): {s['reason']}"
                  for s in result["skipped"]]
        lines.append("")
    lines += ["## Formulas (minimal bytes or FLOPs per call; s = bytes per element)", ""]
    lines += [f"- {k}: {v}" for k, v in result.get("formulas", {}).items()]
    return "\n".join(lines) + "\n"


def default_json_path(result: dict[str, Any]) -> str:
    return os.path.join("benchmarks", "results", f"{result['device']}-{result['date']}.json")


def write_results(result: dict[str, Any], path: str) -> tuple[str, str]:
    """Write ``path`` (JSON) and the Markdown rendering beside it (``.md``)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    md = os.path.splitext(path)[0] + ".md"
    with open(md, "w") as fh:
        fh.write(render_markdown(result))
    return path, md
