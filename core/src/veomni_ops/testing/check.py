"""``veomni-ops check``: every usable kernel against the core's eager reference, in float64.

    veomni-ops check                          every kernel usable here, every op
    veomni-ops check --backend liger          one backend (kernel name, entry point or distribution)
    veomni-ops check --op rms_norm --json     one op, machine-readable
    veomni-ops check --plugin my_pkg.specs    also load a spec module that is not installed yet
    veomni-ops check --op rms_norm --case rows-3x17   one case (by its name: `-v` lists them)
    veomni-ops check --backend liger --compile   also torch.compile(fullgraph=True) each kernel
    veomni-ops check --backend triton --deterministic   also bitwise the same on a second run

Each kernel is resolved by name exactly as a config would select it (``load=True``); one
that cannot be had here is listed as skipped with the reason. Every usable one is run on
each dtype it declares over the op's conformance cases (:mod:`veomni_ops.testing.cases`),
forward and backward. Exit status 1 if any kernel fails (or nothing matched), else 0.

Module-level imports stay light: the CLI imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sys
from typing import Any

from ..spec import DTYPES, OPS

SIZES = ("small", "full")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Check every usable kernel against the eager reference evaluated in float64."
    parser.add_argument("--backend", help="only kernels of this backend: kernel name, entry point or distribution")
    parser.add_argument("--op", choices=list(OPS), help="only this op")
    parser.add_argument("--device", help="resolve for this device (e.g. cuda:9.0, cpu); default: this machine's. "
                                         "A device this machine lacks runs only under TRITON_INTERPRET=1")
    parser.add_argument("--size", choices=SIZES, help="case shapes: small (default on CPU and under "
                                                      "TRITON_INTERPRET=1) or full (default on GPUs)")
    parser.add_argument("--dtype", action="append", choices=[d for d in DTYPES], metavar="DTYPE",
                        help="only this dtype (repeatable); default: every dtype each kernel declares")
    parser.add_argument("--seed", type=int, help="seed of the random inputs (default: fresh, printed)")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="also load this spec module as a plugin (e.g. a backend not installed yet)")
    parser.add_argument("--case", action="append", metavar="NAME",
                        help="only the cases of this name (repeatable; `-v` lists the names)")
    parser.add_argument("--compile", action="store_true",
                        help="also run each checked kernel under torch.compile(fullgraph=True) against its uncompiled "
                             "result: a kernel declaring supports_compile=True fails if it breaks; for one declaring "
                             "False the outcome is reported (could it declare True?)")
    parser.add_argument("--deterministic", action="store_true",
                        help="also run every case twice on the same inputs: a kernel whose outputs or gradients "
                             "differ in any bit fails (for kernels that promise determinism)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every case, not only failures")


def extra_plugins(names: list[str]) -> list[tuple[str, Any]]:
    """``(name, module)`` for each spec module given by import path, skipping any module an
    installed entry point already provides (it would otherwise register twice)."""
    from importlib import metadata

    from ..hookspecs import ENTRY_POINT_GROUP

    installed = {ep.value.split(":")[0] for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    out = []
    for name in names:
        if name in installed:
            continue
        out.append((name.split(".")[0].replace("_", "-"), importlib.import_module(name)))
    return out


def _progress():
    if not sys.stderr.isatty():
        return None
    width = 100

    def show(msg: str) -> None:
        sys.stderr.write("\r" + ("checking " + msg)[:width].ljust(width))
        sys.stderr.flush()

    return show


def run(args: argparse.Namespace) -> int:
    from ..discovery import build_registry, discover
    from .runner import run_checks

    registry = getattr(args, "registry", None)
    if registry is None:
        plugins = extra_plugins(getattr(args, "plugin", None) or [])
        registry = build_registry(plugins) if plugins else discover()
    seed = args.seed if getattr(args, "seed", None) is not None else random.SystemRandom().randrange(2**31)
    show = None if args.json else _progress()
    report = run_checks(registry, backend=args.backend, op=args.op, device=args.device,
                        size=getattr(args, "size", None), dtypes=getattr(args, "dtype", None), seed=seed,
                        progress=show, cases=getattr(args, "case", None),
                        compile=bool(getattr(args, "compile", False)),
                        deterministic=bool(getattr(args, "deterministic", False)))
    if show:
        sys.stderr.write("\r" + " " * 100 + "\r")
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif report.kernels:
        print(report.table(verbose=getattr(args, "verbose", False)))
    if not report.kernels:
        what = " and ".join(x for x in (f"backend {args.backend!r}" if args.backend else "",
                                          f"op {args.op!r}" if args.op else "") if x) or "anything"
        hint = ""
        if report.load_failures:
            hint = " Plugins failed to load: " + "; ".join(report.load_failures)
        print(f"veomni-ops check: no registered kernel matches {what}.{hint} "
              "(`veomni-ops plugins` lists what is installed)", file=sys.stderr)
        return 1
    if not report.checked:
        # Not a failure (a GPU backend on a CPU machine), but say so: nothing was verified.
        print("veomni-ops check: warning: no matching kernel can run here, nothing was checked "
              "(every one was skipped; see the reasons)", file=sys.stderr)
        return 0
    if report.failed:
        names = ", ".join(f"{k.op}/{k.variant} {k.kernel}" for k in report.failed)
        env = "TRITON_INTERPRET=1 " if os.environ.get("TRITON_INTERPRET") else ""
        print(f"veomni-ops check: {len(report.failed)} kernel(s) FAILED: {names}. "
              f"Reproduce with: {env}veomni-ops check --seed {seed} ...", file=sys.stderr)
        return 1
    return 0
