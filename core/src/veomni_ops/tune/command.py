"""The ``veomni-ops tune`` command: its options, the dry run, and the report of a tune."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

from ..device import detected_device, is_local
from ..lock import PlanLock
from ..plan import text_columns
from ..spec import OPS
from ..train.job import TrainConfigError, load_job
from .setup import TuneSetup, default_out, setup
from .tuner import MIN_GAIN, STEPS, WARMUP, ProcessTimer, StepTimer, Tuner, TuneWarning, read_side, side_path

#: How a trial is timed, in words (recorded in the lock's ``method``).
WHAT = ("per trial, a fresh model of the job (its seed, data, batch, dtype and mode) trains warm-up + timed steps of "
        "forward, backward and AdamW; the wall time of each timed step (it ends with the loss read back); the "
        "median. A candidate is timed with every other op at its static auto choice; its losses must agree with "
        "the static plan's")
#: Where the trials run (the lock's ``method``: ``trials``), by ``--in-process``.
WHERE = {False: "each trial in a fresh Python process of its own: nothing an earlier trial left in memory (the "
                "allocator's cache, compiled graphs, garbage) moves its step",
         True: "every trial in the tune's own process (--in-process)"}


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return n


def _gain(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not (0 <= x < 1):
        raise argparse.ArgumentTypeError(f"expected a relative gain in [0, 1) (e.g. 0.01 for 1%), got {text!r}")
    return x


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="job YAML of veomni-ops train (the model, its shapes, dtype and mode come from it)")
    p.add_argument("--out", metavar="LOCK.json", help="where to write the plan lock (default: the job's lock: key, "
                                                      "else JOB.lock.json beside the YAML)")
    p.add_argument("--steps", type=_count, default=STEPS, metavar="N",
                   help=f"timed training steps per trial (default {STEPS})")
    p.add_argument("--warmup", type=_count, metavar="N",
                   help=f"untimed steps per trial before them (default {WARMUP}, {WARMUP + 1} in compile mode)")
    p.add_argument("--min-gain", type=_gain, default=MIN_GAIN, metavar="F",
                   help=f"a candidate replaces the static choice only when its step is this much faster (default "
                        f"{MIN_GAIN:g}: 1%%)")
    p.add_argument("--op", action="append", default=[], metavar="OP",
                   help=f"tune only this op (repeatable; the others keep the static choice): {', '.join(OPS)}")
    p.add_argument("--fresh", action="store_true", help="time everything again, ignoring the measurements an "
                                                        "interrupted tune kept (LOCK.json.partial)")
    p.add_argument("--in-process", action="store_true",
                   help="time every trial in this process, not each in a fresh Python process of its own (the "
                        "default: what an earlier trial leaves in memory, the allocator's cache, compiled graphs, "
                        "garbage, can move a step by more than the differences a tune looks for; a process costs "
                        "a few seconds of start-up per trial, not timed)")
    p.add_argument("--dry-run", action="store_true", help="print what would be timed, and exit")
    p.add_argument("--json", action="store_true", help="print the lock (or, with --dry-run, the trials) as JSON on "
                                                       "stdout; the report goes to stderr")


def _setup(args: argparse.Namespace) -> TuneSetup:
    if args.steps < 1:
        raise TrainConfigError("--steps: a tune needs at least 1 timed step per trial")
    unknown = [op for op in args.op if op not in OPS]
    if unknown:
        raise TrainConfigError(f"--op {', '.join(unknown)}: no such op; the ops: {', '.join(OPS)}")
    # Read as a job for any machine: a dry run may plan for another device, and a real tune
    # refuses a device that is not this machine's below, saying so.
    job = load_job(args.config, here=False)
    s = setup(job)
    if args.op:
        s = dataclasses.replace(s, requests=tuple(r for r in s.requests if r.op in args.op))
    return s


def _warmup(args: argparse.Namespace, s: TuneSetup) -> int:
    return args.warmup if args.warmup is not None else WARMUP + (1 if s.compile else 0)


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """A tune's warnings on stderr, one line each, as the other commands print theirs."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", TuneWarning)
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, TuneWarning):
                print(f"veomni-ops tune: warning: {message}", file=sys.stderr)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def run(args: argparse.Namespace) -> int:
    with _one_line_warnings():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    s = _setup(args)
    out = args.out or default_out(s.job)
    warmup = _warmup(args, s)
    human = sys.stderr if args.json else sys.stdout
    if args.dry_run:
        dry_run(s, out, args.steps, warmup, args.fresh, human, in_process=args.in_process, min_gain=args.min_gain)
        if args.json:
            print(json.dumps(trials_json(s, out, args.steps, warmup), indent=2))
        return 0
    if not is_local(s.device):
        source = "" if s.device.from_env else f" (the job's train.device: {s.job['train']['device']})"
        raise TrainConfigError(f"veomni-ops tune times kernels on this machine, and the plan's device "
                               f"{s.device.describe()}{source} is not this machine's ({detected_device()}); run it "
                               "there, or pass --dry-run to see what it would time there")
    method = _method(args.steps, warmup, args.in_process, args.min_gain)
    _print_head(s, out, human)
    timer = (StepTimer if args.in_process else ProcessTimer)(s, args.steps, warmup)
    tuner = Tuner(s, out, timer, min_gain=args.min_gain, method=method, fresh=args.fresh)
    lock = tuner.run()
    report(lock, s, out, human)
    if args.json:
        print(json.dumps(_finite(lock.to_dict()), indent=2))
    return 0


