"""Time and profile `veomni-ops train` steps: one process, or one rank of a torchrun job.

    python benchmarks/gpu/par_profile.py JOB.yaml --out DIR                       # one GPU
    torchrun --nproc-per-node 2 benchmarks/gpu/par_profile.py JOB.yaml --out DIR  # a parallel job

The model is prepared exactly as `veomni-ops train` prepares it (``loop._prepare``: build, plan
for the layout, bind, FSDP2) and every step is the loop's step (shard the global batch, forward,
backward, AdamW, the global loss read on the host). ``--steps`` timed steps (median after one
warm-up, as the CLI), then ``--profile-steps`` more under ``torch.profiler``. Each rank writes
``DIR/<name>.r<rank>.json`` (rates, losses, the trace summary of :func:`summarize`) and rank 0
also its gzipped Chrome trace and the profiler's top-kernel table.

:func:`summarize` reads a Chrome trace: per step, wall time, time with any kernel running,
collective (NCCL) time and the part of it no compute kernel overlaps ("exposed"), kernel time
by kind, the collectives issued (``c10d::`` ops: count, and the elements of their largest tensor), host
synchronisations (``cudaStreamSynchronize`` and device-to-host copies) and FSDP2's own regions.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from typing import Any


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _length(iv: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in iv)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of union ``a`` not covered by union ``b`` (both sorted, disjoint)."""
    total, j = 0.0, 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while cur < e:
            if k >= len(b) or b[k][0] >= e:
                total += e - cur
                break
            if b[k][0] > cur:
                total += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
    return total


def _numel(dims: Any) -> int:
    """Elements of a profiler ``Input Dims`` entry (a shape, or a list of shapes for a tensor list)."""
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        return sum(_numel(d) for d in dims)
    if isinstance(dims, list) and all(isinstance(x, int) for x in dims):
        out = 1
        for x in dims:
            out *= x
        return out if dims else 0
    return 0


def kind(name: str) -> str:
    n = name.lower()
    if "nccl" in n:
        for c in ("allgather", "reducescatter", "allreduce", "sendrecv", "alltoall", "broadcast"):
            if c in n:
                return "nccl_" + c
        return "nccl_other"
    if any(k in n for k in ("gemm", "cutlass", "sm90", "nvjet", "xmma", "cublas", "wgmma", "grouped_mm")):
        return "matmul"
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if "triton" in n:
        return "triton"
    if "adam" in n or "multi_tensor" in n:
        return "optimizer(multi_tensor)"
    if "copy" in n or "cast" in n or "chunk_cat" in n or "split_with_sizes" in n:
        return "copy/cast"
    if "reduce" in n:
        return "reduce"
    if "elementwise" in n or "vectorized" in n:
        return "elementwise"
    return "other"


#: Host calls that launch GPU work (the runtime's and the driver's names; a graph replay is one call).
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                "cudaLaunchCooperativeKernel")


