"""PyTorch's own context parallelism (ring attention) as a peer of our Ulysses ``sp`` (issue 35).

The job of a ``veomni-ops train`` YAML (default ``examples/qwen3-30b-a3b-4layers-sp2.yaml``)
trained by plain transformers, no veomni-ops kernel bound, over the ranks of torchrun:

* the model: ``veomni_ops.train.build_model`` with ``attn_implementation="sdpa"`` (the job's
  config file and overrides, random weights from ``train.seed``), cast to the job's dtype and
  then sharded by ``veomni_ops.parallel.fsdp.shard_model`` as the job's own layouts shard it:
  ``fully_shard`` on each decoder layer and the root over all ranks, float32 master weights,
  bf16 compute / float32 reduce, gradients summed, explicit prefetch;
* the data: the job's global batches (``veomni_ops.train.data.job_batches``), the same on every
  rank, labels shifted on the *global* sequence, so every token predicts what it predicts in one
  process, and the loss normalised by the global count of predicted tokens;
* the sequence: split over the ranks by
  ``torch.distributed.tensor.experimental.context_parallel(mesh, buffers=[input_ids,
  shift_labels, position_ids], buffer_seq_dims=[1, 1, 1])`` with torch's head-tail load
  balancing (rank r of W holds chunks r and 2W-1-r of 2W: each rank the same causal work) and
  the K/V rotation ``--rotate allgather|alltoall`` (``set_rotate_method``). Inside the context
  ``F.scaled_dot_product_attention`` is torch's ring attention (flash, efficient or cuDNN SDPA
  per K/V block) for the forward and the backward;
* the MoE load-balancing loss (``output_router_logits: true`` in the job): over every rank's
  router logits (all-gathered, as the job's layouts compute it), so the per-step loss, summed
  over the ranks, is the single-process loss: comparable with the ``sp: 2`` job's losses.

The model is given an all-ones 2-D ``attention_mask`` (what a tokenizer gives for an unpadded
row): without it transformers reads the load-balanced ``position_ids`` (0..S/4-1, then
3S/4..S-1 on rank 0) as packed documents and builds a block mask, and ring attention needs
``is_causal=True`` and no mask. With it transformers skips the mask (sdpa, no padding) and
calls SDPA with ``is_causal=True``; rotary still reads the global ``position_ids``.

Timing: wall time of each step (forward, backward, optimizer step, the loss all-reduced and read
on the host) between ``torch.cuda.synchronize()`` calls; tokens/s are the global batch's tokens
over it, the median over the steps after ``--warmup`` (``veomni_ops.train.loop.rate_stats``, as
``veomni-ops train`` reports it). Peak memory: ``torch.cuda.max_memory_allocated`` of each rank.

Memory: plain transformers computes the loss from whole logits (``[tokens, vocab]`` in bf16, then
a float32 copy and its log-softmax): at 65,536 tokens over 2 ranks, 32,768 x 151,936 per rank,
about 10 + 20 + 20 GB before the backward, beside the float32 master shards, AdamW state and
gradients (~24 GB per rank for the 4-layer 30B-shaped model). The Ulysses job's loss kernel is
veomni-ops', so the two runs differ in more than the attention split (MoE experts, loss, norms);
an out-of-memory ends the run with one line (and ``{"error": "out of memory"}`` in ``--json``).

    torchrun --nproc-per-node 2 benchmarks/gpu/ring_attention.py --seq-len 65536 --json ring.json
    python benchmarks/gpu/ring_attention.py --dry-run            # anywhere: the plan, no training

CUDA only. On the CPU (gloo) torch 2.13's context parallelism refuses the attention:
``NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default does
not have a sharding strategy registered.`` (its ring handlers cover the CUDA flash, efficient and
cuDNN SDPA ops only), so ``--device cpu`` stops with that message before training; ``--dry-run``
and ``--help`` work anywhere (the model is built on the meta device: shapes only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_CONFIG = ROOT / "examples" / "qwen3-30b-a3b-4layers-sp2.yaml"
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32", "float32": "float32"}
CPU_REFUSAL = ("torch.distributed.tensor.experimental.context_parallel has no CPU attention: torch "
               "2.13 raises NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default "
               "does not have a sharding strategy registered (its ring handlers cover the CUDA flash, efficient "
               "and cuDNN SDPA ops only). Run on CUDA, or --dry-run here")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="the veomni-ops job YAML whose model, data, seed "
                    "and lr are trained (default: %(default)s)")
    ap.add_argument("--seq-len", type=int, help="tokens per row (default: the job's train.seq_len); a multiple of "
                    "2 x ranks for the load-balanced rotation")
    ap.add_argument("--steps", type=int, help="steps (default: the job's train.steps)")
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of the median (default 1, as the job)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="compute dtype (default: the job's train.dtype)")
    ap.add_argument("--rotate", choices=("allgather", "alltoall"), default="allgather",
                    help="how K/V shards travel between ranks (torch's set_rotate_method; default %(default)s)")
    ap.add_argument("--no-load-balance", action="store_true", help="contiguous sequence slices (no head-tail "
                    "rotation; rank 0 then idles in the causal part)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a model.config field (JSON value), e.g. num_hidden_layers=2; repeatable")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (default); cpu is refused: torch's context parallelism has no CPU attention")
    ap.add_argument("--json", metavar="PATH", help="write the result (rank 0) as JSON to PATH ('-': stdout)")
    ap.add_argument("--dry-run", action="store_true", help="no process group, no training: build the model on the "
                    "meta device and the first global batch, print what each rank would hold")
    ap.add_argument("--check", action="store_true", help="also train the first batch's step in one process (the "
                    "whole model on each rank, no context parallelism; a small --override config only) and exit 1 "
                    "unless the ring run's first loss matches it (1e-5 relative in float32, 2e-2 in bf16)")
    ap.add_argument("--world", type=int, default=None, help="ranks assumed by --dry-run (default: WORLD_SIZE or 2)")
    a = ap.parse_args(argv)
    if a.warmup < 0:
        ap.error("--warmup must be >= 0")
    return a


def load(a: argparse.Namespace) -> dict:
    """The job of ``--config`` with this run's overrides (read for another machine: not checked here)."""
    from veomni_ops.train.job import load_job

    job = load_job(a.config, here=False)
    t = job["train"]
    if a.seq_len:
        t["seq_len"] = a.seq_len
    if a.steps:
        t["steps"] = a.steps
    if a.dtype:
        t["dtype"] = DTYPES[a.dtype]
    t["device"] = a.device
    for item in a.override:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--override {item!r}: write KEY=VALUE")
        try:
            job["overrides"][key] = json.loads(value)
        except json.JSONDecodeError:
            job["overrides"][key] = value
    return job