def _method(steps: int, warmup: int, in_process: bool, min_gain: float) -> dict[str, Any]:
    """How the trials are timed and chosen (the lock's ``method``, as :class:`Tuner` records it;
    part of what a resumed tune must share)."""
    return {"what": WHAT, "trials": WHERE[in_process], "timed_steps": steps, "warmup_steps": warmup,
            "min_gain": min_gain}


def _kept(s: TuneSetup, out: str, method: dict[str, Any], stream: TextIO) -> dict[str, Any]:
    """The measurements an interrupted tune left that a tune with these settings would resume (as
    :class:`Tuner` decides: the same job, device, versions and method), else none, saying why."""
    side = side_path(out)
    data = read_side(side) or {}
    if not data:
        return {}
    header = {**s.fingerprint(), "method": method}
    differs = sorted(k for k in header if data.get("header", {}).get(k) != header[k])
    if differs:
        print(f"{side}: not resumed, its measurements were made under another {', '.join(differs)}", file=stream)
        return {}
    return dict(data.get("measurements", {}))


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _print_head(s: TuneSetup, out: str, stream: TextIO) -> None:
    sh = s.shapes
    print(f"tune {s.job['path']}: {s.device}" + (f" ({s.device.name})" if s.device.name else "")
          + f", {s.mode} mode, {s.dtype}, batch {sh['batch_size']} x seq {sh['seq_len']} = {sh['tokens_per_step']} "
            "tokens/step", file=stream)
    print(f"lock: {out}", file=stream)


