"""``veomni-ops train JOB --max-seq`` (issue 35): the longest ``train.seq_len`` that trains on
this device, for the job and, with ``--baseline NAME``, for each baseline beside it.

Each probe is a short run (``--max-seq-steps``, 2 by default: the first step allocates, the
second reuses, as every later step) of the job at one seq_len, in a fresh process of its own, as
``--baseline`` runs are (a parallel job's probe: its own ``torch.distributed.run`` ranks), so
that no probe's memory is another's; a probe writes and resumes no checkpoint. Out of memory is "does not train": ``torch.OutOfMemoryError``
(CUDA), ``MemoryError`` (the CPU), a RuntimeError that says "out of memory", the job's own
step-memory refusal (:func:`veomni_ops.train.job.min_step_bytes` over the device's memory), and a
probe killed by SIGKILL without a word, which is what the kernel's OOM killer does. Any other
failure stops the search with that error.

The search (:func:`search`, a pure function of a ``probe(seq_len)`` callable) doubles from the
job's seq_len until a probe fails (or, where the job's own fails, halves until one trains), then
bisects between the longest that trained and the shortest that failed on multiples of the
granularity (``--max-seq-granularity``, 256 by default, made a multiple of ``parallel.sp``), so
the answer is within one granularity of the true limit. It is bounded: at most
``--max-seq-probes`` probes, and no seq_len past the bound, the longest whose lower bound of a
step's memory (:func:`~veomni_ops.train.job.min_step_bytes`) fits the device (``--max-seq-upto N``
lowers it).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .job import MAX_STEP_BYTES, min_step_bytes

OK, OOM, ERROR = "ok", "oom", "error"
#: the shortest seq_len a job may have (the loss predicts each next token: one token has none)
MIN_SEQ = 2
DEFAULT_GRANULARITY = 256
DEFAULT_PROBES = 12
DEFAULT_STEPS = 2


@dataclass
class Probe:
    """One probe: the seq_len, ``ok`` / ``oom`` / ``error``, its peak memory where it trained, and
    why where it did not."""

    seq_len: int
    status: str
    peak_gib: float | None = None
    peak_kind: str | None = None
    seconds: float | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def granularity_for(granularity: int, sp: int) -> int:
    """``granularity`` made a multiple of the layout's ``sp`` (each rank an equal slice of a row)."""
    return granularity * sp // math.gcd(granularity, sp)


def _between(lo: int, hi: int, step: int) -> int | None:
    """The multiple of ``step`` strictly between ``lo`` and ``hi`` nearest their middle, or None."""
    m = (lo + hi) // 2 // step * step
    if m <= lo:
        m += step
    return m if lo < m < hi else None


class _Stop(Exception):
    def __init__(self, why: str):
        self.why = why


def search(probe: Callable[[int], Probe], start: int, upper: int, granularity: int = DEFAULT_GRANULARITY,
           max_probes: int = DEFAULT_PROBES) -> dict[str, Any]:
    """The longest seq_len ``probe`` trains, searched from ``start`` (see the module docstring),
    never past ``upper`` and in at most ``max_probes`` probes. Returns ``longest`` (None: none
    trained), ``first_failed`` (the shortest seq_len seen not to train; None: none failed),
    ``stopped`` (why the search ended: ``bisected`` to the granularity, ``bound`` (``upper``
    trained), ``probe limit``, ``error`` (a probe failed otherwise; ``error`` is its message),
    ``nothing trains`` (down to seq_len 2)) and every probe in order."""
    if not MIN_SEQ <= start or upper < MIN_SEQ or granularity < 1 or max_probes < 1:
        raise ValueError(f"search: start {start} and upper {upper} must be >= {MIN_SEQ}, granularity {granularity} "
                         f"and max_probes {max_probes} >= 1")
    probes: list[Probe] = []
    stopped = ""

    def trains(seq: int) -> bool:
        if len(probes) >= max_probes:
            raise _Stop("probe limit")
        p = probe(seq)
        probes.append(p)
        if p.status not in (OK, OOM):
            raise _Stop("error")
        return p.status == OK

    bounds: list[int | None] = [None, None]  # the longest that trained, the shortest that did not
    try:
        _narrow(trains, bounds, start, upper, granularity)
    except _Stop as stop:
        stopped = stop.why
    lo, hi = bounds
    error = probes[-1].message if stopped == "error" else None
    return {"longest": lo, "first_failed": hi, "stopped": stopped, "error": error, "start": start, "upper": upper,
            "granularity": granularity, "max_probes": max_probes, "probes": [p.to_dict() for p in probes]}


