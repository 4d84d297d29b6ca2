"""The ``veomni-ops train`` command: its options, and the runs, comparisons and report it makes.

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
            compile_mode: default,       # reduce-overhead: each compiled layer as CUDA graphs (one process)
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
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from .baselines import BASELINES, FSDP2_BASELINES, check_baseline, check_in_ranks, compile_apply
from .errors import RunFailed, TrainConfigError
from .job import _step_memory, check_checkpointing, load_job
from .loop import is_parallel, rank, run_child, train_one
from .maxseq import DEFAULT_GRANULARITY, DEFAULT_PROBES, DEFAULT_STEPS
from .peers import run_in_ranks
from .report import LOSS_TOL_FP32, LOSS_TOL_LOW_PRECISION, compare, finite_json, plot, print_report, report


def _whole_number(minimum: int, unit: str, why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number of ``unit`` >= ``minimum`` (``why``: the reason for the
    bound, said in the error)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = minimum - 1
        if n < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number of {unit} >= {minimum}{why}, got {text!r}")
        return n
    return parse


_steps = _whole_number(1, "steps")
_seq_len = _whole_number(2, "tokens", " (the loss predicts each next token)")


def _positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"expected a relative tolerance > 0 (e.g. 1e-3), got {text!r}")
    return x


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="job YAML (model: architecture and size, or config_file; ops_implementation; "
                                  "train: ...); see examples/")
    p.add_argument("--compare", metavar="OTHER", help="train this job YAML too, same seed and data, and compare")
    p.add_argument("--baseline", action="append", metavar="NAME", choices=list(BASELINES), default=[],
                   help="also train CONFIG's job without veomni-ops, as NAME (repeatable): "
                        + "; ".join(f"{k}: {v}" for k, v in BASELINES.items()))
    p.add_argument("--loss-tol", type=_positive_float, metavar="TOL",
                   help="relative loss tolerance of the comparison: a run FAILs (exit 1) when |loss - loss of the "
                        "first run| > TOL x max(|loss of the first run|, 1) at any step, or when any loss is not "
                        f"finite. Default {LOSS_TOL_FP32:g} when every run is float32, {LOSS_TOL_LOW_PRECISION:g} "
                        "when any run is bfloat16/float16")
    p.add_argument("--steps", type=_steps, metavar="N", help="override train.steps (of every run)")
    p.add_argument("--seed", type=int, help="override train.seed (of every run)")
    p.add_argument("--seq-len", type=_seq_len, metavar="N", help="override train.seq_len (of every run)")
    p.add_argument("--max-seq", action="store_true",
                   help="search for the longest train.seq_len that trains on this device, for CONFIG's job and each "
                        "--baseline: short runs (probes) in fresh processes, doubling from train.seq_len until one "
                        "runs out of memory, then bisecting; prints each probe with its peak memory")
    p.add_argument("--max-seq-upto", type=_seq_len, metavar="N",
                   help="--max-seq probes no seq_len past N (default: the longest whose lower bound of a step's memory "
                        "fits the device)")
    p.add_argument("--max-seq-probes", type=_whole_number(1, "probes"), metavar="N", default=DEFAULT_PROBES,
                   help=f"--max-seq stops after N probes of each run (default {DEFAULT_PROBES})")
    p.add_argument("--max-seq-granularity", type=_whole_number(1, "tokens"), metavar="N", default=DEFAULT_GRANULARITY,
                   help="--max-seq bisects on multiples of N tokens (made a multiple of parallel.sp; default "
                        f"{DEFAULT_GRANULARITY})")
    p.add_argument("--max-seq-steps", type=_steps, metavar="N", default=DEFAULT_STEPS,
                   help=f"the steps of each --max-seq probe (default {DEFAULT_STEPS})")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (progress on stderr)")
    p.add_argument("--plot", metavar="PATH.png", help="draw every run's loss curve and tokens/s into a PNG "
                                                      "(needs matplotlib)")
    p.add_argument("--lock", metavar="LOCK.json", help="bind CONFIG's job with this plan lock (veomni-ops tune "
                                                       "writes one); an error where it does not match this device, "
                                                       "these versions or the job's mode and dtype. Without it: the "
                                                       "job's lock: key, else VEOMNI_OPS_LOCK")
    p.add_argument("--defaults", choices=("auto", "veomni"), default="auto",
                   help="what an ops_implementation field a job omits is: auto (default), or VeOmni's default for "
                        "it (as veomni-ops resolve --defaults veomni), which then means on the device what it means "
                        "in VeOmni there; applies to CONFIG and --compare OTHER")
    p.add_argument("--resume", nargs="?", const=True, metavar="PATH",
                   help="resume CONFIG's job from the latest complete checkpoint in its train.checkpoint_dir "
                        "(train.resume: true), or from the checkpoint PATH (or the latest in the folder PATH): the "
                        "model, optimizer, data position and RNG; the losses continue as if never stopped")
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    p.add_argument("--as-baseline", choices=list(BASELINES), help=argparse.SUPPRESS)
    # A trial of veomni-ops tune (its ProcessTimer, with --result-file): the job read as the tune
    # reads it, bound with --lock only (none: the static plan), neither resuming nor checkpointing.
    p.add_argument("--tune-trial", action="store_true", help=argparse.SUPPRESS)
    # A probe of --max-seq (with --result-file): the job at --seq-len, neither resuming nor checkpointing.
    p.add_argument("--max-seq-probe", action="store_true", help=argparse.SUPPRESS)


def _load(path: str, args: argparse.Namespace, main: bool = True) -> dict[str, Any]:
    """The job at ``path`` with the options applied (``--lock`` to CONFIG's job, the ``main`` one)."""
    trial = main and getattr(args, "tune_trial", False)
    # A tune trial reads the job as the tune did (``here=False``: the tune checked this machine).
    job = load_job(path, here=not trial, defaults=getattr(args, "defaults", "auto"))
    if main and getattr(args, "lock", None):
        from ..lock import LockFile

        job["lock"] = LockFile(args.lock, explicit=True, origin="--lock")
    elif trial:
        job["lock"] = False  # the static plan: not the job's lock: key, nor VEOMNI_OPS_LOCK
    if trial or (main and getattr(args, "max_seq_probe", False)):
        job["train"].update(checkpoint_dir=None, resume=False)
    if main and getattr(args, "resume", None) is not None:
        job["train"]["resume"] = True if args.resume is True else os.path.abspath(args.resume)
        check_checkpointing(job)
    if args.seed is not None:
        job["train"]["seed"] = args.seed
    if args.steps is not None:
        job["train"]["steps"] = args.steps
    if getattr(args, "seq_len", None) is not None:
        job["train"]["seq_len"] = args.seq_len
        problems = _step_memory(job, here=not trial)  # checked again at the new length, as the loader checks it
        if problems:
            raise TrainConfigError(f"{path}: --seq-len {args.seq_len}: {problems[0]}", problems)
    return job


def _run_as_child(args: argparse.Namespace) -> int:
    """Train one job and write its result, or ``{"error": ..., "kind": ...}``, to ``--result-file``."""
    from ..binding import BindingError
    from ..config import ConfigError
    from ..device import DeviceError
    from ..discovery import PluginLoadError
    from ..lock import LockError
    from ..reporting import ENV_TRACE, error_text
    from ..resolve import ResolutionError

    try:
        job = _load(args.config, args)
        if args.as_baseline in FSDP2_BASELINES:  # a probe of --max-seq: under torch.distributed.run
            from .peers import train_baseline_in_ranks

            res = train_baseline_in_ranks(job, args.as_baseline)
        else:
            res = train_one(job, baseline=args.as_baseline)
    except Exception as e:
        refusal = isinstance(e, (ConfigError, TrainConfigError, FileNotFoundError, ResolutionError, BindingError,
                                 DeviceError, PluginLoadError, LockError))
        message = error_text(e, refusal=refusal)
        if os.environ.get(ENV_TRACE, "") not in ("", "0"):
            import traceback

            traceback.print_exc()
        elif not refusal:
            message += f" (set {ENV_TRACE}=1 for the traceback)"
        if rank() == 0:  # the ranks of a parallel child end with rank 0's error (FailureGuard): it writes
            with open(args.result_file, "w") as fh:
                json.dump({"error": message, "kind": type(e).__name__}, fh)
        return 1
    if rank() == 0:
        with open(args.result_file, "w") as fh:
            json.dump(res, fh)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.result_file:  # child mode: a failure is written for the parent to report, in one line
        return _run_as_child(args)
    job = _load(args.config, args)
    if args.max_seq:
        return _max_seq(job, args)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise TrainConfigError("--plot needs matplotlib, which is not installed here: pip install matplotlib")
    parallel = is_parallel(job)
    for name in args.baseline:
        check_in_ranks(name, job, parallel)
        check_baseline(name, job)
    jobs = [job] + ([_load(args.compare, args, main=False)] if args.compare else [])  # fail fast on a bad second config
    if any(j["train"]["compile"] for j in jobs):
        from ..binding import apply

        compile_apply(apply)
    human = sys.stderr if args.json else sys.stdout
    seed = job["train"]["seed"]
    if parallel:  # one rank of a parallel job (torchrun): --compare and the baselines after it, in these ranks
        from ..parallel import ParallelFailure

        try:
            if args.compare or args.baseline:
                runs = run_in_ranks(job, jobs[1] if args.compare else None, args.baseline, human,
                                    (args.config, args.compare))
            else:
                runs = [train_one(job, out=human)]
        except ParallelFailure as e:
            raise RunFailed(str(e)) from e
        if rank() != 0:
            return 0
    elif not args.compare and not args.baseline:
        runs = [train_one(job, out=human)]
    else:
        specs: list[tuple[str, str | None, str]] = [(args.config, None, args.config)]
        if args.compare:
            specs.append((args.compare, None, args.compare))
        specs += [(args.config, name, f"baseline {name} ({BASELINES[name]})") for name in args.baseline]
        runs = []
        for i, (path, baseline, title) in enumerate(specs):
            print(f"== {title}", file=human, flush=True)
            mine = {"lock": args.lock, "resume": args.resume} if i == 0 else {}  # --lock and --resume are CONFIG's
            mine["seq_len"] = args.seq_len  # every run's
            runs.append(run_child(path, seed, args.steps, baseline, defaults=args.defaults,
                                  **{k: v for k, v in mine.items() if v}))
    rep = report(runs, list(range(1, len(runs))), args.loss_tol)
    if args.plot:
        plot(runs, rep, args.plot)
        print(f"plot: {args.plot}", file=human)
    if args.json:
        if len(runs) == 1:
            out: dict[str, Any] = {**runs[0], "check": rep["checks"][0], "passed": rep["passed"]}
        else:
            out = {"runs": runs, **rep}
            if args.compare:  # the keys --compare --json has always had
                out.update(a=runs[0], b=runs[1], compare=compare(runs[0], runs[1]))
        print(json.dumps(finite_json(out), indent=2))
    elif len(runs) > 1:
        print_report(runs, rep, human)
    if not rep["passed"]:
        failed = [c for c in rep["checks"] if not c["passed"]]
        if len(runs) == 1 and not args.json:
            print(f"FAIL {failed[0]['run']}: {failed[0]['message']}", file=human)
        print(f"veomni-ops train: FAIL: {'; '.join(c['run'] + ': ' + c['message'] for c in failed)}. Rule: "
              f"{rep['rule']}", file=sys.stderr)
        return 1
    return 0


def _max_seq(job: dict[str, Any], args: argparse.Namespace) -> int:
    """``--max-seq``: the longest train.seq_len that trains here, for the job and each baseline
    (:mod:`veomni_ops.train.maxseq`). Exits 1 where a probe failed other than out of memory."""
    from .maxseq import child_probe, device_memory, granularity_for, memory_bound, search

    if args.compare or args.plot or args.resume is not None:
        used = [o for o, v in (("--compare", args.compare), ("--plot", args.plot), ("--resume", args.resume))
                if v is not None]
        raise TrainConfigError(f"--max-seq searches CONFIG's job and its --baseline runs only; drop {', '.join(used)}")
    layout = job["parallel"]
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        raise TrainConfigError("--max-seq starts the ranks of each probe itself (torch.distributed.run, one probe at "
                               f"a time); run it without torchrun: veomni-ops train {job['path']} --max-seq")
    world = layout.world_size if layout is not None and not layout.is_trivial else 1
    for name in args.baseline:
        check_in_ranks(name, job, world > 1)
        check_baseline(name, job)
    human = sys.stderr if args.json else sys.stdout
    memory, where = device_memory(job)
    bound = memory_bound(job, memory)
    upper = min(x for x in (bound, args.max_seq_upto, 2 ** 40) if x is not None)
    start = int(job["train"]["seq_len"])
    if start > upper:
        raise TrainConfigError(f"--max-seq-upto {upper} is below the job's train.seq_len {start}: the search starts "
                               "at train.seq_len; raise --max-seq-upto or lower train.seq_len")
    grain = granularity_for(args.max_seq_granularity, layout.sp if layout is not None else 1)
    why_upper = (f"--max-seq-upto {args.max_seq_upto}" if args.max_seq_upto is not None and args.max_seq_upto == upper
                 else f"the longest whose lower bound of a step's memory fits {where}")
    print(f"== --max-seq: {job['path']}, batch_size {job['train']['batch_size']}, {args.max_seq_steps} step(s) a "
          f"probe{f', {world} ranks' if world > 1 else ''}; from seq_len {start:,}, doubling, then bisecting on "
          f"multiples of {grain:,}; at most {args.max_seq_probes} probes and seq_len {upper:,} ({why_upper})",
          file=human, flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="veomni-ops-max-seq-") as logs:
        for baseline in [None, *args.baseline]:
            title = f"baseline {baseline}" if baseline else os.path.basename(job["path"])
            print(f"== {title}", file=human, flush=True)
            inner = child_probe(job["path"], baseline=baseline, steps=args.max_seq_steps, world=world,
                                seed=args.seed, lock=args.lock if baseline is None else None, defaults=args.defaults,
                                log_dir=logs)

            def probe(seq_len: int, inner=inner):
                p = inner(seq_len)
                said = {"ok": f"trains, {p.peak_kind} {p.peak_gib or 0:.2f} GiB", "oom": f"out of memory: {p.message}",
                        "error": f"FAILED: {p.message}"}[p.status]
                print(f"  seq_len {seq_len:>9,}: {said} ({p.seconds or 0:.1f} s)", file=human, flush=True)
                return p

            found = search(probe, start, upper, grain, args.max_seq_probes)
            runs.append({"run": title, "baseline": baseline, **found})
            if found["stopped"] == "error":
                break
    _print_max_seq(runs, human)
    failed = [r for r in runs if r["stopped"] == "error"]
    out = {"max_seq": runs, "memory_bytes": memory, "memory": where, "bound": bound, "upper": upper,
           "granularity": grain, "steps": args.max_seq_steps, "batch_size": job["train"]["batch_size"],
           "passed": not failed}
    if args.json:
        print(json.dumps(finite_json(out), indent=2))
    if failed:
        r = failed[0]
        print(f"veomni-ops train --max-seq: {r['run']}: the probe at seq_len {r['probes'][-1]['seq_len']:,} failed "
              f"other than out of memory, so the search stopped: {r['error']}", file=sys.stderr)
        return 1
    return 0


_STOPPED = {"bisected": "bisected to the granularity", "bound": "the bound trained", "probe limit":
            "probe limit reached", "error": "a probe failed", "nothing trains": "nothing trains, down to seq_len 2"}


def _print_max_seq(runs: list[dict[str, Any]], out) -> None:
    width = max(len("run"), *(len(r["run"]) for r in runs)) + 2
    print(f"\n== longest train.seq_len that trains\n  {'run':<{width}}{'longest':>10}{'first failing':>15}"
          f"{'probes':>8}  stopped", file=out)
    for r in runs:
        longest = "-" if r["longest"] is None else f"{r['longest']:,}"
        failing = "-" if r["first_failed"] is None else f"{r['first_failed']:,}"
        print(f"  {r['run']:<{width}}{longest:>10}{failing:>15}{len(r['probes']):>8}  {_STOPPED[r['stopped']]}",
              file=out)