def layout_plan(seq: int, world: int, balanced: bool) -> tuple[list[list[tuple[int, int]]], str]:
    """The token ranges [lo, hi) each rank holds, and how they were cut."""
    if balanced and seq % (2 * world) == 0:
        c = seq // (2 * world)
        return [[(r * c, (r + 1) * c), ((2 * world - 1 - r) * c, (2 * world - r) * c)] for r in range(world)], \
            f"head-tail load balancing: {2 * world} chunks of {c} tokens, rank r holds chunks r and {2 * world - 1}-r"
    why = "--no-load-balance" if not balanced else f"seq_len {seq} is no multiple of 2 x {world} ranks"
    c = seq // world
    return [[(r * c, (r + 1) * c)] for r in range(world)], f"contiguous slices of {c} tokens ({why})"


def dry_run(a: argparse.Namespace, job: dict) -> int:
    import torch
    from veomni_ops.parallel.fsdp import decoder_layers
    from veomni_ops.train.data import job_batches
    from veomni_ops.train.model import build_model

    world = a.world or int(os.environ.get("WORLD_SIZE", "2"))
    t = job["train"]
    model = build_model(job, "meta", attn_implementation="sdpa")
    params = sum(p.numel() for p in model.parameters())
    batch = next(job_batches(job, model.config.vocab_size, "cpu"))
    b, s = batch["input_ids"].shape
    ranges, how = layout_plan(s, world, not a.no_load_balance)
    cfg = model.config
    print(f"config: {job['path']} ({type(model).__name__}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads} q / {cfg.num_key_value_heads} kv heads, vocab {cfg.vocab_size}, "
          f"{params / 1e9:.3f} B parameters), attn_implementation {cfg._attn_implementation}")
    print(f"train: {t['steps']} steps of {b} x {s} tokens, {t['dtype']}, lr {t['lr']}, seed {t['seed']}, "
          f"router logits {'on (aux loss over all ranks)' if getattr(cfg, 'output_router_logits', False) else 'off'}")
    print(f"FSDP2: fully_shard on {len(decoder_layers(model))} decoder layers and the root over {world} ranks "
          "(veomni_ops.parallel.fsdp.shard_model)")
    print(f"context parallel over {world} ranks, rotate {a.rotate}: {how}")
    for r, rr in enumerate(ranges):
        print(f"  rank {r}: tokens " + ", ".join(f"[{lo}, {hi})" for lo, hi in rr)
              + f" = {sum(hi - lo for lo, hi in rr)} per row")
    print(f"first batch: input_ids {tuple(batch['input_ids'].shape)} {batch['input_ids'].dtype}, first row starts "
          f"{batch['input_ids'][0, :6].tolist()}; torch {torch.__version__}")
    return 0