def dry_run(s: TuneSetup, out: str, steps: int, warmup: int, fresh: bool, stream: TextIO, *,
            in_process: bool = False, min_gain: float = MIN_GAIN) -> None:
    """What a tune of ``s`` would time, in words (nothing is built on the device, nothing timed)."""
    _print_head(s, out, stream)
    kept = {} if fresh else _kept(s, out, _method(steps, warmup, in_process, min_gain), stream)
    print(f"method: {WHAT}; {WHERE[in_process]}", file=stream)
    trials = s.trials()
    print(f"\ntrials ({len(trials)}, each {warmup} warm-up + {steps} timed steps; then the tuned plan once, if any "
          "choice differs from the static one):", file=stream)
    rows = [("#", "request", "candidate", "static choice", "note")]
    for i, t in enumerate(trials, 1):
        note = " (measured before: kept)" if t.key in kept else ""
        if t.request is None or t.candidate is None:
            rows.append((str(i), "static", "every op at its static auto choice", "", note.strip()))
        else:
            static = t.request.static.full_name if t.request.static else "-"
            rows.append((str(i), t.request.label, t.candidate.full_name, static, note.strip()))
    for line in text_columns(rows, "  "):
        print(line, file=stream)
    untimed = [r for r in s.requests if not r.timed]
    if untimed:
        print("\nnot timed (one usable kernel, taken as it is):", file=stream)
        for r in untimed:
            print(f"  {r.label}: " + (r.candidates[0].full_name if r.candidates else "none usable here: auto "
                                      "leaves its places to the model's own code"), file=stream)
    passed = [(r, p) for r in s.requests for p in r.passed]
    if passed:
        print("\nnot candidates here:", file=stream)
        for r, p in passed:
            print(f"  {r.label}: {p}", file=stream)
    if s.named:
        print("\nnamed in the config (never tuned): " + ", ".join(f"{f}: {v}" for f, v in s.named), file=stream)


def trials_json(s: TuneSetup, out: str, steps: int, warmup: int) -> dict[str, Any]:
    return {"job": s.job["path"], "lock": out, "device": str(s.device), "mode": s.mode, "dtype": s.dtype,
            "shapes": s.shapes, "timed_steps": steps, "warmup_steps": warmup,
            "trials": [{"key": t.key, "label": t.label} for t in s.trials()],
            "requests": [{"op": r.op, "variants": list(r.variants), "static": r.static and r.static.full_name,
                          "candidates": [c.full_name for c in r.candidates], "passed": list(r.passed)}
                         for r in s.requests]}


def speed_summary(lock: PlanLock) -> str:
    """The step time of the plan the lock keeps, against the static plan's. Where the tuned plan
    was timed and rejected (not ``--min-gain`` faster), the lock keeps the static plan: its speed
    is the static plan's, and the rejected plan's figure is said as the rejected plan's."""
    st, tu = lock.static_step_ms, lock.tuned_step_ms
    if st is None or math.isnan(st):
        return "static auto: not measured"
    if not any(c.static is not None and c.full_name != c.static for c in lock.choices):
        if tu is None or math.isnan(tu) or tu == st:
            return f"kept: the static plan, {st:.2f} ms/step (no choice differs from it; measured in this tune)"
        return (f"kept: the static plan, {st:.2f} ms/step; the tuned plan measured {tu:.2f} ms/step ({st / tu:.3f}x "
                "the static plan's speed) and was not kept (both measured in this tune)")
    if tu is None or math.isnan(tu):
        return f"kept: the tuned plan, not timed as a whole; the static plan: {st:.2f} ms/step"
    return (f"kept: the tuned plan, {tu:.2f} ms/step against the static plan's {st:.2f} ms/step (both measured in "
            f"this tune): {st / tu:.3f}x the static plan's speed")


def report(lock: PlanLock, s: TuneSetup, out: str, stream: TextIO) -> None:
    """The choices of a finished tune, the static and the tuned step, and how to use the lock."""
    print(f"\nplan lock written: {out}", file=stream)
    rows = [("op/variants", "chosen", "static auto", "ms/step", "why")]
    for c in lock.choices:
        ms = "-" if c.step_ms is None else f"{c.step_ms:.2f}" + (f" ({c.static_step_ms:.2f})"
                                                                  if c.static_step_ms != c.step_ms else "")
        rows.append((f"{c.op}/{'|'.join(c.variants)}", c.full_name, c.static or "-", ms, c.why.split(" (")[0]))
    for line in text_columns(rows, "  "):
        print(line, file=stream)
    print(speed_summary(lock), file=stream)
    rel = os.path.relpath(out, os.path.dirname(os.path.abspath(s.job["path"])))
    rel = os.path.abspath(out) if rel.startswith("..") else rel
    print(f"use it: veomni-ops train {s.job['path']} --lock {out}  (or put `lock: {rel}` in the job YAML, or set "
          f"VEOMNI_OPS_LOCK={out})", file=stream)
