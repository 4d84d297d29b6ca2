"""Timing the trials of a :class:`~.setup.TuneSetup`, keeping each measurement as it comes (a
side file beside the lock, so an interrupted tune resumes), choosing per request, writing the lock."""

from __future__ import annotations

import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..lock import LockChoice, PlanLock, write_json_atomic
from ..train.report import default_loss_tol
from .setup import Candidate, Request, Trial, TuneSetup

#: Default: a candidate replaces the static choice only when its step is this much faster (relative).
MIN_GAIN = 0.01
#: Default timed steps per trial, and warm-up steps (eager; compile mode adds one for compilation).
STEPS = 5
WARMUP = 2


class TuneError(RuntimeError):
    """A tune cannot go on (the static plan does not train, a trial bound another kernel)."""


class TuneWarning(UserWarning):
    """Something a tune's user should know that does not stop it (a side file not resumed, the
    tuned plan slower than the static one)."""


@dataclass
class Measurement:
    """One trial's result: the timed steps' wall times (ms), every step's loss, peak memory; or
    why it failed (``error``)."""

    step_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    peak_gib: float | None = None
    error: str | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.step_ms) if self.step_ms else math.nan

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.step_ms)

    def to_dict(self) -> dict[str, Any]:
        return {"median_ms": None if math.isnan(self.median_ms) else self.median_ms, "step_ms": self.step_ms,
                "losses": self.losses, "peak_gib": self.peak_gib, "error": self.error}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        return cls(list(d.get("step_ms") or []), list(d.get("losses") or []), d.get("peak_gib"), d.get("error"))


#: What times a trial: given it, the measurement (``veomni-ops tune`` trains the job: each trial
#: in a process of its own, :class:`ProcessTimer`, or with ``--in-process`` in the tune's,
#: :class:`StepTimer`).
Timer = Callable[[Trial], Measurement]


class StepTimer:
    """Times a trial by training the job's model: a fresh model from the job's seed, bound with the
    trial's lock (or the static plan), compiled where the job is, ``warmup`` + ``steps`` steps of
    forward, backward and AdamW on the job's batch; the wall time of each step after the warm-up
    (each step ends with the loss read back, a device sync). Checks that the trial's candidate
    is the kernel bound for its request."""

    def __init__(self, setup: TuneSetup, steps: int = STEPS, warmup: int = WARMUP):
        self.setup, self.steps, self.warmup = setup, steps, warmup

    def __call__(self, trial: Trial) -> Measurement:
        import gc

        import torch

        from ..train.loop import train_one

        job = dict(self.setup.job)
        # a trial measures: it neither resumes nor writes the job's checkpoints
        job["train"] = {**job["train"], "steps": self.warmup + self.steps, "checkpoint_dir": None, "resume": False}
        job["lock"] = trial.lock
        if self.setup.compile:
            torch._dynamo.reset()  # each trial compiles its own model: no cache limit, no stale graph
        log = io.StringIO()
        try:
            res = train_one(job, out=log)
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return _measurement(trial, job, res, self.warmup)


class ProcessTimer:
    """Times a trial as :class:`StepTimer` does, in a fresh Python process of its own (``veomni-ops
    train JOB --tune-trial``): nothing an earlier trial left in memory (the allocator's cache and
    fragmentation, compiled graphs, garbage; the on-disk caches are shared) moves its step. The
    child reads the job's YAML as the tune did, binds the trial's lock (written to a temporary
    file; the static plan: no lock at all, neither the job's ``lock:`` key nor
    ``VEOMNI_OPS_LOCK``), trains ``warmup`` + ``steps`` steps without checkpoints, and writes its
    result to a file this process reads. Its output goes to a temporary log; a child that fails
    gives a measurement whose error names the failure and ends with the last lines of that log.
    ``python``: the interpreter command (this one by default)."""

    #: The last lines of a failed child's stderr kept in its measurement's error.
    TAIL = 6

    def __init__(self, setup: TuneSetup, steps: int = STEPS, warmup: int = WARMUP,
                 python: Sequence[str] | None = None):
        self.setup, self.steps, self.warmup = setup, steps, warmup
        self.python = list(python) if python is not None else [sys.executable]

    def command(self, result: str, lock: str | None) -> list[str]:
        """The child's command line: the result written to ``result``, bound with the lock file ``lock``."""
        from ..train.loop import child_command

        return child_command(os.path.abspath(self.setup.job["path"]), result, steps=self.warmup + self.steps,
                             lock=lock, tune_trial=True, python=self.python)

    def __call__(self, trial: Trial) -> Measurement:
        from ..reporting import ENV_TRACE
        from ..train.loop import read_result

        with tempfile.TemporaryDirectory(prefix="veomni-ops-tune-") as tmp:
            result, log = os.path.join(tmp, "result.json"), os.path.join(tmp, "stderr.log")
            lock = None
            if isinstance(trial.lock, PlanLock):
                lock = os.path.join(tmp, "trial.lock.json")
                trial.lock.save(lock)
            env = {**os.environ, ENV_TRACE: "1"}  # a failure's traceback ends the log: its tail says where
            with open(log, "w") as err:
                proc = subprocess.run(self.command(result, lock), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=err, env=env, check=False)
            res = read_result(result)
            if proc.returncode != 0 or res is None or "error" in res:
                return Measurement(error=_child_failure(proc.returncode, res, _tail(log, self.TAIL)))
        return _measurement(trial, self.setup.job, res, self.warmup)