def run(a: argparse.Namespace, job: dict) -> int:
    import torch
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method
    from veomni_ops.losses import shifted_labels
    from veomni_ops.parallel.comm import all_gather
    from veomni_ops.parallel.fsdp import shard_model
    from veomni_ops.train.data import job_batches
    from veomni_ops.train.loop import rate_stats
    from veomni_ops.train.model import adamw, build_model, peak_bytes

    if a.device == "cpu":
        raise SystemExit(CPU_REFUSAL)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    device = f"cuda:{local}"
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    out = sys.stderr if rank == 0 else open(os.devnull, "w")
    t = job["train"]
    steps, b, s, lr = int(t["steps"]), int(t["batch_size"]), int(t["seq_len"]), float(t["lr"])
    dtype = getattr(torch, t["dtype"])
    balanced = not a.no_load_balance and s % (2 * world) == 0
    if s % world:
        raise SystemExit(f"seq_len {s} is no multiple of the {world} ranks")
    _cp_options.enable_load_balance = not a.no_load_balance  # context_parallel turns it off where S % 2W != 0
    set_rotate_method(a.rotate)
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))

    reference = first_step_loss(job, device, dtype) if a.check else None
    # The job's build: weights drawn on this device from train.seed, cast to the dtype, then FSDP2's
    # float32 master copy of them (shard_model), as veomni-ops train builds its parallel runs.
    model = build_model(job, device, attn_implementation="sdpa").to(dtype=dtype)
    # the model's own load-balancing loss function (looked up before FSDP2 renames the class FSDP<name>)
    lbl = sys.modules[type(model).__module__].__dict__.get("load_balancing_loss_func")
    fsdp = shard_model(model, mesh, dtype)
    model.train()
    opt = adamw(model.parameters(), lr, device)
    cfg = model.config
    router = bool(getattr(cfg, "output_router_logits", False))
    if router and lbl is None:
        raise SystemExit(f"{type(model).__name__} returns router logits and its module has no load_balancing_loss_func "
                         "to compute the aux loss over every rank's tokens with; set output_router_logits false")
    lbl = lbl if router else None
    coef = float(getattr(cfg, "router_aux_loss_coef", 0.0))
    _, how = layout_plan(s, world, not a.no_load_balance)
    print(f"ring attention peer: {job['path']} ({type(model).__name__}, {cfg.num_hidden_layers} layers), plain "
          f"transformers {transformers.__version__} sdpa, torch {torch.__version__}; {world} ranks: FSDP2 "
          f"({fsdp.get('reshard_why', '')}) and context_parallel, rotate {a.rotate}, {how}; {steps} steps of "
          f"{b} x {s} tokens, {t['dtype']}", file=out, flush=True)

    torch.cuda.reset_peak_memory_stats()
    losses: list[float] = []
    rates: list[float] = []
    for i, batch in enumerate(job_batches(job, cfg.vocab_size, device)):
        ids = batch["input_ids"].clone()
        shift = shifted_labels(batch["labels"], -100)  # on the global sequence, before the split
        pos = torch.arange(s, device=device).expand(b, s).contiguous()
        count = (shift != -100).sum().to(torch.float32)  # every rank holds the global batch: the global count
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with context_parallel(mesh, buffers=[ids, shift, pos], buffer_seq_dims=[1, 1, 1],
                              no_restore_buffers={ids, shift, pos}):
            outp = model(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids), labels=shift,
                         shift_labels=shift, num_items_in_batch=count, use_cache=False)
            loss = outp.loss  # this rank's share of the global cross-entropy (+ its local aux loss)
            if lbl is not None and outp.aux_loss is not None:
                # the aux loss over every rank's tokens (a product of token means: no per-rank share),
                # 1/world of it on each rank so that the ranks' losses sum to the single-process loss
                layers = torch.stack([g.reshape(-1, g.shape[-1]) for g in outp.router_logits])  # [L, T, E]
                got = all_gather(None, layers)  # [world, L, T, E], differentiable
                per_layer = tuple(got[:, j].reshape(-1, got.shape[-1]) for j in range(got.shape[1]))
                full = lbl(per_layer, cfg.num_experts, cfg.num_experts_per_tok, None)
                loss = loss - coef * outp.aux_loss + coef * full / world
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = loss.detach().float().reshape(1).clone()
        dist.all_reduce(total)
        losses.append(float(total))
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rates.append(b * s / dt)
        print(f"step {i + 1:>3}/{steps}  loss {losses[-1]:8.4f}  {rates[-1]:10.0f} tok/s  peak allocated "
              f"{torch.cuda.max_memory_allocated() / 2**30:6.2f} GiB" + ("  (warm-up)" if i < a.warmup else ""),
              file=out, flush=True)
    peak, kind = peak_bytes(device)
    peaks = [0.0] * world
    dist.all_gather_object(peaks, peak / 2**30)
    stats = rate_stats(rates, a.warmup)
    result = {
        "run": "ring-attention", "config": job["path"], "config_file": job.get("config_file"),
        "architecture": job["architecture"], "attention": "sdpa under torch context_parallel (ring)",
        "bound": None, "device": torch.cuda.get_device_name(), "world_size": world, "dtype": t["dtype"],
        "steps": steps, "batch_size": b, "seq_len": s, "seed": t["seed"], "lr": lr,
        "parallel": {"cp": world, "dp_shard": world, "fsdp": fsdp, "rotate": a.rotate, "load_balance": balanced,
                     "split": how},
        "aux_loss": "over all ranks' router logits" if lbl is not None else None,
        "losses": losses, "final_loss": losses[-1] if losses else float("nan"),
        **stats, "step_tokens_per_s": rates, "peak_gib": max(peaks), "peak_gib_per_rank": peaks, "peak_kind": kind,
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
    }
    status = 0
    if reference is not None:
        tol = (1e-5 if dtype == torch.float32 else 2e-2) * max(abs(reference), 1.0)
        ok = bool(losses) and abs(losses[0] - reference) <= tol
        result["check"] = {"one_process_first_loss": reference, "ring_first_loss": losses[0] if losses else None,
                           "tolerance": tol, "ok": ok}
        status = 0 if ok else 1
        print(f"check: first-step loss ring {losses[0] if losses else float('nan'):.7f} vs one process "
              f"{reference:.7f} (|diff| {abs(losses[0] - reference) if losses else float('nan'):.2e}, tolerance "
              f"{tol:.1e}): {'PASS' if ok else 'FAIL'}", file=out, flush=True)
    if rank == 0:
        lo, hi = stats["timed_steps"]
        print(f"ring attention ({a.rotate}, {'balanced' if balanced else 'contiguous'}): {world} x "
              f"{torch.cuda.get_device_name()}, seq {s}: median {stats['tokens_per_s']:.0f} tok/s over steps "
              f"{lo}..{hi}, peak {max(peaks):.2f} GiB/rank, final loss {result['final_loss']:.4f}", flush=True)
        if a.json == "-":
            print(json.dumps(result))
        elif a.json:
            Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return status


