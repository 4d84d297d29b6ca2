"""MoE experts at the moe-30b-a3b shape (H100 runs: benchmarks/results/h100-2026-11-25-moe/README.md): per-kernel times of veomni-triton's kernels, a config sweep per
kernel, the same GEMMs through torch._grouped_mm (CUTLASS) on pre-sorted rows, and the kernel lists of
the core grouped_mm path vs a mask-free plain path. Writes $OUT/moe_prof.json."""

import json
import math
import os
import time
import traceback

import torch
import triton
import veomni_triton.kernels.moe as M
from triton.testing import do_bench
from veomni_ops.kernels.moe import moe_experts_grouped_mm
from veomni_triton.kernels.moe import GemmConfig as C

OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
T, E, K, H, INTER = 8192, 128, 8, 2048, 768
TK = T * K
dt = torch.bfloat16
FL = {
    "gate_up": 2 * TK * H * 2 * INTER,
    "down": 2 * TK * INTER * H,
    "dh": 2 * TK * H * INTER,
    "dx": 2 * TK * 2 * INTER * H,
    "wgrad_down": 2 * TK * H * INTER,
    "wgrad_gate_up": 2 * TK * 2 * INTER * H,
}
res = {
    "shape": dict(T=T, E=E, K=K, H=H, INTER=INTER),
    "device": torch.cuda.get_device_name(),
    "torch": torch.__version__,
    "triton": triton.__version__,
}
QUICK = os.environ.get("QUICK") == "1"
TAG = os.environ.get("TAG", "")
SECTIONS = os.environ.get("SECTIONS", "whole,current,cutlass_grouped_mm,sweep,core_vs_plain").split(",")


def bench(fn, rep=60):
    return do_bench(fn, warmup=15, rep=rep, return_mode="median")


