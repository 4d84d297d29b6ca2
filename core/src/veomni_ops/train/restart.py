"""A restart that loses nothing: ``torchrun --max-restarts K`` with ``train.resume: auto``.

When a rank dies (killed, out of memory, a node lost), torchrun's agent stops the others and
starts the whole group again (``TORCHELASTIC_RESTART_COUNT`` counts the attempts); with
``resume: auto`` each attempt resumes from the latest complete checkpoint in ``checkpoint_dir``
(:func:`~veomni_ops.train.checkpoint.find_resume`), or starts from step 0 where there is none,
and says which (:func:`announce`). The steps after that checkpoint are trained again: their
batches and RNG continue from the checkpoint, so the loss curve is the one of a run never
stopped.

What a restart cost is said when it resumes (:meth:`Progress.resumed`): rank 0 notes, after
every step, the step and the time in ``checkpoint_dir/progress.json`` (one small file, replaced
atomically); the next attempt reads it: the steps since the checkpoint, recomputed, at the last
attempt's step time, and the seconds from the last step it finished to this resume (the
failure's detection, the restart, the model's build and the checkpoint's read).

Test hooks, for the tests of this only (first attempt only, so that the restart runs clean):
``VEOMNI_OPS_TEST_KILL_AT_STEP=RANK:STEP`` SIGKILLs rank RANK before its step STEP (1-based),
``VEOMNI_OPS_TEST_HANG_AT_STEP=RANK:STEP`` makes it sleep forever there (alive, stuck).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

PROGRESS = "progress.json"
KILL_ENV = "VEOMNI_OPS_TEST_KILL_AT_STEP"
HANG_ENV = "VEOMNI_OPS_TEST_HANG_AT_STEP"


def attempt() -> int:
    """torchrun's restart count (0: the first attempt, or no torchrun)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def announce(train: dict[str, Any], source: str | None, out) -> None:
    """Say what ``resume: auto`` chose: the checkpoint it resumes from, or a fresh start."""
    if train.get("resume") != "auto":
        return
    again = f" (torchrun attempt {attempt() + 1})" if attempt() else ""
    if source is None:
        print(f"resume: auto{again}: no complete checkpoint in {train.get('checkpoint_dir')}, starting from step 0",
              file=out, flush=True)
    else:
        print(f"resume: auto{again}: resuming from the latest complete checkpoint, {source}", file=out, flush=True)


def _hook(name: str) -> tuple[int, int] | None:
    value = os.environ.get(name, "")
    if not value:
        return None
    rank, sep, step = value.partition(":")
    if not (sep and rank.isdigit() and step.isdigit()):
        raise ValueError(f"{name}={value!r}: give RANK:STEP (whole numbers), e.g. {name}=1:3")
    return int(rank), int(step)


def fault_hooks(step: int, rank: int, out=sys.stderr) -> None:
    """The test hooks (module docstring), before step ``step`` (1-based) of rank ``rank``."""
    if attempt() != 0:
        return
    kill, hang = _hook(KILL_ENV), _hook(HANG_ENV)
    if kill == (rank, step):
        print(f"{KILL_ENV}: rank {rank} kills itself (SIGKILL) before step {step}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if hang == (rank, step):
        print(f"{HANG_ENV}: rank {rank} hangs before step {step} (at unix time {time.time():.3f})", file=sys.stderr,
              flush=True)
        while True:
            time.sleep(3600)


class Progress:
    """Rank 0's note of the last finished step (``checkpoint_dir/progress.json``), and what a
    resumed attempt lost (module docstring). A no-op without ``checkpoint_dir`` or on other ranks."""

    def __init__(self, train: dict[str, Any], rank: int):
        directory = train.get("checkpoint_dir")
        self.path = os.path.join(directory, PROGRESS) if directory and rank == 0 else None
        self.t0 = time.time()
        self.last: dict[str, Any] | None = None

    def step_done(self, step: int, seconds: float) -> None:
        if self.path is None:
            return
        note = {"step": step, "time": time.time(), "step_s": seconds, "attempt": attempt(), "pid": os.getpid()}
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "w") as fh:
                json.dump(note, fh)
            os.replace(tmp, self.path)
        except OSError as e:  # the checkpoints themselves say a folder that refuses writes
            print(f"warning: cannot note progress in {self.path} ({e}); a restart will not say what it lost",
                  file=sys.stderr, flush=True)
            self.path = None

    def resumed(self, step: int, out) -> dict[str, Any] | None:
        """After resuming from the checkpoint of ``step``: what the previous attempt lost (printed
        and returned: ``resumed_step``, ``lost_steps``, ``recompute_s``, ``startup_s``); None where
        no earlier attempt of this checkpoint_dir went past it (a plain resume)."""
        if self.path is None:
            return None
        try:
            with open(self.path) as fh:
                last = json.load(fh)
            reached, when, step_s = int(last["step"]), float(last["time"]), float(last.get("step_s", 0.0))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if reached < step:
            return None
        lost = reached - step
        facts = {"resumed_step": step, "lost_steps": lost, "recompute_s": round(lost * step_s, 3),
                 "startup_s": round(time.time() - when, 3), "attempt": attempt()}
        print(f"restart: resuming after step {step} (the last complete checkpoint); the previous attempt had finished "
              f"step {reached}, so {lost} step(s) are recomputed (~{facts['recompute_s']:.1f} s at "
              f"{step_s:.2f} s/step), and {facts['startup_s']:.1f} s went from its last step to this resume "
              f"(failure, restart, start-up): ~{facts['recompute_s'] + facts['startup_s']:.1f} s lost in all",
              file=out, flush=True)
        return facts


#: the layout keys a checkpoint records (``veomni_ops.json``'s ``layout``) that place the shards, and
#: ``ep_chunks`` (it places nothing, but a resume under another one sums in another order)
LAYOUT_KEYS = ("dp_replicate", "dp_shard", "sp", "ep", "ep_chunks")


def layout_change(written: dict[str, Any] | None, here: dict[str, Any] | None) -> str | None:
    """The resume line's note where the checkpoint was written under another layout than this
    run's (``None``: one process; a key a checkpoint lacks, such as ``dp_replicate`` before it
    existed, is 1, and a missing ``reduce_dtype`` is float32): DCP reads it whatever the layout,
    and the losses then differ by rounding from those of a run never stopped. None where the
    layouts are the same."""
    def keys(layout: dict[str, Any] | None) -> dict[str, Any]:
        out: dict[str, Any] = {k: int((layout or {}).get(k, 1) or 1) for k in LAYOUT_KEYS}
        out["reduce_dtype"] = str((layout or {}).get("reduce_dtype") or "float32")
        return out

    old, new = keys(written), keys(here)
    if old == new:
        return None
    changed = ", ".join(f"{k} {old[k]} -> {new[k]}" for k in old if old[k] != new[k])
    return f"another layout than the checkpoint's ({changed}): the losses differ by rounding from a run never stopped"