def summarize(trace_path: str, step_prefix: str = "train_step") -> dict[str, Any]:
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    steps = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith(step_prefix)
             and e.get("cat") == "user_annotation"]
    n = max(len(steps), 1)
    wall = sum(e["dur"] for e in steps)
    lo = min((e["ts"] for e in steps), default=0.0)
    hi = max((e["ts"] + e["dur"] for e in steps), default=float("inf"))
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and lo <= e["ts"] <= hi]
    comm = _union([(e["ts"], e["ts"] + e["dur"]) for e in gpu if "nccl" in e["name"].lower()])
    comp = _union([(e["ts"], e["ts"] + e["dur"]) for e in gpu if "nccl" not in e["name"].lower()])
    busy = _union(comm + comp)
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in gpu:
        by_kind[kind(e["name"])] += e["dur"]
        rec = by_name[e["name"][:110]]
        rec[0] += e["dur"]
        rec[1] += 1
    cpu = [e for e in events if e.get("ph") == "X" and lo <= e.get("ts", -1) <= hi]
    syncs: Counter[str] = Counter()
    for e in cpu:
        nm = e.get("name", "")
        if nm in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"):
            syncs[nm] += 1
        elif nm.startswith("cudaMemcpy") and "DtoH" in json.dumps(e.get("args", {})):
            syncs["memcpy DtoH"] += 1
        elif nm in ("aten::item", "aten::_local_scalar_dense"):
            syncs[nm] += 1
    # launches: the host's launch calls (a CUDA graph's replay is one cudaGraphLaunch) and the kernels run
    launches: Counter[str] = Counter(e.get("name", "") for e in cpu if e.get("name", "") in LAUNCH_CALLS)
    colls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in cpu:
        nm = str(e.get("name", ""))
        if nm.startswith("c10d::"):
            a = e.get("args", {})
            types = [t for t in (a.get("Input type") or []) if t]
            rec = colls[f"{nm} {types[0] if types else ''}"]
            rec[0] += 1
            rec[1] += max((_numel(d) for d in (a.get("Input Dims") or [])), default=0)
    regions: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in cpu:
        nm = str(e.get("name", ""))
        if nm.startswith("FSDP::") or nm.startswith("veomni::") or nm.startswith("Optimizer.step"):
            regions[nm][0] += e["dur"]
            regions[nm][1] += 1
    ms = 1e-3 / n
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:30]
    return {
        "steps": len(steps),
        "wall_ms": wall * ms,
        "gpu_busy_ms": _length(busy) * ms,
        "gpu_idle_ms": (wall - _length(busy)) * ms,
        "compute_ms": _length(comp) * ms,
        "comm_ms": _length(comm) * ms,
        "comm_exposed_ms": _minus(comm, comp) * ms,
        "kernel_ms_by_kind": {k: v * ms for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": k, "ms": v[0] * ms, "calls": v[1] / n} for k, v in top],
        "host_syncs_per_step": {k: v / n for k, v in syncs.items()},
        "launch_calls_per_step": {k: v / n for k, v in sorted(launches.items())},
        "kernels_per_step": sum(1 for e in gpu if e.get("cat") == "kernel") / n,
        "collectives_per_step": {k: {"calls": v[0] / n, "largest_tensor_nelems": v[1] / n}
                                 for k, v in sorted(colls.items())},
        "cpu_regions_ms_per_step": {k: {"ms": v[0] * ms, "calls": v[1] / n}
                                    for k, v in sorted(regions.items(), key=lambda kv: -kv[1][0])[:25]},
    }


def profile_steps(step, batches, out_dir: str, name: str, rank: int) -> dict[str, Any]:
    """Run ``step(batch)`` for each batch under torch.profiler; rank 0 keeps its trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts, record_shapes=True) as prof:
        for i, ids in enumerate(batches):
            with record_function(f"train_step#{i}"):
                step(ids)
    trace = os.path.join(out_dir, f"{name}.r{rank}.trace.json")
    prof.export_chrome_trace(trace)
    summary = summarize(trace)
    if rank == 0:
        with open(trace, "rb") as src, gzip.open(trace + ".gz", "wb", compresslevel=6) as dst:
            dst.write(src.read())
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        with open(os.path.join(out_dir, f"{name}.r0.table.txt"), "w") as fh:
            fh.write(prof.key_averages().table(sort_by=sort, row_limit=45, max_name_column_width=70))
    os.unlink(trace)
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--out", required=True)
    ap.add_argument("--name")
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--profile-steps", type=int, default=3)
    a = ap.parse_args()
    from veomni_ops.train.job import load_job
    from veomni_ops.train.loop import is_parallel

    job = load_job(a.config)
    job["train"]["steps"] = a.steps
    name = a.name or os.path.splitext(os.path.basename(a.config))[0]
    os.makedirs(a.out, exist_ok=True)
    if is_parallel(job):
        from veomni_ops.parallel import ParallelLayout, ParallelRuntime
        from veomni_ops.parallel.layout import world_from_env
        from veomni_ops.train.model import resolve_device

        layout = job.get("parallel") or ParallelLayout.data_parallel(world_from_env())
        with ParallelRuntime.from_env(layout, resolve_device(job["train"]["device"])) as rt:
            _run(job, rt, a, name)
    else:
        _run(job, None, a, name)
    return 0


def _run(job: dict[str, Any], rt, a, name: str) -> None:
    import torch
    from veomni_ops.train.loop import _prepare
    from veomni_ops.train.model import adamw, resolve_device, step_hooks, synthetic_batches

    t = job["train"]
    rank = rt.rank if rt is not None else 0
    device = rt.device if rt is not None else resolve_device(t["device"])
    out = sys.stderr if rank == 0 else open(os.devnull, "w")
    model, facts = _prepare(job, None, device, getattr(torch, t["dtype"]), out, rt)
    model.train()
    lr = float(t["lr"])
    # as loop._train builds it: one process, train.model.adamw (fused on CUDA); a layout, its runtime's
    opt = rt.adamw(model, lr) if rt is not None else adamw(model.parameters(), lr, str(device))
    begin = step_hooks(facts)  # CUDA graphs (train.compile_mode reduce-overhead): each step marked, as the loop does
    b, s = int(t["batch_size"]), int(t["seq_len"])
    batches = list(synthetic_batches(model.config.vocab_size, b, s, a.steps + a.profile_steps, t["seed"], device))
    losses: list[float] = []

    def step(ids):
        if begin is not None:
            begin(0)
        outp = model(input_ids=ids, labels=ids, use_cache=False) if rt is None else model(**rt.shard_batch(ids))
        outp.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(outp.loss.detach()) if rt is None else rt.global_loss(outp.loss))

    rates = []
    for ids in batches[:a.steps]:
        t0 = time.perf_counter()
        step(ids)
        rates.append(b * s / (time.perf_counter() - t0))
    summary = profile_steps(step, batches[a.steps:], a.out, name, rank)
    res = {"name": name, "rank": rank, "world": rt.world_size if rt is not None else 1,
           "layout": rt.to_dict() if rt is not None else None, "device": torch.cuda.get_device_name() if
           torch.cuda.is_available() else "cpu", "tokens_per_s": statistics.median(rates[1:]), "step_tokens_per_s": rates,
           "losses": losses, "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
           "plan": [(e.get("op"), e.get("kernel")) for e in facts["plan"]["entries"]] if facts.get("plan") else None,
           "profile": summary}
    with open(os.path.join(a.out, f"{name}.r{rank}.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    if rank == 0:
        p = summary
        print(f"{name}: {res['tokens_per_s']:.0f} tok/s | step {p['wall_ms']:.1f} ms, gpu busy {p['gpu_busy_ms']:.1f}, "
              f"idle {p['gpu_idle_ms']:.1f}, comm {p['comm_ms']:.1f} (exposed {p['comm_exposed_ms']:.1f}) | "
              f"{p['kernels_per_step']:.0f} kernels, launch calls {p['launch_calls_per_step']}, host syncs "
              f"{p['host_syncs_per_step']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