def first_step_loss(job: dict, device: str, dtype) -> float:
    """The first batch's loss in one process: the job's model whole on this device (the same weights
    as the sharded one), plain transformers, no context parallelism (the model's own aux loss, over
    the whole batch)."""
    import gc

    import torch
    from veomni_ops.train.data import job_batches
    from veomni_ops.train.model import build_model

    model = build_model(job, device, attn_implementation="sdpa").to(dtype=dtype)
    batch = next(job_batches(job, model.config.vocab_size, device))
    with torch.no_grad():
        loss = float(model(input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False).loss.float())
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return loss


def main(argv=None) -> int:
    a = parse_args(argv)
    job = load(a)
    if a.dry_run:
        return dry_run(a, job)
    try:
        return run(a, job)
    except Exception as e:  # out of memory: say so in one line and in --json (torchrun ends the other ranks)
        import torch

        if not isinstance(e, torch.cuda.OutOfMemoryError):
            raise
        peak = torch.cuda.max_memory_allocated() / 2**30
        rank = int(os.environ.get("RANK", "0"))
        print(f"ring attention: out of memory at seq_len {job['train']['seq_len']} on rank {rank} (peak allocated "
              f"{peak:.2f} GiB before it): {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        if rank == 0 and a.json and a.json != "-":
            Path(a.json).write_text(json.dumps({"run": "ring-attention", "config": job["path"], "error": "out of memory",
                                                "seq_len": job["train"]["seq_len"], "rotate": a.rotate,
                                                "peak_gib_rank0": peak, "message": str(e)}, indent=1) + "\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