def _measurement(trial: Trial, job: dict[str, Any], res: dict[str, Any], warmup: int) -> Measurement:
    """The measurement of a trial's training result ``res`` (after checking what it bound)."""
    if trial.request is not None and trial.candidate is not None:
        _check_bound(trial.request, trial.candidate, res["plan"])
    tokens = int(job["train"]["batch_size"]) * int(job["train"]["seq_len"])
    rates = res["step_tokens_per_s"][warmup:]
    return Measurement([tokens / r * 1e3 for r in rates], list(res["losses"]), res.get("peak_gib"))


def _tail(path: str, n: int) -> list[str]:
    """The last ``n`` non-blank lines of the file at ``path``."""
    try:
        with open(path, errors="replace") as fh:
            lines = [ln.rstrip() for ln in fh if ln.strip()]
    except OSError:
        return []
    return lines[-n:]


def _child_failure(code: int, res: dict[str, Any] | None, tail: list[str]) -> str:
    """A failed trial process, in one line: the error it wrote (else its exit status), then the
    last lines of its stderr."""
    if res is not None and isinstance(res.get("error"), str):
        kind, why = str(res.get("kind") or ""), res["error"]
        what = why if not kind or why.startswith(kind) else f"{kind}: {why}"
    elif code < 0:
        what = f"the trial's process was killed by signal {-code}"
    else:
        what = f"the trial's process exited with status {code} and wrote no result"
    return what + (f" [its stderr ends: {' | '.join(tail)}]" if tail else " [its stderr was empty]")


def _check_bound(request: Request, c: Candidate, plan: dict[str, Any]) -> None:
    for e in plan["entries"]:
        if e["op"] == request.op and e["variant"] in request.variants:
            if (e["kernel"], e["distribution"], e["variant"]) == (c.kernel, c.distribution, c.variant):
                return
            raise TuneError(f"{request.label}: the trial of {c.full_name} bound {e['kernel']}@{e['distribution']}/{e['variant']} "
                            f"({e['reason']}); this is a bug in veomni-ops tune or the lock's matching: report it")
    raise TuneError(f"{request.label}: the trial of {c.full_name} bound no kernel for the op; this is a bug in "
                    "veomni-ops tune: report it")


class Progress:
    """A progress bar on a terminal (redrawn in place), one plain line per trial otherwise."""

    WIDTH = 24

    def __init__(self, total: int, stream: TextIO | None = None):
        self.total, self.stream = total, stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def _bar(self, done: int) -> str:
        n = done * self.WIDTH // max(self.total, 1)
        return f"tune [{'#' * n}{'.' * (self.WIDTH - n)}] {done}/{self.total}"

    def start(self, done: int, label: str) -> None:
        if self.tty:
            self.stream.write(f"\r\033[K{self._bar(done)}  timing {label} ...")
            self.stream.flush()

    def finish(self, done: int, label: str, text: str) -> None:
        line = f"{self._bar(done)}  {label}: {text}"
        self.stream.write(f"\r\033[K{line}\n" if self.tty else line + "\n")
        self.stream.flush()


def describe(m: Measurement) -> str:
    if not m.ok:
        return f"failed: {m.error}"
    peak = f", peak {m.peak_gib:.2f} GiB" if m.peak_gib is not None else ""
    return f"{m.median_ms:.2f} ms/step (median of {len(m.step_ms)}){peak}"


