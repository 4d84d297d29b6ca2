"""Rotary on the GPU: veomni-liger's adapter beside Liger as its users call it (issue 12, "compare like
with like"), with veomni-triton and eager, at the bench's rotary presets.

    source benchmarks/gpu/setup.sh; OUT=/tmp/out python3 benchmarks/gpu/rotary_peers.py

1. ``veomni-ops bench --op rotary --preset seed --preset rope-qwen35 --preset host`` (run in-process,
   same code path): every rotary kernel plus the ``liger (peer)`` rows, fwd and fwd+bwd, wall ms
   (CUDA events, L2 flushed, median) and kernel ms (profiler device time, mean of 20 calls), peak
   memory. Written to $OUT/rotary.json and $OUT/rotary.md, the table printed.
2. Per-kernel breakdown at the seed shapes (full and partial): the device kernels one call launches
   (profiler, mean of 20 calls), so the adapter's copies and Liger's own ``_triton_rope`` are
   seen apart: adapter copy ms = adapter kernel ms - its ``_triton_rope`` ms.
3. What gradient layout a Qwen3 attention hands RoPE's backward: torch SDPA (the default
   ``attn_implementation``) on q/k/v laid out as the model's projections, a spy between RoPE and
   SDPA records whether dq/dk are [B, S, H, D] buffers viewed as [B, H, S, D] -- the layout the bench
   now gives every fwd+bwd row (the cotangent laid out as the output).

Fails loudly: a traceback if CUDA, liger-kernel, the peer rows or any measurement is missing.
``ROTARY_SMOKE=1`` runs the plumbing on the CPU at ``cpu-small`` (no GPU-only parts; not a result).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict

import torch

SMOKE = os.environ.get("ROTARY_SMOKE") == "1"
OUT = os.environ.get("OUT") or "/tmp/rotary-out"
PRESETS = ["cpu-small"] if SMOKE else ["seed", "rope-qwen35", "host"]
os.makedirs(OUT, exist_ok=True)


def log(*a):
    print(*a, flush=True)


def main() -> None:
    t0 = time.time()
    if not SMOKE and not torch.cuda.is_available():
        raise SystemExit("rotary_gpu.py: no CUDA device")
    from importlib.metadata import version

    import liger_kernel  # noqa: F401  -- the peer needs it; fail here, not with a silent skip
    from veomni_ops import bench as B

    log(f"torch {torch.__version__}, triton {version('triton')}, liger-kernel {version('liger-kernel')}, "
        f"veomni-ops {version('veomni-ops')}, device "
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}")
    summary: dict = {"presets": PRESETS}

    # 1. the bench, as `veomni-ops bench --op rotary --preset ... --json $OUT/rotary.json`
    command = "veomni-ops bench --op rotary " + " ".join(f"--preset {p}" for p in PRESETS) + \
        f" --json {OUT}/rotary.json"
    res = B.run_bench(presets=PRESETS, op="rotary", progress=False, command=command,
                      **({"warmup_ms": 2, "rep_ms": 5} if SMOKE else {}))
    jpath, md = B.write_results(res, os.path.join(OUT, "rotary.json"))
    log(B.render_text(res))
    log(f"wrote {jpath} and {md} ({time.time() - t0:.0f} s)")
    failed = [r for r in res["rows"] if r.get("error") and r.get("wall_ms") is None]
    if failed:
        raise SystemExit(f"{len(failed)} measurement(s) failed: " +
                         "; ".join(f"{r['preset']} {r['variant']} {r['kernel']} {r['pass']}: {r['error']}"
                                   for r in failed))
    if not SMOKE:
        for w in {(r["preset"], r["variant"]) for r in res["rows"]}:
            got = {(r["kernel"], r["peer"]) for r in res["rows"] if (r["preset"], r["variant"]) == w}
            missing = {("liger", True), ("liger", False), ("eager", False), ("triton", False)} - got
            if missing:
                raise SystemExit(f"{w}: rows missing: {sorted(missing)} (have {sorted(got)})")

    summary["adapter_vs_peer"] = _adapter_vs_peer(res)
    if SMOKE:
        _breakdown(torch.device("cpu"), "cpu-small")

    # 2. per-kernel breakdown at the seed shapes
    if not SMOKE:
        summary["breakdown"], summary["adapter_copies"] = _breakdown()
        _write(summary)

        # 3. the gradient layout a Qwen3 attention hands RoPE's backward
        try:
            summary["sdpa_grad_layout"] = _sdpa_grad_layout(torch.device("cuda"))
        except Exception as e:
            summary["sdpa_grad_layout"] = f"failed: {type(e).__name__}: {e}"
            _write(summary)
            raise
        log(f"\nSDPA hands RoPE's backward: {summary['sdpa_grad_layout']}")

    summary["seconds"] = round(time.time() - t0, 1)
    _write(summary)
    log(f"\nwrote {OUT}/rotary_summary.json; {summary['seconds']} s")


def _write(summary: dict) -> None:
    with open(os.path.join(OUT, "rotary_summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)


def _adapter_vs_peer(res: dict) -> list[dict]:
    """veomni-liger's row beside the liger (peer) row of each workload and pass."""
    pairs = []
    by = {(r["preset"], r["variant"], r["pass"], r["kernel"], r["peer"]): r for r in res["rows"]}
    for (preset, variant, pass_, kernel, peer), r in sorted(by.items()):
        if kernel != "liger" or peer:
            continue
        p = by.get((preset, variant, pass_, "liger", True))
        if p is None:
            continue
        row = {"preset": preset, "variant": variant, "pass": pass_}
        for key in ("wall_ms", "kernel_ms", "extra_gib"):
            row[f"adapter_{key}"], row[f"peer_{key}"] = r[key], p[key]
        pairs.append(row)
    log("\nveomni-liger adapter (copies q/k, dq/dk) vs Liger as its users call it (in place), from the bench:")
    log(f"{'preset':12} {'variant':8} {'pass':8} {'adapter wall':>12} {'peer wall':>10} {'adapter kernel':>14} "
        f"{'peer kernel':>11} {'adapter extra GiB':>17} {'peer extra GiB':>14}")
    for x in pairs:
        log(f"{x['preset']:12} {x['variant']:8} {x['pass']:8} {_f(x['adapter_wall_ms']):>12} "
            f"{_f(x['peer_wall_ms']):>10} {_f(x['adapter_kernel_ms']):>14} {_f(x['peer_kernel_ms']):>11} "
            f"{_f(x['adapter_extra_gib']):>17} {_f(x['peer_extra_gib']):>14}")
    return pairs


