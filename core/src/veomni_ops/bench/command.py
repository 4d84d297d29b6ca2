"""The ``veomni-ops bench`` command: its options and what it does with them."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from ..spec import OPS
from .loop import run_bench
from .merge import merge_results
from .plot import matplotlib_problem, plot
from .render import default_json_path, render_text, write_results
from .workloads import CPU_DEFAULT, GPU_DEFAULT, PASSES, PRESETS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Benchmark every usable kernel of each op against eager at named shapes."
    parser.add_argument("--op", choices=list(OPS), help="only this op")
    parser.add_argument("--preset", action="append", metavar="NAME",
                        help=f"preset (repeatable): {', '.join(PRESETS)}; default: {', '.join(CPU_DEFAULT)} on the "
                             f"CPU, {', '.join(GPU_DEFAULT)} on GPUs")
    parser.add_argument("--backend", help="only this backend's kernels (eager is always run as the baseline)")
    parser.add_argument("--pass", dest="passes", action="append", choices=PASSES, help="only this pass (repeatable)")
    parser.add_argument("--json", nargs="?", const="auto", metavar="FILE",
                        help="write the result as JSON (and FILE.md beside it); without FILE: "
                             "benchmarks/results/<device>-<date>.json")
    parser.add_argument("--plot", metavar="FILE.png", help="write a chart (needs matplotlib)")
    parser.add_argument("--from", dest="from_file", action="append", metavar="FILE.json",
                        help="do not run: render a saved result (table, --plot, .md with --json); repeated: merge "
                             "runs made on one device (a long run split by --preset/--op) into one result")
    parser.add_argument("--warmup-ms", type=float, default=50.0, help="warm-up per measurement (default 50)")
    parser.add_argument("--rep-ms", type=float, default=300.0, help="repeat time per measurement (default 300)")
    parser.add_argument("--list", action="store_true", help="list the presets and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name, (desc, _) in PRESETS.items():
            print(f"{name:12} {desc}")
        return 0
    if args.plot:
        problem = matplotlib_problem()
        if problem:
            print(f"veomni-ops bench: {problem}", file=sys.stderr)
            return 2
    if args.from_file:
        files = [args.from_file] if isinstance(args.from_file, str) else list(args.from_file)
        docs = []
        for f in files:
            try:
                with open(f) as fh:
                    docs.append(json.load(fh))
            except (OSError, ValueError) as e:
                print(f"veomni-ops bench: cannot read --from {f}: {e}", file=sys.stderr)
                return 2
        try:
            result = merge_results(docs, files)
        except ValueError as e:
            print(f"veomni-ops bench: {e}", file=sys.stderr)
            return 2
    else:
        command = "veomni-ops " + " ".join(shlex.quote(a) for a in (getattr(args, "argv", None) or sys.argv[1:]))
        save = None
        if args.json and args.json != "auto":
            def save(doc: dict[str, Any], path: str = args.json) -> None:
                write_results(doc, path)
        result = run_bench(checkpoint=save, presets=args.preset, op=args.op, backend=args.backend,
                           passes=tuple(args.passes) if args.passes else PASSES,
                           registry=getattr(args, "registry", None), warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                           progress=not args.quiet, command=command)
    print(render_text(result))
    if args.json:
        path = default_json_path(result) if args.json == "auto" else args.json
        jpath, md = write_results(result, path)
        print(f"wrote {jpath} and {md}")
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    errors = [r for r in result["rows"]
              if r.get("error") and r.get("wall_ms") is None and r["error"] != "out of memory"]
    if errors:
        print(f"veomni-ops bench: {len(errors)} measurement(s) failed (see the error column)", file=sys.stderr)
    return 0