class Tuner:
    """Times every trial of ``setup`` with ``timer`` (measurements kept in ``side`` as they come,
    resumed from it), chooses per request, and writes the lock to ``out``."""

    def __init__(self, setup: TuneSetup, out: str, timer: Timer, *, min_gain: float = MIN_GAIN,
                 method: dict[str, Any] | None = None, fresh: bool = False, stream: TextIO | None = None):
        self.setup, self.out, self.timer, self.min_gain = setup, out, timer, min_gain
        self.method = {**(method or {}), "min_gain": min_gain}
        self.side = side_path(out)
        self.stream = stream if stream is not None else sys.stderr
        self.measured: dict[str, Measurement] = {} if fresh else self._resumed()
        #: the static plan's step time: the faster of its two timings (set by :meth:`run`)
        self.static_ms = math.nan

    # -- the side file --------------------------------------------------------------------
    def _header(self) -> dict[str, Any]:
        return {**self.setup.fingerprint(), "method": self.method}

    def _resumed(self) -> dict[str, Measurement]:
        """The measurements of an earlier, interrupted tune of the same job here, if any."""
        data = read_side(self.side)
        if data is None:
            return {}
        header = self._header()
        differs = sorted(k for k in header if data.get("header", {}).get(k) != header[k])
        if differs:
            warnings.warn(TuneWarning(f"{self.side}: not resumed, its measurements were made under another "
                                      f"{', '.join(differs)}; timing everything again"), stacklevel=2)
            return {}
        return {k: Measurement.from_dict(v) for k, v in data.get("measurements", {}).items()}

    def _keep(self) -> None:
        write_json_atomic(self.side, {"header": self._header(),
                                      "measurements": {k: m.to_dict() for k, m in self.measured.items()}})

    # -- timing ---------------------------------------------------------------------------
    def measure(self, trial: Trial, progress: Progress, done: int) -> Measurement:
        if trial.key in self.measured:
            m = self.measured[trial.key]
            progress.finish(done, trial.label, describe(m) + " (measured before: kept)")
            return m
        progress.start(done - 1, trial.label)
        try:
            m = self.timer(trial)
        except Exception as e:  # a candidate that fails to train is recorded, and not chosen
            m = Measurement(error=f"{type(e).__name__}: {e}")
        self.measured[trial.key] = m
        self._keep()
        progress.finish(done, trial.label, describe(m))
        return m

    def run(self) -> PlanLock:
        """Time the static plan, each candidate, the static plan again, then the tuned plan.

        The static plan is timed twice (first and after the candidates): a step time moves with
        the machine (clocks, caches, other work on the host), and a candidate must beat the
        faster of the two to replace the static choice. The tuned plan (every op at its choice) is
        timed last; where it is not ``min_gain`` faster than that either, the choices interacted
        or were noise, and the lock keeps the static choice for every op (with both figures)."""
        trials = self.setup.trials()
        again = [Trial("static-again", False)] if len(trials) > 1 else []
        progress = Progress(len(trials) + len(again) + 1, self.stream)
        for i, trial in enumerate(trials + again, 1):
            m = self.measure(trial, progress, i)
            if trial.key == "static" and not m.ok:
                raise TuneError(f"{self.setup.job['path']}: the job does not train with its static plan ({m.error}); "
                                "fix that first (veomni-ops train JOB.yaml shows the failure)")
        self.static_ms = min(t.median_ms for k in ("static", "static-again")
                             if (t := self.measured.get(k)) is not None and t.ok)
        timed = [r for r in self.setup.requests if r.candidates]
        choices = [self.choose(r) for r in timed]
        changed = [c for c in choices if c.static is not None and c.full_name != c.static]
        tuned_ms = self.static_ms
        done = len(trials) + len(again) + 1
        if changed:
            trial = Trial("tuned", self.setup.lock(choices, source="tune trial tuned"))
            tuned = self.measure(trial, progress, done)
            if not tuned.ok:
                raise TuneError(f"the tuned plan does not train ({tuned.error}); each of its choices trained alone: "
                                "re-run with --op to tune fewer ops, and report it")
            tuned_ms = tuned.median_ms
            if tuned_ms > self.static_ms * (1 - self.min_gain):
                why = (f"the tuned plan measured {tuned_ms:.2f} ms/step against the static plan's "
                       f"{self.static_ms:.2f} (the faster of its two timings; the tuned plan: "
                       f"{', '.join(c.full_name for c in changed)}): not {self.min_gain:.0%} faster, so every op "
                       "keeps its static choice")
                warnings.warn(TuneWarning(why), stacklevel=2)
                choices = [self._static_choice(r, c, why) for r, c in zip(timed, choices)]
        else:
            progress.finish(done, "tuned plan", "the static choice kept for every op: not timed again")
        lock = self.setup.lock(choices, method=self.method, static_step_ms=self.static_ms,
                               tuned_step_ms=tuned_ms,
                               measurements={k: m.to_dict() for k, m in self.measured.items()},
                               source=self.out, origin="veomni-ops tune")
        lock.save(self.out)
        if os.path.exists(self.side):
            os.unlink(self.side)
        return lock

    def _static_choice(self, r: Request, c: LockChoice, why: str) -> LockChoice:
        if c.static is None or c.full_name == c.static:
            return c
        s = r.static if r.static is not None else r.candidates[0]
        return LockChoice(r.op, r.variants, s.variant, s.kernel, s.distribution,
                          f"the static choice kept: {why}; alone, {c.full_name} had measured {c.step_ms:.2f} ms",
                          static=s.full_name,
                          step_ms=self.static_ms, static_step_ms=self.static_ms)

    # -- choosing -------------------------------------------------------------------------
    def _of(self, r: Request, c: Candidate) -> Measurement:
        return self.measured["static" if c == r.static else r.key(c)]

    def _ms(self, r: Request, c: Candidate) -> float:
        """A candidate's step time; the static choice's is the faster of the static plan's timings."""
        return self.static_ms if c == r.static and not math.isnan(self.static_ms) else self._of(r, c).median_ms

    def choose(self, r: Request) -> LockChoice:
        """The fastest usable candidate whose losses agree with the static plan's, where it beats the
        static choice by ``min_gain``; otherwise the static choice."""
        if not r.timed:
            c = r.candidates[0]
            return LockChoice(r.op, r.variants, c.variant, c.kernel, c.distribution,
                              "the only kernel usable here for the model's places (not timed)",
                              static=r.static.full_name if r.static else None)
        ref = self.measured["static"]
        rows, valid = [], []
        for c in r.candidates:
            m = self._of(r, c)
            why = m.error if not m.ok else _loss_problem(ref, m, self.setup.dtype)
            tag = " (static)" if c == r.static else ""
            rows.append(f"{c.full_name}{tag} " + (f"{self._ms(r, c):.2f}" if why is None else f"refused: {why}"))
            if why is None:
                valid.append((self._ms(r, c), c))
        static_c = r.static if r.static is not None else r.candidates[0]
        static_ms = self._ms(r, static_c)
        best_ms, best = min(valid, key=lambda x: x[0]) if valid else (static_ms, static_c)
        timed = f"median ms per training step, {self.setup.mode} mode: " + ", ".join(rows)
        if best != static_c and best_ms < static_ms * (1 - self.min_gain):
            why = (f"measured fastest in the job's step: {best_ms:.2f} vs {static_ms:.2f} ms for the static "
                   f"{static_c.full_name} ({best_ms / static_ms - 1:+.1%}; {timed})")
            chosen = best
        else:
            why = (f"the static choice kept: no candidate {self.min_gain:.0%} faster than its {static_ms:.2f} ms "
                   f"({timed})")
            chosen = static_c
        ms = best_ms if chosen is best else static_ms
        return LockChoice(r.op, r.variants, chosen.variant, chosen.kernel, chosen.distribution, why,
                          static=static_c.full_name, step_ms=ms, static_step_ms=static_ms)


def _loss_problem(ref: Measurement, m: Measurement, dtype: str) -> str | None:
    """Why ``m``'s losses disagree with the static plan's (same seed, data, steps), or None. The
    tolerance is ``veomni-ops train``'s (1e-3 relative in float32, 2e-2 in bf16/fp16)."""
    tol = default_loss_tol([{"dtype": dtype}])
    for i, (a, b) in enumerate(zip(ref.losses, m.losses), 1):
        if not math.isfinite(b):
            return f"loss not finite at step {i}"
        if math.isfinite(a) and abs(b - a) > tol * max(abs(a), 1.0):
            return f"loss {b:.5g} at step {i} differs from the static plan's {a:.5g} by more than {tol:g} relative"
    return None


def side_path(out: str) -> str:
    """The side file keeping an unfinished tune's measurements (removed when the lock is written)."""
    return out + ".partial"


def read_side(path: str) -> dict[str, Any] | None:
    """The side file's contents; None when there is none. An unreadable one is named, and not resumed."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        warnings.warn(TuneWarning(f"{path}: unreadable ({e}); not resumed, timing everything again"), stacklevel=2)
        return None
    return data if isinstance(data, dict) else None

