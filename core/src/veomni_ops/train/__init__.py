"""``veomni-ops train CONFIG.yaml [--compare OTHER.yaml] [--baseline NAME]... [--json] [--plot PNG]``: the main job.

Builds a transformers model (random weights from train.seed, initialised in float32 on the
training device, then cast to train.dtype; no download), resolves and prints the kernel plan,
binds it, and trains N steps of AdamW on synthetic token data.

    model:
      architecture: qwen3          # llama, qwen2, qwen3, qwen3_moe, qwen3_5 (offset norm, partial rotary)
      size: tiny                   # tiny, small
      config: {num_hidden_layers: 4}          # optional: overrides of the config's fields
      ops_implementation: {rms_norm_implementation: auto, ...}
    train: {batch_size: 4, seq_len: 128, steps: 20, lr: 1.0e-3, dtype: float32, device: auto, seed: 0,
            threads: auto, compile: false, compile_backend: inductor, init_device: device,
            checkpoint_dir: ckpt, checkpoint_every: 100, resume: false,   # optional: sharded checkpoints
            gradient_checkpointing: false}   # true: each decoder layer recomputed in the backward
    data: {packing: true, doc_len: {mean: 512, min: 16, max: 2048, sigma: 1.0}}   # optional: packed documents
    parallel: {dp_shard: 2, sp: 2, ep: 2}    # optional: FSDP2 / Ulysses / experts over torchrun's processes
    lock: qwen3-small.lock.json              # optional: a plan lock (veomni-ops tune), relative to this YAML

Every field is checked when the job is read (:func:`~veomni_ops.train.job.load_job`), before
anything is built, and every mistake of the file comes in one error: unknown sections and fields
(with a did-you-mean), values out of range (``batch_size: 0``, ``lr: fast``, ``dtype: fp64``), a
key given twice, a device torch does not see here (``device: gpu`` names none: write ``cuda``),
and each named kernel this machine cannot run.

``data:`` (:mod:`~veomni_ops.train.data`): without it, the synthetic rows of every job before it;
with ``packing: true``, documents of log-normal lengths (``doc_len``) packed into the rows, with
``position_ids`` restarting at each and its first token's label -100, from ``train.seed`` and the
step alone (a document that overflows its row is split onto the next).

With ``parallel:`` (or under ``torchrun --nproc-per-node N``) every process is one rank of the job
(:mod:`veomni_ops.parallel`): the plan is resolved for the layout and its kernels wrapped, the
model FSDP2-sharded, each rank trains its part of the same global batch, and rank 0 reports the
global loss (the one-process loss). Without either, one process, as before.

``train.init_device: meta`` builds the model on the meta device (no memory), binds it, shards it
(under a layout), then materialises it on the training device with the weights and buffers of the
normal build, which rank 0 builds on the CPU and broadcasts a tensor at a time
(:meth:`veomni_ops.parallel.ParallelRuntime.materialize`): a model bigger than one GPU never sits
whole on one. The weights are those of ``init_device: device`` on a CPU job, bit for bit (on a GPU
job: those of the CPU build, the GPU's random stream being another).

The model's shapes come from one of two places:

* ``architecture`` + ``size``: a preset of ours (``SIZES``) for one of ``ARCHITECTURES``.
* ``config_file: PATH``: a transformers ``config.json`` (or the folder holding one), e.g. a
  real checkpoint's config with fewer layers. A relative PATH is read from the YAML's folder.
  The architecture is the file's ``model_type``, built through
  ``AutoModelForCausalLM.from_config``; ``size`` is refused and ``architecture``, if given,
  must equal ``model_type``. The file is used as it is: preset extras such as
  ``output_router_logits`` are not added (set them under ``config``). ``config: PATH`` (a
  string) is accepted as a short form of ``config_file: PATH`` with no overrides.

``config`` (a mapping) overrides fields of either, before the config is built (a shorter
``num_hidden_layers`` also shortens a file's ``layer_types``).

Checkpoints (:mod:`~veomni_ops.train.checkpoint`, PyTorch's ``torch.distributed.checkpoint``):
with ``train.checkpoint_dir`` (relative: to the YAML's folder), the model, the optimizer, the
data position and every rank's RNG state are written every ``checkpoint_every`` steps (0, the
default: none before the end) and at the last step, each into ``step-N/``, complete or not at
all (a save killed midway leaves ``step-N.partial/``, never resumed from). ``resume: true`` (or
``--resume``) continues from the latest complete one in checkpoint_dir (an error where there is
none; ``resume: auto`` then starts from step 0), ``resume: PATH`` (``--resume PATH``) from that
checkpoint: the losses are those of a run never stopped, bitwise in float32 where the layout,
the plan (the kernel of each op) and the intra-op thread count are the checkpoint's (the
resumed run takes the checkpoint's thread count unless ``train.threads`` sets one; one that
differs is said), and a checkpoint written under one layout loads under another (``dp_shard:
2`` -> one process). The folder is made and written into when the job is read (a folder that
cannot be written is refused before step 1); each file's size and sha256 are kept and checked
before a resume reads them; the model's whole config is kept and a resume under another config
is refused, naming each field that differs. The result reports the whole loss curve, with
``first_step``, ``resumed_from`` and ``threads``. Baselines neither write nor resume checkpoints.

``train.threads`` (``auto``, or N): the intra-op CPU threads of the run (``torch.set_num_threads``,
restored after it). ``auto``: torch's count in the process (``OMP_NUM_THREADS``, else the CPUs),
or, resuming, the count the checkpoint was written at.

``train.compile: true`` binds with ``veomni_ops.apply(model, ops, compile=True)`` (``auto``
then picks only kernels that support torch.compile) and compiles each decoder layer in place
with ``torch.compile`` (backend ``train.compile_backend``; under a layout after FSDP2), not the
whole model: the attention mask is then built eagerly, and left out for rows without padding or
packing, so sdpa keeps its causal kernel (see :func:`veomni_ops.parallel.fsdp.compile_layers`;
issue 35: the whole model compiled was 2.4x slower than eager at 32k tokens). The graph breaks
of the first step are reported; the job trains with ``use_cache=False``. A ``+compile``
baseline compiles the whole model, as its users do. Tokens/s is the median over the steady steps: the first step (allocation,
autotuning) is excluded, and the first two when compiled (compilation); the spread
(p25..p75, min..max) of the same steps is shown beside it.

``train.gradient_checkpointing: true`` checkpoints every decoder layer
(:func:`~veomni_ops.train.model.checkpoint_layers`: transformers' own, non-reentrant), in one
process, under a layout and compiled; every baseline of the job takes the same setting.
``--max-seq`` searches for the longest train.seq_len that trains on this device, for the job
and each baseline (:mod:`~veomni_ops.train.maxseq`); ``--seq-len N`` overrides train.seq_len.

Comparisons, each run in its own process (so its peak memory is its own), all from the first
config's seed (so the same data):

* ``--compare OTHER``: a second job YAML.
* ``--baseline NAME`` (repeatable): the first config's job (model, data, steps, dtype, batch),
  without veomni-ops:
  ``transformers`` (plain transformers, ``attn_implementation="sdpa"``),
  ``transformers+compile`` (the same under ``torch.compile``), ``liger`` (Liger-Kernel's own
  monkey patch for the model type, on the instance; needs liger-kernel and a GPU).

Under torchrun (:mod:`~veomni_ops.train.peers`) the runs go one after another in the job's own
ranks instead (the same processes, process group, seed and data; each model freed before the
next): ``--compare OTHER`` (its layout must fit the same ranks) and the baselines
``transformers+fsdp2`` and ``transformers+fsdp2+compile``, plain transformers sharded by FSDP2
as a user's own script does (``fully_shard`` on each decoder layer and the root, bf16 params /
fp32 reduce for a bf16 job, AdamW, each rank its rows of the global batch; a ``dp_shard``-only
layout). Rank 0 prints the same report. The one-process baselines are refused under torchrun,
the FSDP2 ones without it.

``auto`` takes a plan lock's choices (:mod:`veomni_ops.lock`, written by ``veomni-ops tune``)
where it matches this device, these versions, the mode and the dtype: ``--lock FILE`` (a
mismatch is an error), else the job's ``lock:`` key, else ``VEOMNI_OPS_LOCK`` (a mismatch or a
missing file warns, and ``auto`` keeps the static priorities).

After comparing, every run's losses are checked: each must be finite, and at every step
``|loss - loss of the first run| <= TOL * max(|loss of the first run|, 1)``. TOL is
``--loss-tol``, by default 1e-3 when every run is float32/float64 and 2e-2 when any run is
bfloat16/float16 (see ``default_loss_tol``). Any failure prints FAIL and exits 1 (a single run
is checked for non-finite losses only). ``--steps N``
overrides train.steps of every run; ``--json`` prints everything as JSON on stdout;
``--plot PNG`` draws the loss curves and tokens/s of every run (needs matplotlib).

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