def _breakdown(device=None, preset: str = "seed") -> tuple[list[dict], list[dict]]:
    """The device kernels of one call of every rotary kernel and peer at the seed shapes; the adapter's
    device time split into Liger's _triton_rope and its copies."""
    from veomni_ops import bench as B
    from veomni_ops.bench import loop as L
    from veomni_ops.device import current_device
    from veomni_ops.discovery import discover
    from veomni_ops.testing.cases import harness

    reg = discover()
    dev_info = current_device()
    device = device or torch.device("cuda")
    breakdown = []
    for w in B.workloads([preset], "rotary"):
        inputs, diff = B.build_inputs(w, device)
        for c in L._kernels_for(reg, w, dev_info, None):
            if c.fn is None:
                continue
            closures = L._closures(c.fn, inputs, diff, harness("rotary"), device)
            for pass_, (fn, _) in closures.items():
                kernels = _kernel_list(fn, 20)
                name = f"{c.name} (peer)" if c.peer else c.name
                breakdown.append({"variant": w.variant, "kernel": name, "pass": pass_, "device_kernels": kernels,
                                  "total_ms": round(sum(v["ms"] for v in kernels), 5)})
                log(f"\n{preset} rotary/{w.variant} {name} {pass_}: {sum(v['ms'] for v in kernels):.4f} ms of "
                    f"device time per call")
                for v in kernels:
                    log(f"   {v['ms']:.4f} ms  x{v['per_call']:g}  {v['name'][:110]}")
        del inputs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    copies = []
    for b in breakdown:
        if b["kernel"] != "liger":
            continue
        rope = sum(v["ms"] for v in b["device_kernels"] if "rope" in v["name"].lower())
        copies.append({"variant": b["variant"], "pass": b["pass"], "adapter_ms": b["total_ms"],
                       "triton_rope_ms": round(rope, 5), "copies_ms": round(b["total_ms"] - rope, 5)})
    log("\nveomni-liger adapter: its device time = Liger's _triton_rope + its copies (seed shapes):")
    for x in copies:
        log(f"  {x['variant']:8} {x['pass']:8} adapter {x['adapter_ms']:.4f} ms = _triton_rope "
            f"{x['triton_rope_ms']:.4f} + copies {x['copies_ms']:.4f}")
    return breakdown, copies


def _f(x, spec=".4f"):
    return "-" if x is None else format(x, spec)


def _kernel_list(fn, calls: int) -> list[dict]:
    """The device kernels (and copies) of one call: name, ms per call, launches per call."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        sync()
    us: dict[str, float] = defaultdict(float)
    n: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if getattr(e, "device_type", None) == DeviceType.CUDA:
            us[e.name] += e.time_range.elapsed_us()
            n[e.name] += 1
    return sorted(({"name": k, "ms": round(v / calls / 1e3, 5), "per_call": n[k] / calls} for k, v in us.items()),
                  key=lambda d: -d["ms"])


def _sdpa_grad_layout(device, b=4, s=2048, hq=32, hk=8, d=128, dtype=torch.bfloat16) -> dict:
    """Qwen3's attention: q/k/v projections [B, S, H, D] viewed as [B, H, S, D], RoPE, then SDPA
    (GQA). A spy between RoPE's output and SDPA records the layout of the gradients SDPA returns."""
    import torch.nn.functional as F

    seen: dict = {}

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k):
            return q.view_as(q), k.view_as(k)

        @staticmethod
        def backward(ctx, dq, dk):
            seen["dq_bshd_backed"] = dq.transpose(1, 2).is_contiguous()
            seen["dk_bshd_backed"] = dk.transpose(1, 2).is_contiguous()
            seen["dq_stride"], seen["dk_stride"] = list(dq.stride()), list(dk.stride())
            return dq, dk

    g = torch.Generator(device=device).manual_seed(0)

    def proj(h):
        return torch.randn(b, s, h, d, generator=g, device=device, dtype=dtype).transpose(1, 2)

    q, k, v = proj(hq).requires_grad_(), proj(hk).requires_grad_(), proj(hk).requires_grad_()
    q2, k2 = Spy.apply(q, k)
    out = F.scaled_dot_product_attention(q2, k2, v, is_causal=True, enable_gqa=True)
    out.backward(torch.randn_like(out))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seen["output_bshd_backed"] = out.transpose(1, 2).is_contiguous()
    return seen


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception:
        import traceback

        traceback.print_exc()
        sys.exit(1)
