"""One training run: build, bind (or patch, for a baseline), compile where asked, train N steps;
and the same in a child process of its own, so its peak memory is its own."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from .baselines import BASELINES, apply_liger, check_baseline, compile_apply, liger_version
from .data import PackingStats, describe, job_batches
from .errors import RunFailed, TrainConfigError
from .job import plan_device
from .model import (
    adamw,
    build_config,
    build_model,
    checkpoint_layers,
    peak_bytes,
    reference_model,
    resolve_device,
    step_hooks,
)
from .restart import Progress, fault_hooks


def rate_stats(rates: list[float], warmup: int) -> dict[str, Any]:
    """Median and spread of per-step tokens/s over the steps after ``warmup`` (all, if none is left)."""
    steady = rates[warmup:] if len(rates) > warmup else list(rates)
    first = warmup + 1 if len(rates) > warmup else 1
    if len(steady) >= 2:
        p25, _, p75 = statistics.quantiles(steady, n=4, method="inclusive")
    else:
        p25 = p75 = steady[0] if steady else float("nan")
    return {
        "tokens_per_s": statistics.median(steady) if steady else float("nan"),
        "tokens_per_s_p25": p25, "tokens_per_s_p75": p75,
        "tokens_per_s_min": min(steady, default=float("nan")), "tokens_per_s_max": max(steady, default=float("nan")),
        "warmup_steps": warmup if len(rates) > warmup else 0, "timed_steps": [first, len(rates)],
    }


def _prepare(job: dict[str, Any], baseline: str | None, device: str, dtype, out, rt=None) -> tuple[Any, dict[str, Any]]:
    """Build the model for this run, bind or patch it, compile it where asked. Returns (model, facts).
    ``rt``: the parallel runtime of this rank (the plan is resolved and wrapped for its layout, then FSDP2)."""
    import torch
    import transformers

    t = job["train"]
    compiled = bool(t["compile"]) if baseline is None else baseline.endswith("+compile")
    backend = t.get("compile_backend", "inductor")
    mode = t.get("compile_mode", "default")  # the job's own layers only; a baseline compiles as its users do
    if compiled and rt is not None and mode != "default":  # torchrun without a parallel section
        raise TrainConfigError(f"train.compile_mode {mode!r} is for one process, not {rt.world_size}: remove it")
    if baseline is None:
        model, facts = _bind(job, device, dtype, out, rt, compiled)
    else:
        model = build_model(job, device, attn_implementation="sdpa")
        facts = {"plan": None, "bound": None, "baseline_about": BASELINES[baseline],
                 "transformers_version": transformers.__version__}
        if rt is not None:  # a user's FSDP2 script (.peers.UserFSDP2): float32 master weights, sharded
            model = rt.shard(model, dtype)
            facts["parallel"] = rt.to_dict()
        else:
            model = model.to(dtype=dtype)
        if baseline == "liger":
            facts["liger_patch"] = apply_liger(model)
            facts["liger_version"] = liger_version()
        print(f"baseline {baseline}: {BASELINES[baseline]} (transformers {transformers.__version__}"
              + (f", liger-kernel {facts['liger_version']}: {facts['liger_patch']}" if baseline == "liger" else "")
              + ")", file=out)
    facts["gradient_checkpointing"] = False
    if t.get("gradient_checkpointing"):  # every run of a comparison alike: the job's, and each baseline's
        g = facts["gradient_checkpointing"] = checkpoint_layers(model)
        print(f"gradient checkpointing: {g['layers']} {', '.join(g['classes'])} recomputed in the backward "
              f"({g['how']})", file=out)
    if compiled and rt is not None:
        rt.compile(model, backend)
        c = rt.compile_facts
        facts["parallel"] = rt.to_dict()
        print(f"torch.compile (backend {backend}): {c['layers']} {c['what']} ({', '.join(c['classes'])}), each "
              f"compiled in place after FSDP2; eager: {c['eager']}. The first steps include compilation", file=out)
    elif compiled and baseline is None:
        # Each decoder layer, not the whole model: the attention mask is then built eagerly, and left
        # out for an unpadded batch, so that sdpa keeps its flash path (compile_layers says why).
        from ..parallel.fsdp import compile_layers

        c = facts["compile"] = compile_layers(model, backend, mode=mode)
        print(f"torch.compile (backend {backend}{', mode ' + mode if mode != 'default' else ''}): {c['layers']} {c['what']} "
              f"({', '.join(c['classes'])}), each compiled in place; eager: {c['eager']}. The first steps include compilation", file=out)
    elif compiled:  # a baseline: the whole model, as its users compile it
        model = torch.compile(model, backend=backend)
        print(f"torch.compile (backend {backend}): the whole model; the first steps include compilation", file=out)
    facts["compiled"] = compiled
    return model, facts


def _bind(job: dict[str, Any], device: str, dtype, out, rt, compiled: bool) -> tuple[Any, dict[str, Any]]:
    """The job's model bound to its plan (for the layout, and FSDP2-sharded, under ``rt``); built
    on the meta device and materialised with the normal build's weights for ``init_device: meta``.
    ``facts["kernels"]``: the kernel bound for each op and variant (what a checkpoint keeps)."""
    from ..binding import apply
    from .checkpoint import plan_fingerprint

    if compiled:
        compile_apply(apply)
    meta = job["train"].get("init_device") == "meta"
    model = build_model(job, "meta" if meta else device).to(dtype=dtype)
    kw: dict[str, Any] = {"device": plan_device(device)}
    if rt is not None:
        rt.prepare(model)
        kw["parallel"] = rt
    kw["lock"] = job.get("lock")  # --lock, the job's lock: key, or (None) VEOMNI_OPS_LOCK
    kw["memory"] = memory_budget(job, device, dtype, model, rt)
    binding = apply(model, job["ops"], compile=True, **kw) if compiled else apply(model, job["ops"], **kw)
    print(binding.plan.table(), file=out)
    print(f"bound: {json.dumps(binding.summary())}", file=out)
    facts: dict[str, Any] = {"plan": binding.plan.to_dict(), "bound": binding.summary(),
                             "kernels": plan_fingerprint(binding), "init_device": "meta" if meta else "device"}
    if kw["memory"] is not None:
        facts["memory_budget"] = {"free_gib": kw["memory"].free_bytes / 2**30, "shapes": kw["memory"].shapes}
    if rt is not None:
        print(rt.describe(), file=out)
        model = rt.parallelize(model, binding, dtype)
        f = rt.fsdp_facts
        print(f"  FSDP2: reshard_after_forward={f['reshard_after_forward']}"
              + (f" ({f['reshard_why']})" if "reshard_why" in f else "") + f"; prefetch {f['prefetch']}", file=out)
        if meta:  # rank 0 builds the reference; every rank takes its shards of it
            rt.materialize(model, reference_model(job, dtype) if rt.rank == 0 else None)
        facts["parallel"] = rt.to_dict()
    elif meta:
        from ..parallel.fsdp import init_from_reference

        init_from_reference(model, reference_model(job, dtype), device)
    if meta:
        print(f"init: built on the meta device, bound{', FSDP2-sharded' if rt is not None else ''}, then "
              f"materialised on {device} with the weights and buffers of the normal build (built on the CPU"
              f"{' by rank 0 and broadcast a tensor at a time' if rt is not None else ''})", file=out)
    return model, facts


def memory_budget(job: dict[str, Any], device: str, dtype, model, rt=None):
    """What ``auto`` may give the kernels on a CUDA device (:class:`~veomni_ops.target.MemoryBudget`):
    the memory free now (the driver's, plus what PyTorch holds cached and unused) and the loss's
    shapes at the tokens one rank's loss sees (its rows of the batch, its slice of the sequence).
    ``None`` elsewhere. Built on the meta device (one process), the weights still to come are
    counted out of it."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    from ..target import MemoryBudget

    t = job["train"]
    rows, seq = int(t["batch_size"]), int(t["seq_len"])
    if rt is not None:
        rows, seq = rows // rt.layout.dp_degree, -(-seq // rt.layout.sp)
    cfg = model.config.get_text_config()
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if rt is None and any(p.is_meta for p in model.parameters()):
        free -= sum(p.numel() * p.element_size() for p in model.parameters())
    shapes = {"tokens": rows * seq, "hidden": int(cfg.hidden_size), "vocab": int(cfg.vocab_size),
              "itemsize": dtype.itemsize}
    return MemoryBudget(max(0, free), shapes={"cross_entropy": shapes})


def rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def is_parallel(job: dict[str, Any]) -> bool:
    """Does this job run the parallel path: launched by torchrun (even with one process: the
    world-size-1 NCCL/gloo path), or with a non-trivial ``parallel:`` layout?"""
    from ..parallel.layout import world_from_env

    under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    return under_torchrun or world_from_env() > 1 or (job.get("parallel") is not None
                                                      and not job["parallel"].is_trivial)


def train_one(job: dict[str, Any], out=sys.stderr, baseline: str | None = None, before_step=None) -> dict[str, Any]:
    if baseline is None and is_parallel(job):
        return _train_parallel(job, out)
    return _train(job, out, baseline, before_step=before_step)


def check_layout(job: dict[str, Any]):
    """The job's layout (data parallel over every process without a ``parallel:`` section),
    refused where it does not fit the world, the model or the batch: every rank refuses the same
    way, before any collective."""
    from ..parallel import ParallelLayout
    from ..parallel.layout import world_from_env
    from ..parallel.nodes import Nodes, check_nodes

    layout = job.get("parallel") or ParallelLayout.data_parallel(world_from_env())
    layout.check_world(world_from_env())
    check_nodes(layout, Nodes.from_env())  # sp/ep groups within a node (torchrun's LOCAL_WORLD_SIZE)
    layout.check_model(build_config(job))
    layout.check_batch(int(job["train"]["batch_size"]))
    return layout


def _train_parallel(job: dict[str, Any], out) -> dict[str, Any]:
    """This rank's part of a parallel job (``veomni_ops.parallel``); only rank 0 prints."""
    from ..parallel import ParallelRuntime

    layout = check_layout(job)
    with ParallelRuntime.from_env(layout, resolve_device(job["train"]["device"])) as rt:
        return train_on_rank(job, out, None, rt)


def train_on_rank(job: dict[str, Any], out, baseline: str | None, rt) -> dict[str, Any]:
    """:func:`_train` on this rank of ``rt``; only rank 0 prints (the others into /dev/null)."""
    if rt.rank != 0:
        with open(os.devnull, "w") as quiet:
            return _train(job, quiet, baseline, rt)
    return _train(job, out, baseline, rt)


def _train(job: dict[str, Any], out, baseline: str | None = None, rt=None, before_step=None) -> dict[str, Any]:
    """:func:`_run` at the run's intra-op thread count (:func:`run_threads`); this process's
    count is restored after it."""
    import torch

    source = None
    if baseline is None and (job["train"].get("checkpoint_dir") or job["train"].get("resume")):
        from .checkpoint import find_resume
        from .restart import announce

        source = find_resume(job["train"])
        announce(job["train"], source, out)  # resume: auto says which it took
    before = torch.get_num_threads()
    torch.set_num_threads(run_threads(job["train"], source, out))
    try:
        return _run(job, out, baseline, rt, source, before_step)
    finally:
        torch.set_num_threads(before)


def run_threads(train: dict[str, Any], source: str | None, out) -> int:
    """How many intra-op CPU threads a run takes: ``train.threads``; ``auto``: the count the
    checkpoint it resumes from (``source``) was written at, else torch's count in this process
    (``OMP_NUM_THREADS``, else the CPUs). torch splits a CPU float32 sum over its threads, and
    another split rounds otherwise: resumed at another count, the losses are not bitwise those of
    a run never stopped."""
    import torch

    if train.get("threads", "auto") != "auto":
        return int(train["threads"])
    here = torch.get_num_threads()
    if source is not None:
        from .checkpoint import read_info

        written = read_info(source).get("threads")
        if isinstance(written, int) and written >= 1 and written != here:
            print(f"threads: {written} intra-op thread(s), the count {source} was written at, for the losses of a "
                  f"run never stopped (torch's count in this process is {here}; train.threads sets another)",
                  file=out, flush=True)
            return written
    return here


def _run(job: dict[str, Any], out, baseline: str | None, rt, source: str | None, before_step=None) -> dict[str, Any]:
    """One run of ``job`` on this rank (of ``rt``; None: one process), from the checkpoint
    ``source`` where it resumes; ``before_step(n)`` before step n (benchmarks/gpu/step_memory.py)."""
    import torch

    t = job["train"]
    device = rt.device if rt is not None else resolve_device(t["device"])
    if baseline is not None:
        check_baseline(baseline, job, device)
    dtype = getattr(torch, t["dtype"])
    model, facts = _prepare(job, baseline, device, dtype, out, rt)
    before_step = step_hooks(facts, before_step)  # CUDA graphs (train.compile_mode reduce-overhead): mark each step
    model.train()
    lr = float(t["lr"])
    opt = adamw(model.parameters(), lr, device) if rt is None else rt.adamw(model, lr)
    steps, b, s = int(t["steps"]), int(t["batch_size"]), int(t["seq_len"])
    vocab = model.config.vocab_size
    # Checkpoints (train.checkpoint_dir / resume; never for a baseline, a measurement of another stack):
    # a resumed run starts after the checkpoint's step, with its losses so far.
    start, ckpt, restarted = 0, None, None
    losses: list[float] = []
    me = rt.rank if rt is not None else 0
    progress = Progress(t if baseline is None else {}, me)  # what a restart lost (.restart)
    if baseline is None and (t.get("checkpoint_dir") or t.get("resume")):
        from .checkpoint import Checkpointer

        ckpt = Checkpointer(job, model, opt, device, rt, out, facts["kernels"])
        if source is not None:
            start, losses = ckpt.load(source, vocab)
            restarted = progress.resumed(start, out)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    warmup = 2 if facts["compiled"] else 1  # allocation and autotuning; compilation too when compiled
    rates: list[float] = []
    packed = PackingStats(s)
    for i, batch in enumerate(job_batches(job, vocab, device, start), start=start):
        if i == start and (line := describe(job, batch, i + 1)):
            print(line, file=out, flush=True)
        fault_hooks(i + 1, me)
        if before_step is not None:
            before_step(i + 1)
        packed.add(batch)
        t0 = time.perf_counter()
        outp = model(**step_inputs(batch, rt, baseline))
        outp.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = float(outp.loss.detach()) if rt is None else rt.global_loss(outp.loss)  # the one host sync per step
        dt = time.perf_counter() - t0
        rate = b * s / dt
        losses.append(loss)
        progress.step_done(i + 1, dt)
        rates.append(rate)
        peak, what = peak_bytes(device)
        done = (i + 1) * 20 // steps  # a bar of 20
        print(f"[{'#' * done}{'.' * (20 - done)}] step {i + 1:>3}/{steps}  loss {loss:8.4f}  "
              f"{rate:10.0f} tok/s  {what} {peak / 2**30:6.2f} GiB" + ("  (warm-up)" if i - start < warmup else ""),
              file=out, flush=True)
        compile_facts = rt.compile_facts if rt is not None else facts.get("compile")
        if i == start and compile_facts:  # decoder layers compiled (a whole-model baseline: not counted)
            from ..parallel.fsdp import graph_breaks

            breaks = compile_facts["graph_breaks"] = graph_breaks()
            print("torch.compile: graph breaks in the first step: " + ("; ".join(f"{n} x {why}" for why, n in
                                                                          breaks.items()) or "none"), file=out)
        if ckpt is not None and ckpt.due(i + 1):
            ckpt.save(i + 1, losses, vocab)
    peak, what = peak_bytes(device)
    stats = rate_stats(rates, warmup)
    stats["timed_steps"] = [n + start for n in stats["timed_steps"]]  # steps of the job (a resumed run's start late)
    result = {
        "run": baseline or os.path.basename(job["path"]), "config": job["path"], "baseline": baseline,
        "architecture": job["architecture"], "size": job["size"], "config_file": job.get("config_file"),
        "device": device, "dtype": t["dtype"], "steps": steps, "batch_size": b, "seq_len": s, "seed": t["seed"],
        "threads": torch.get_num_threads(), **facts, "losses": losses, "final_loss": losses[-1] if losses else float("nan"),
        "first_step": start + 1, "resumed_from": source, "checkpoint_dir": t.get("checkpoint_dir"),
        **stats, "step_tokens_per_s": rates, "peak_gib": peak / 2**30, "peak_kind": what, "restart": restarted,
    }
    if (data := packed.to_dict(job)) is not None:
        result["data"] = data
    lo, hi = stats["timed_steps"]
    print(f"done: final loss {result['final_loss']:.4f}, median {stats['tokens_per_s']:.0f} tok/s over steps "
          f"{lo}..{hi} ({stats['warmup_steps']} warm-up step(s) excluded; p25..p75 {stats['tokens_per_s_p25']:.0f}.."
          f"{stats['tokens_per_s_p75']:.0f}, min..max {stats['tokens_per_s_min']:.0f}..{stats['tokens_per_s_max']:.0f})"
          f", {what} {result['peak_gib']:.2f} GiB", file=out)
    if data is not None:
        print(f"data: {data['documents']} packed documents in {data['rows']} rows: {data['documents_per_row']:.1f} "
              f"per row, mean length {data['mean_doc_len']:.1f} tokens", file=out)
    return result


def step_inputs(batch: dict[str, Any], rt=None, baseline: str | None = None) -> dict[str, Any]:
    """The model's inputs for one step of the job's ``batch`` (:func:`~veomni_ops.train.data.job_batches`):
    under a parallel layout (``rt``) this rank's rows and sequence slice of the global batch
    (packed: with the position_ids of the whole row, which sequence parallelism gathers); in one
    process the whole batch. use_cache=False for the job (as shard_batch gives it): training builds
    no KV cache (transformers builds one by default; a compiled layer would trace it, and recompile
    for each layer's index). A baseline is called as its users call it."""
    fields: dict[str, Any] = {k: batch[k] for k in ("input_ids", "labels", "position_ids") if k in batch}
    if rt is not None:
        return rt.shard_batch(**fields)
    return fields if baseline else {**fields, "use_cache": False}


def run_child(path: str, seed: int | None, steps: int | None = None, baseline: str | None = None,
              lock: str | None = None, defaults: str = "auto", resume: str | bool | None = None,
              seq_len: int | None = None) -> dict[str, Any]:
    """Train ``path`` (as ``baseline`` if given; with the plan lock ``lock`` passed as ``--lock``,
    ``--defaults``, ``resume`` as ``--resume``: True, or a path, and ``--seq-len``) in a fresh process so its peak
    memory is its own."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as fh:
        out_path = fh.name
    cmd = child_command(path, out_path, seed=seed, steps=steps, seq_len=seq_len, baseline=baseline, lock=lock,
                        defaults=defaults, resume=resume)
    try:
        try:
            sink: int | None = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):  # a stream with no descriptor (captured): pass it through
            sink = None
        proc: subprocess.CompletedProcess[Any]
        if sink is not None:
            proc = subprocess.run(cmd, stdout=sink, stderr=sink)
        else:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            sys.stderr.write(proc.stdout)
        what = f"baseline {baseline} of {path}" if baseline else path
        if proc.returncode != 0:
            # The child wrote why into the result file (_run_as_child); a crash that could not is told by its exit.
            why = _child_error(out_path)
            raise RunFailed(f"training {what} failed: {why}" if why else
                            f"training {what} failed (exit {proc.returncode}); see the output above")
        with open(out_path) as fh:
            return json.load(fh)
    finally:
        os.unlink(out_path)


def child_command(path: str, result_file: str, *, seed: int | None = None, steps: int | None = None,
                  seq_len: int | None = None, baseline: str | None = None, lock: str | None = None, defaults: str = "auto",
                  resume: str | bool | None = None, tune_trial: bool = False, max_seq_probe: bool = False,
                  python: Sequence[str] = (sys.executable,)) -> list[str]:
    """The command line of a child ``veomni-ops train`` run writing its result to ``result_file``
    (:func:`run_child`'s; ``tune_trial``: a trial of ``veomni-ops tune``, see ``--tune-trial``;
    ``max_seq_probe``: a probe of ``--max-seq``, which writes and resumes no checkpoint).
    ``python``: the interpreter command."""
    cmd = [*python, "-m", "veomni_ops.cli", "train", path, "--result-file", result_file]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    if seq_len is not None:
        cmd += ["--seq-len", str(seq_len)]
    if baseline is not None:
        cmd += ["--as-baseline", baseline]
    if lock is not None:
        cmd += ["--lock", lock]
    if defaults != "auto":
        cmd += ["--defaults", defaults]
    if resume is not None and baseline is None:
        cmd += ["--resume"] + ([] if resume is True else [os.path.abspath(str(resume))])
    if tune_trial:
        cmd.append("--tune-trial")
    if max_seq_probe:
        cmd.append("--max-seq-probe")
    return cmd


def read_result(path: str) -> dict[str, Any] | None:
    """A child run's result file: its result, or the ``{"error": ..., "kind": ...}`` of a failure;
    None where it wrote none (it crashed) or half of one."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _child_error(path: str) -> str | None:
    """The error a failed child run wrote into its result file, if it could."""
    data = read_result(path)
    return data.get("error") if data is not None and isinstance(data.get("error"), str) else None
