"""``veomni-ops tune JOB.yaml [--out LOCK.json] [--steps N] [--op OP]... [--dry-run] [--fresh]
[--in-process]``:
``auto`` by measurement, on this machine, at the job's shapes.

Static priorities do not know the device, the shapes or the mode (under ``torch.compile`` the
compiler's fusion of the reference beats most opaque kernels). ``tune`` measures instead:

* **What it times.** For every op the job's config leaves on ``auto`` and the job's model has a
  place for, each kernel usable here (in the job's dtype and mode, honouring what the model's
  places need) is a candidate. Each candidate is timed *inside the job's training step*, not as
  an isolated call: a fresh model from the job's seed is bound with that candidate for that op
  and every other op at its static ``auto`` choice (through a one-entry plan lock, the same
  path ``auto`` later reads), compiled where the job is, and trains warm-up + ``--steps``
  steps (forward, backward, AdamW) on the job's batch; the median wall time of the timed steps
  is its measure. So an op's choice is decided by its share of a real step, launches, fusion
  under compile and memory traffic included. The static plan is timed once, as every op's
  static candidate. An op with one usable kernel is taken without timing.
* **How it chooses.** The fastest candidate whose losses agree with the static plan's (the
  tolerance of ``veomni-ops train``: same seed, same data), where it is at least ``--min-gain``
  (1%) faster than the static choice; otherwise the static choice stays. Then, where any op
  changed, the whole tuned plan is timed once beside the static one (recorded in the lock; a
  warning where it is slower: choices can interact).
* **What it writes.** A plan lock (:mod:`veomni_ops.lock`: JSON, the kernel per op request;
  device, versions, mode, dtype, shapes; every candidate's step times and losses), by default
  to the job's ``lock:`` key or ``JOB.lock.json`` beside the YAML. ``auto`` reads it where it
  matches this device and these versions (``--lock``, the job's ``lock:`` key, ``VEOMNI_OPS_LOCK``).
* **Resume.** Each measurement is written to ``LOCK.json.partial`` as it comes; an interrupted
  tune of the same job on the same machine (same versions, shapes, mode, steps) resumes from it
  and times only what is missing (``--fresh`` times everything again). The side file goes when
  the lock is written.
* **A process per trial.** Each trial trains in a fresh Python process of its own
  (:class:`~.tuner.ProcessTimer`: ``veomni-ops train JOB --tune-trial``, its output to a
  temporary log): nothing an earlier trial left in memory (the allocator's cache and
  fragmentation, compiled graphs, garbage) moves its step (the on-disk Triton and inductor
  caches are shared), and a candidate that crashes its process is a failed measurement (its
  error ends with the child's last stderr lines), not the end of the tune. ``--in-process``
  times every trial in the tune's own process (:class:`~.tuner.StepTimer`). The lock's
  ``method`` says which.
* ``--dry-run`` prints the trials (and which were measured before) without timing anything.
  A progress bar goes to stderr (one plain line per trial where stderr is not a terminal).

Not yet: a job with a ``parallel:`` layout (tune a one-process copy).

The package: :mod:`~veomni_ops.tune.setup` (candidates and trials of a job),
:mod:`~veomni_ops.tune.tuner` (timing, the side file, choosing, the lock) and
:mod:`~veomni_ops.tune.command` (``configure``, ``run``, the dry run). No torch at import.
"""

from __future__ import annotations

from .command import configure, run
from .setup import Candidate, Request, Trial, TuneSetup, default_out, setup
from .tuner import (
    MIN_GAIN,
    Measurement,
    ProcessTimer,
    Progress,
    StepTimer,
    Timer,
    TuneError,
    Tuner,
    TuneWarning,
    side_path,
)

__all__ = ["MIN_GAIN", "Candidate", "Measurement", "ProcessTimer", "Progress", "Request", "StepTimer", "Timer", "Trial",
           "TuneError", "TuneSetup", "TuneWarning", "Tuner", "configure", "default_out", "run", "setup", "side_path"]
