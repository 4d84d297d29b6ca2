"""``veomni-ops train CONFIG.yaml [--compare OTHER.yaml] [--baseline NAME]... [--json] [--plot PNG]``: the main job.

Builds a transformers model (random weights from train.seed, initialised in float32 on the
training device, then cast to train.dtype; no download), resolves and prints the kernel plan,
binds it, and trains N steps of AdamW on synthetic token data.

What the job's YAML says (its model, train, data and parallel sections, checkpoints, compiling),
and the comparisons, baselines and loss check of the command: :mod:`~veomni_ops.train.command`.

The package, one concern a module: :mod:`~veomni_ops.train.job` (the YAML),
:mod:`~veomni_ops.train.model` (model, data, device), :mod:`~veomni_ops.train.baselines`,
:mod:`~veomni_ops.train.loop` (one run, in this process or a child),
:mod:`~veomni_ops.train.peers` (the runs after the job's in the ranks of a torchrun job),
:mod:`~veomni_ops.train.checkpoint` (saving and resuming), :mod:`~veomni_ops.train.report`
(the loss check, ratios, chart) and :mod:`~veomni_ops.train.command` (``configure``, ``run``).
Nothing here imports torch at module level: the CLI imports this package to build its parser.
"""

from __future__ import annotations

from .baselines import BASELINES, check_baseline, liger_version
from .command import configure, run
from .errors import CheckpointError, RunFailed, TrainConfigError
from .job import ARCHITECTURES, SIZES, TRAIN_DEFAULTS, load_job, read_config_file
from .loop import is_parallel, rate_stats, run_child, train_one
from .model import build_config, build_model, synthetic_batches
from .report import (
    LOSS_TOL_FP32,
    LOSS_TOL_LOW_PRECISION,
    LOW_PRECISION_DTYPES,
    check_run,
    compare,
    default_loss_tol,
    plot,
    print_report,
    report,
    tolerance_rule,
)

__all__ = [
    "ARCHITECTURES", "BASELINES", "LOSS_TOL_FP32", "LOSS_TOL_LOW_PRECISION", "LOW_PRECISION_DTYPES", "SIZES",
    "TRAIN_DEFAULTS", "CheckpointError", "RunFailed", "TrainConfigError", "build_config", "build_model", "check_baseline", "check_run",
    "compare", "configure", "default_loss_tol", "is_parallel", "liger_version", "load_job", "plot", "print_report",
    "rate_stats", "read_config_file", "report", "run", "run_child", "synthetic_batches", "tolerance_rule",
    "train_one",
]