def kernel_list(fn, calls=5):
    """The CUDA kernels of one ``fn()`` (profiler, averaged over ``calls``): name, launches, ms; and their sum."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [
        (e.key[:90], e.count // calls, e.self_device_time_total / calls / 1000)
        for e in prof.key_averages()
        if e.self_device_time_total > 0
    ]
    rows.sort(key=lambda r: -r[2])
    return {"kernels": rows, "kernel_sum_ms": sum(r[2] for r in rows)}


def section(name):
    def deco(f):
        if name not in SECTIONS:
            return f
        t0 = time.time()
        try:
            f()
        except Exception:
            traceback.print_exc()
            res.setdefault("errors", {})[name] = traceback.format_exc()[-2000:]
        print(f"[{name}] {time.time() - t0:.1f}s", flush=True)
        json.dump(res, open(os.path.join(OUT, f"moe_prof{os.environ.get('SWEEP', '1')}{TAG}.json"), "w"), indent=1)
        return f

    return deco


g = torch.Generator(device=dev).manual_seed(0)
x = torch.randn(T, H, device=dev, dtype=dt, generator=g)
logits = torch.randn(T, E, device=dev, generator=g)
tw, ti = torch.topk(logits.softmax(-1), K, dim=-1)
tw = (tw / tw.sum(-1, keepdim=True)).to(dt)
wgu = (torch.randn(E, 2 * INTER, H, device=dev, generator=g) / math.sqrt(H)).to(dt)
wd = (torch.randn(E, H, INTER, device=dev, generator=g) / math.sqrt(INTER)).to(dt)
go = torch.randn(T, H, device=dev, dtype=dt, generator=g)
idx = ti.contiguous()
perm, offs = M._route(idx.reshape(-1), E)
tiles = M._Tiles(offs, TK, E)
gu = torch.empty(TK, 2 * INTER, device=dev, dtype=dt)
hw = torch.empty(TK, INTER, device=dev, dtype=dt)
y = torch.empty(TK, H, device=dev, dtype=dt)
dgu = torch.empty(TK, 2 * INTER, device=dev, dtype=dt)
dd_w = torch.empty_like(wd)
dgu_w = torch.empty_like(wgu)
dx_routes = torch.empty(TK, H, device=dev, dtype=dt)


def runner(kind, cfg):
    if kind == "gate_up":
        return lambda: M._gate_up(x, perm, tw, wgu, tiles, gu, hw, K, True, cfg)
    if kind == "down":
        return lambda: M._grouped_scatter(hw, perm, tiles, wd, y, H, INTER, wd.stride(2), wd.stride(1), cfg)
    if kind == "dh":
        num_n = triton.cdiv(INTER, cfg.block_n)
        dwp = torch.zeros(TK, num_n, device=dev, dtype=torch.float32)
        return lambda: M._dh(go, perm, tw, wd, tiles, gu, dgu, dwp, K, cfg)
    if kind == "dx":
        return lambda: M._grouped_scatter(
            dgu, perm, tiles, wgu, dx_routes, H, 2 * INTER, wgu.stride(1), wgu.stride(2), cfg
        )
    if kind == "wgrad_down":
        return lambda: M._wgrad(go, True, hw, False, perm, offs, dd_w, K, cfg)
    if kind == "wgrad_gate_up":
        return lambda: M._wgrad(dgu, False, x, True, perm, offs, dgu_w, K, cfg)
    raise KeyError(kind)


@section("whole")
def _():
    for p in (x, tw, wgu, wd):
        p.requires_grad_(True)

    def fb():
        out = M.moe_experts(x, idx, tw, wgu, wd)
        torch.autograd.grad(out, (x, tw, wgu, wd), go)

    def f():
        with torch.no_grad():
            M.moe_experts(x, idx, tw, wgu, wd)

    res["whole"] = {"fwd_ms": bench(f), "fwdbwd_ms": bench(fb, 200), **kernel_list(fb)}
    for p in (x, tw, wgu, wd):
        p.requires_grad_(False)
    print(json.dumps(res["whole"], indent=1))


@section("current")
def _():
    cur = {}
    for kind in FL:
        cfg = M._config(kind, dev, dt, TK / E)
        ms = bench(runner(kind, cfg))
        cur[kind] = {"cfg": list(cfg.__dict__.values()), "ms": ms, "tflops": FL[kind] / ms / 1e9}
        print(kind, cur[kind], flush=True)
    res["current"] = cur


@section("cutlass_grouped_mm")
def _():
    # the same GEMMs on pre-sorted, pre-gathered rows: torch._grouped_mm (CUTLASS), the per-GEMM target
    offs32 = offs[1:].to(torch.int32)
    xs = x[perm // K]
    torch._grouped_mm(xs, wgu.transpose(1, 2), offs=offs32)
    r = {}
    r["gate_up"] = bench(lambda: torch._grouped_mm(xs, wgu.transpose(1, 2), offs=offs32))
    hws = hw.clone()
    r["down"] = bench(lambda: torch._grouped_mm(hws, wd.transpose(1, 2), offs=offs32))
    gos = go[perm // K]
    r["dh"] = bench(lambda: torch._grouped_mm(gos, wd, offs=offs32))
    r["dx"] = bench(lambda: torch._grouped_mm(dgu, wgu, offs=offs32))
    # weight gradients: K-grouped (offsets along the reduction dim)
    try:
        r["wgrad_down"] = bench(lambda: torch._grouped_mm(gos.t(), hws, offs=offs32))
        r["wgrad_gate_up"] = bench(lambda: torch._grouped_mm(dgu.t(), xs, offs=offs32))
    except Exception as ex:
        r["wgrad_err"] = repr(ex)
    r["gather_x_ms"] = bench(lambda: x[perm // K])
    res["cutlass"] = {k: ({"ms": v, "tflops": FL[k] / v / 1e9} if k in FL else v) for k, v in r.items()}
    print(json.dumps(res["cutlass"], indent=1))


# the two weight-gradient GEMMs (and, in round 2, down and dx) were swept over the same tiles
_WGRAD1 = [
    C(128, 128, 64, 8, 3),
    C(128, 128, 64, 8, 4),
    C(128, 256, 64, 8, 3),
    C(256, 128, 64, 8, 3),
    C(128, 128, 32, 8, 5),
    C(128, 64, 64, 4, 4),
    C(64, 128, 64, 4, 4),
    C(128, 128, 128, 8, 3),
    C(128, 256, 32, 8, 4),
]
CANDS = {
    "gate_up": [
        C(128, 64, 64, 4, 4),
        C(128, 64, 64, 8, 4),
        C(128, 128, 64, 8, 3),
        C(128, 128, 64, 8, 4),
        C(64, 128, 64, 4, 4),
        C(128, 64, 128, 8, 3),
        C(256, 64, 64, 8, 3),
        C(128, 128, 32, 8, 5),
        C(64, 64, 64, 4, 5),
        C(128, 64, 64, 4, 5),
        C(64, 128, 128, 4, 3),
        C(128, 32, 64, 4, 5),
    ],
    "down": [
        C(128, 256, 64, 8, 3),
        C(128, 128, 64, 8, 4),
        C(128, 128, 64, 4, 4),
        C(128, 256, 64, 8, 4),
        C(64, 256, 64, 4, 4),
        C(256, 128, 64, 8, 3),
        C(128, 128, 128, 8, 3),
        C(128, 256, 32, 8, 5),
        C(64, 128, 64, 4, 5),
        C(128, 64, 64, 4, 5),
        C(256, 256, 64, 8, 2),
    ],
    "dh": [
        C(128, 128, 64, 8, 3),
        C(128, 128, 64, 8, 4),
        C(128, 64, 64, 4, 4),
        C(128, 256, 64, 8, 3),
        C(64, 128, 64, 4, 4),
        C(128, 128, 128, 8, 3),
        C(256, 128, 64, 8, 3),
        C(128, 64, 128, 4, 3),
        C(64, 256, 64, 4, 4),
    ],
    "dx": [
        C(128, 256, 64, 8, 3),
        C(128, 128, 64, 8, 4),
        C(128, 128, 64, 4, 4),
        C(128, 256, 64, 8, 4),
        C(64, 256, 64, 4, 4),
        C(256, 128, 64, 8, 3),
        C(128, 128, 128, 8, 3),
        C(128, 256, 32, 8, 5),
    ],
    "wgrad_down": _WGRAD1,
    "wgrad_gate_up": _WGRAD1,
}


_WGRAD2 = [
    C(128, 128, 32, 8, 5),
    C(128, 128, 32, 8, 6),
    C(128, 128, 32, 4, 5),
    C(128, 256, 32, 8, 4),
    C(256, 128, 32, 8, 4),
    C(128, 128, 16, 8, 8),
    C(64, 128, 32, 4, 6),
    C(128, 64, 32, 4, 6),
    C(256, 64, 32, 8, 5),
    C(64, 256, 32, 8, 5),
]
_SCATTER2 = [C(128, 256, 64, 8, 4), C(256, 128, 64, 8, 4), C(128, 256, 32, 8, 6), C(128, 128, 64, 8, 5)]
CANDS_ROUND2 = {
    "dh": [
        C(128, 128, 64, 8, 4),
        C(128, 64, 64, 8, 4),
        C(128, 64, 64, 8, 3),
        C(128, 64, 64, 8, 5),
        C(128, 64, 128, 8, 3),
        C(64, 64, 64, 4, 4),
        C(64, 128, 64, 8, 4),
        C(256, 64, 64, 8, 3),
        C(64, 64, 128, 4, 3),
        C(128, 32, 64, 4, 4),
        C(128, 64, 32, 8, 6),
        C(64, 128, 32, 4, 6),
    ],
    "wgrad_down": _WGRAD2,
    "wgrad_gate_up": _WGRAD2,
    "gate_up": [
        C(128, 128, 64, 8, 4),
        C(128, 128, 32, 8, 6),
        C(256, 64, 64, 8, 4),
        C(128, 64, 64, 8, 5),
        C(64, 128, 64, 4, 5),
        C(128, 128, 64, 8, 3),
    ],
    "down": _SCATTER2,
    "dx": _SCATTER2,
}


@section("sweep")
def _():
    sw = res.setdefault("sweep", {})
    for kind, cands in (CANDS_ROUND2 if os.environ.get("SWEEP") == "2" else CANDS).items():
        if QUICK:
            cands = cands[:2]
        rows = []
        for cfg in cands:
            try:
                ms = bench(runner(kind, cfg), 40)
                rows.append((list(cfg.__dict__.values()), ms, FL[kind] / ms / 1e9))
            except Exception as ex:
                rows.append((list(cfg.__dict__.values()), None, repr(ex)[:200]))
        rows.sort(key=lambda r: r[1] if r[1] else 1e9)
        sw[kind] = rows
        print(kind, rows[:3], flush=True)
        json.dump(res, open(os.path.join(OUT, f"moe_prof{os.environ.get('SWEEP', '1')}{TAG}.json"), "w"), indent=1)


@section("core_vs_plain")
def _():
    ps = [p.detach().clone().requires_grad_(True) for p in (x, tw, wgu, wd)]

    def plain(h, w, gup, dp):
        flat = idx.reshape(-1)
        sk, order = torch.sort(flat, stable=True)
        o = torch.searchsorted(sk, torch.arange(E, device=dev), right=True, out_int32=True)
        xs = h[order // K]
        a = torch._grouped_mm(xs, gup.transpose(1, 2), offs=o)
        g_, u_ = a.chunk(2, -1)
        yy = torch._grouped_mm(torch.nn.functional.silu(g_) * u_, dp.transpose(1, 2), offs=o)
        yy = yy * w.reshape(-1)[order, None]
        return torch.zeros_like(h).index_add_(0, order // K, yy)

    def core(h, w, gup, dp):
        return moe_experts_grouped_mm(h, idx, w, gup, dp)

    for name, fn in (("core_grouped_mm", core), ("plain", plain)):

        def fb(fn=fn):
            torch.autograd.grad(fn(*ps), ps, go)

        r = {"fwdbwd_ms": bench(fb, 200), **kernel_list(fb)}
        res[name] = r
        print(name, json.dumps(r, indent=1), flush=True)