def _narrow(trains: Callable[[int], bool], bounds: list[int | None], start: int, upper: int, step: int) -> None:
    """The search's three phases, ``bounds`` (longest trained, shortest failed) kept up to date;
    ends by raising :class:`_Stop` with why."""
    def note(seq: int) -> None:
        bounds[0 if trains(seq) else 1] = seq

    note(min(start, upper))
    while bounds[1] is None:  # grow: double until one fails, or the bound trains
        lo = bounds[0]
        assert lo is not None
        if lo >= upper:
            raise _Stop("bound")
        note(min(2 * lo, upper))
    while bounds[0] is None:  # the job's own seq_len did not train: halve until one does
        if bounds[1] // 2 < MIN_SEQ:
            raise _Stop("nothing trains")
        note(bounds[1] // 2)
    while True:  # bisect on multiples of the granularity
        mid = _between(bounds[0], bounds[1], step)
        if mid is None:
            raise _Stop("bisected")
        note(mid)


# ----------------------------------------------------------------------------------------
# the bound, and a probe in a process of its own
# ----------------------------------------------------------------------------------------


def device_memory(job: dict[str, Any]) -> tuple[int, str]:
    """The memory a step of the job must fit, as the job loader checks it (``_step_memory``): a
    CUDA GPU's or, on the CPU, the machine's; elsewhere :data:`MAX_STEP_BYTES`."""
    from ..parallel.fsdp import device_memory_bytes
    from .model import resolve_device

    device = resolve_device(job["train"]["device"])
    if device.split(":")[0] in ("cpu", "cuda"):
        have = device_memory_bytes(device)
        if 0 < have < MAX_STEP_BYTES:
            return have, (f"this machine's memory ({have / 2**30:,.1f} GiB)" if device == "cpu" else
                          f"the memory of {device} ({have / 2**30:,.1f} GiB)")
    return MAX_STEP_BYTES, f"any one machine's ({MAX_STEP_BYTES / 2**30:,.0f} GiB)"


def memory_bound(job: dict[str, Any], memory: int) -> int | None:
    """The longest seq_len whose lower bound of a step's memory (:func:`min_step_bytes`, the job
    loader's refusal) fits ``memory``; None where even seq_len 2 does not (or the job's shapes
    are unknown: no bound)."""
    def need(seq: int) -> int | None:
        found = min_step_bytes({**job, "train": {**job["train"], "seq_len": seq}})
        return None if found is None else found[0]

    first = need(MIN_SEQ)
    if first is None or first > memory:
        return None
    lo, hi = MIN_SEQ, 2 ** 40  # need grows with seq_len; 2**40 tokens a row fits no machine
    while hi - lo > 1:
        mid = (lo + hi) // 2
        n = need(mid)
        if n is not None and n <= memory:
            lo = mid
        else:
            hi = mid
    return lo


def is_oom(kind: str | None, message: str | None) -> bool:
    """Whether a probe's failure (its exception's class name and message) is running out of memory."""
    text = (message or "").lower()
    return (kind in ("OutOfMemoryError", "MemoryError") or "out of memory" in text
            or (kind == "TrainConfigError" and "one training step needs at least" in text))


def child_probe(path: str, *, baseline: str | None, steps: int, world: int, seed: int | None = None,
                lock: str | None = None, defaults: str = "auto", log_dir: str | None = None
                ) -> Callable[[int], Probe]:
    """``probe(seq_len)``: train ``path`` (as ``baseline``) for ``steps`` steps at ``seq_len`` in a
    fresh process (``world`` > 1: that many ranks of ``torch.distributed.run`` on this machine),
    its output to a log in ``log_dir``."""
    from .loop import child_command, read_result

    python: tuple[str, ...] = (sys.executable,)
    if world > 1:
        python = (sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}")
    folder = log_dir or tempfile.mkdtemp(prefix="veomni-ops-max-seq-")

    def probe(seq_len: int) -> Probe:
        name = f"{baseline or 'job'}-{seq_len}".replace("+", "-")
        result = os.path.join(folder, f"{name}.json")
        log = os.path.join(folder, f"{name}.log")
        cmd = child_command(path, result, seed=seed, steps=steps, seq_len=seq_len, baseline=baseline, lock=lock,
                            defaults=defaults, max_seq_probe=True, python=python)
        t0 = time.perf_counter()
        with open(log, "w") as fh:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - t0
        data = read_result(result) if os.path.exists(result) else None
        if proc.returncode == 0 and data is not None and "error" not in data:
            return Probe(seq_len, OK, data.get("peak_gib"), data.get("peak_kind"), seconds)
        if data is not None and isinstance(data.get("error"), str):
            status = OOM if is_oom(data.get("kind"), data["error"]) else ERROR
            return Probe(seq_len, status, None, None, seconds, data["error"])
        if proc.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
            return Probe(seq_len, OOM, None, None, seconds, "killed by SIGKILL without a word, as the kernel's OOM "
                         f"killer kills (see {log})")
        with open(log, errors="replace") as fh:
            tail = fh.read()[-2000:].strip()
        return Probe(seq_len, ERROR, None, None, seconds, f"the probe exited {proc.returncode} without a result; "
                     f"the end of its output ({log}):\n{tail}")

    return probe
