"""moe_experts 'quack' (veomni-quack) on a GPU: numerics, benchmark, each Quack GEMM alone.

Run from the repo root:  source benchmarks/gpu/setup.sh; python3 benchmarks/gpu/quack_moe.py [SECTION ...]
Writes everything to stdout and, as JSON, to $OUT/moe_gpu.json (after every section).

Sections (each in try/except: a failure prints its traceback and the next section runs):
  env          versions, device
  fingerprint  imports quack.epilogue.library / quack.linear_cross_entropy before and after the adapter's
               fingerprint_installed_dsl() (the DSL in /tmp/cutlass is outside site-packages)
  primitives   every Quack call the adapter makes, alone, small shape (an expert with no token, sentinel
               routes), against torch (float32 math); also the fallbacks GATE_UP_CONCAT=False,
               WGRAD_GATHER=False and the three WGRAD_GATE_UP modes. Read this first if anything fails.
  moe30b       the full kernel at moe-30b-a3b (T=8192, K=8, E=128, H=2048, I=768, bf16) vs float64 and triton
  bench        fwd / fwd+bwd median ms (do_bench, CUDA events) + wall + peak memory: quack, triton, grouped_mm
  gemms        each Quack GEMM of the kernel alone at moe-30b (+ torch._grouped_mm counterparts, glue ops)
  (the sections below run only while the 230 s budget lasts, or when named)
  small        the full kernel fwd+bwd, bf16, small shapes (sentinels -1/E, empty experts, K=1), vs float64
  wgrad_modes  the other WGRAD_GATE_UP modes for d gate_up_proj ("transpose", "in_place"): numerics + time
  fp16         the full kernel in float16, small shape, vs float64
  compile      torch.compile(fullgraph=True) (inductor) of the kernel: supports_compile=True is declared
  tuned        Quack's autotuner (TUNED=True): the moe-30b fwd+bwd time (skipped if < 60 s left of 230)
Smoke test on a CPU against the stand-in (what was run before handing it over):
  MOE_GPU_BIG=64,4,8,64,32 TRITON_INTERPRET=1 MOE_GPU_DEVICE=cpu PYTHONPATH=plugins/veomni-quack/tests/standins \
    OUT=/tmp/x .venv/bin/python benchmarks/gpu/quack_moe.py
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

T0 = time.time()
BUDGET_S = 230.0
OUT = os.environ.get("OUT", ".")
RESULTS: dict = {}
DEV = os.environ.get("MOE_GPU_DEVICE", "cuda")  # "cpu": a smoke test of this script against the stand-in


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def median_ms(f, warmup: int = 25, rep: int = 200) -> float:
    """Kernel time: triton.testing.do_bench's median (CUDA events, L2 flushed); on the CPU smoke test, wall."""
    if DEV == "cuda":
        from triton.testing import do_bench

        return do_bench(f, warmup=warmup, rep=rep, return_mode="median")
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        f()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[1]


def dump() -> None:
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "moe_gpu.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def section(name):
    def wrap(fn):
        def run():
            print(f"\n=== {name} (t = {time.time() - T0:.1f} s)", flush=True)
            try:
                RESULTS[name] = fn()
            except Exception as e:  # noqa: BLE001 - report and go on
                traceback.print_exc()
                sys.stdout.flush()
                RESULTS[name] = {"error": f"{type(e).__name__}: {e}"}
            dump()
        return run
    return wrap


def errs(actual: torch.Tensor, ref: torch.Tensor) -> dict:
    a, r = actual.detach().double(), ref.detach().double()
    d = (a - r).abs()
    scale = r.abs().max().item() or 1.0
    return {"max_abs": d.max().item() if d.numel() else 0.0, "max_rel": (d.max().item() / scale) if d.numel() else 0.0,
            "finite": bool(torch.isfinite(a).all())}


def fmt(e: dict) -> str:
    return f"max_abs {e['max_abs']:.3e}  max_rel(to max|ref|) {e['max_rel']:.3e}  finite {e['finite']}"


def routing(t, k, e, gen, sentinels=False, idle=()):
    """Uniform-random distinct experts per token, softmaxed weights (float32 router, as in Qwen3-MoE)."""
    scores = torch.rand(t, e, generator=gen, device=DEV)
    if idle:
        scores[:, list(idle)] = -1.0
    idx = scores.topk(k, dim=-1).indices
    if sentinels:
        idx[1::7, 0] = -1
        idx[3::11, k - 1] = e
        idx[5] = -1  # a token with no expert
    w = torch.randn(t, k, generator=gen, device=DEV).softmax(-1)
    return idx, w


def make(t, k, e, h, i, dtype, seed=0, **kw):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    idx, w = routing(t, k, e, gen, **kw)
    x = torch.randn(t, h, generator=gen, device=DEV).to(dtype)
    gu = (torch.randn(e, 2 * i, h, generator=gen, device=DEV) / math.sqrt(h)).to(dtype)
    dn = (torch.randn(e, h, i, generator=gen, device=DEV) / math.sqrt(i)).to(dtype)
    gout = torch.randn(t, h, generator=gen, device=DEV).to(dtype)
    return [x, idx, w.to(dtype), gu, dn], gout


def reference(x, idx, w, gate_up, down):
    """The contract in float64 (differentiable): per expert, rows gathered, index_add back."""
    x, w, gate_up, down = (t.double() for t in (x, w, gate_up, down))
    e_count = gate_up.shape[0]
    out = torch.zeros_like(x)
    flat = idx.reshape(-1)
    tok_all = torch.arange(idx.numel(), device=idx.device) // idx.shape[1]
    for e in range(e_count):
        sel = (flat == e).nonzero().squeeze(1)
        if sel.numel() == 0:
            continue
        tok = tok_all[sel]
        g, u = (x[tok] @ gate_up[e].T).chunk(2, dim=-1)
        y = (F.silu(g) * u) @ down[e].T
        out = out.index_add(0, tok, y * w.reshape(-1)[sel, None])
    return out


def fwd_bwd(fn, inputs, gout):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, [leaves[i] for i in (0, 2, 3, 4)], gout.to(out.dtype))
    return out.detach(), [g.detach() for g in grads]


GRAD_NAMES = ("hidden_states", "top_k_weights", "gate_up_proj", "down_proj")


def compare(fn, inputs, gout, ref=None, label="quack"):
    out, grads = fwd_bwd(fn, inputs, gout)
    if ref is None:
        ref = fwd_bwd(reference, [t.double() if t.is_floating_point() else t for t in inputs], gout.double())
    r_out, r_grads = ref
    res = {"out": errs(out, r_out)}
    print(f"  {label} out            {fmt(res['out'])}")
    for n, g, r in zip(GRAD_NAMES, grads, r_grads):
        res[f"d_{n}"] = errs(g, r)
        print(f"  {label} d {n:14s} {fmt(res[f'd_{n}'])}")
    return res, (out, grads), ref


def quack_moe():
    from veomni_quack.kernels import moe

    if DEV == "cpu":  # smoke test against the stand-in (tests/standins on PYTHONPATH)
        import veomni_quack.kernels._common as common

        common.CHECKS.device_types = ("cuda", "cpu")
    return moe


# --------------------------------------------------------------------------- sections
@section("env")
def env():
    import importlib.metadata as md

    info = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if DEV == "cuda" else DEV,
            "capability": torch.cuda.get_device_capability() if DEV == "cuda" else None}
    for d in ("quack-kernels", "nvidia-cutlass-dsl", "triton", "veomni-ops", "veomni-quack", "veomni-triton"):
        try:
            info[d] = md.version(d)
        except Exception as e:  # noqa: BLE001
            info[d] = f"? ({e})"
    print(json.dumps(info, indent=1))
    return info


@section("fingerprint")
def fingerprint():
    """Diagnosis of Quack's 'no fail-closed semantic key' error (README 'fused_linear'): the DSL under
    /tmp/cutlass is not under site-packages, so Quack fingerprints into it. 'before' runs in a fresh
    subprocess (no wrapper); 'after' in this process with the adapter's fingerprint_installed_dsl()."""
    import importlib
    import subprocess

    import cutlass

    res = {"cutlass_file": cutlass.__file__}
    for mod in ("quack.epilogue.library", "quack.linear_cross_entropy"):
        p = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True, text=True, timeout=300)
        res[f"before: import {mod}"] = "ok" if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1][:300]
    from veomni_quack.kernels.dsl_fingerprint import fingerprint_installed_dsl

    res["wrapper_installed"] = fingerprint_installed_dsl()
    for mod in ("quack.epilogue.library", "quack.linear_cross_entropy"):
        try:
            importlib.import_module(mod)
            res[f"after: import {mod}"] = "ok"
        except Exception as e:  # noqa: BLE001
            res[f"after: import {mod}"] = f"{type(e).__name__}: {str(e)[:300]}"
    for k, v in res.items():
        print(f"  {k}: {v}")
    return res


@section("primitives")
def primitives():
    """Each Quack call of the adapter alone, against the same product in torch (float32 math)."""
    moe = quack_moe()
    t, k, e, h, i = 64, 2, 6, 128, 64
    inputs, gout = make(t, k, e, h, i, torch.bfloat16, sentinels=True, idle=(4,))
    x, idx, w, gu, dn = inputs
    r = moe._Routes.sort(idx, e)
    tk = r.tk
    cu = r.cu.tolist()
    print(f"  cu_seqlens {cu}")
    tok = r.tok.long()
    res = {}

    def grouped(a_rows, b, rows_per_group):  # per group: a_rows[s:e] @ b[g]
        outp = torch.zeros(tk, b.shape[-1], device=DEV, dtype=torch.float32)
        for g_, (s, e_) in enumerate(zip(cu, cu[1:])):
            outp[s:e_] = a_rows[s:e_].float() @ b[g_].float()
        return outp

    nv = cu[-1]

    def variant(flag, value, fn):
        old = getattr(moe, flag)
        setattr(moe, flag, value)
        try:
            return fn()
        except Exception as ex:  # noqa: BLE001
            traceback.print_exc()
            return {"error": f"{type(ex).__name__}: {ex}"}
        finally:
            setattr(moe, flag, old)

    # 1. gate_up: gathered rows, concat [gate; up] weight read interleaved (and the fallback: an interleaved copy).
    want = grouped(x[tok], gu.mT, None)  # [TK, 2I] in [gate | up] order
    want_il = torch.stack([want[:, :i], want[:, i:]], dim=-1).reshape(tk, 2 * i)

    def check_gate_up(tag):
        p, a = moe.gate_up_gemm(x, gu, r)
        res[f"gate_up{tag}.preact"] = errs(p[:nv], want_il[:nv])
        res[f"gate_up{tag}.act"] = errs(a[:nv], (F.silu(want[:, :i]) * want[:, i:])[:nv])
        return p, a

    fallback = variant("GATE_UP_CONCAT", False, lambda: check_gate_up("[concat=False]"))
    if isinstance(fallback, dict):
        res["gate_up[concat=False]"] = fallback
    preact, act = check_gate_up("")
    # 2. down
    ybuf = moe.down_gemm(act, dn, r)
    res["down.y"] = errs(ybuf[:nv], grouped(act, dn.mT, None)[:nv])
    res["down.zero_row"] = bool((ybuf[tk] == 0).all())
    # 3. dgated with scale + reduce
    ws = moe.sorted_weights(w, r)
    dpre, act_w, dw = moe.dgated_gemm(gout, dn, preact, ws, r)
    acc = grouped(gout[tok], dn, None)  # [TK, I] unscaled dout
    g_, u_ = preact.float()[:, ::2], preact.float()[:, 1::2]
    sig = torch.sigmoid(g_)
    dout = acc * ws[:, None]
    dg = dout * u_ * sig * (1 + g_ * (1 - sig))
    du = dout * g_ * sig
    res["dgated.dpreact"] = errs(dpre[:nv], torch.stack([dg, du], -1).reshape(tk, 2 * i)[:nv])
    res["dgated.act_w"] = errs(act_w[:nv], (g_ * sig * u_ * ws[:, None])[:nv])
    res["dgated.dw"] = errs(dw[:nv], ((g_ * sig * u_) * acc).sum(-1)[:nv])
    # 4. wgrad down (varlen-K; expert 4 has no token -> zeros)
    gd = moe.wgrad_down_gemm(gout, act_w, r)
    want = torch.stack([gout[tok[s:e_]].float().T @ act_w[s:e_].float() for s, e_ in zip(cu, cu[1:])])
    res["wgrad_down"] = errs(gd, want)
    res["wgrad_down.empty_expert_zero"] = bool((gd[4] == 0).all())
    res["wgrad_down[gather=False]"] = variant("WGRAD_GATHER", False,
                                              lambda: errs(moe.wgrad_down_gemm(gout, act_w, r), want))
    # 5. wgrad gate_up (both variants)
    dpc = moe._deinterleave(dpre)
    want = torch.stack([dpc[s:e_].float().T @ x[tok[s:e_]].float() for s, e_ in zip(cu, cu[1:])])  # [E, 2I, H]
    for mode in ("sorted", "transpose", "in_place"):
        res[f"wgrad_gate_up[{mode}]"] = variant("WGRAD_GATE_UP", mode,
                                                lambda: errs(moe.wgrad_gate_up_gemm(x, dpre, r, gu), want))
        res[f"wgrad_gate_up[{mode}].empty_expert_zero"] = variant(
            "WGRAD_GATE_UP", mode, lambda: bool((moe.wgrad_gate_up_gemm(x, dpre, r, gu)[4] == 0).all()))
    # 6. dx per route
    dxbuf = moe.dx_gemm(dpc, gu, r)
    res["dx"] = errs(dxbuf[:nv], grouped(dpc, gu, None)[:nv])
    res["dx.zero_row"] = bool((dxbuf[tk] == 0).all())
    for kk, v in res.items():
        print(f"  {kk:32s} {fmt(v) if isinstance(v, dict) and 'max_abs' in v else v}")
    return res


@section("small")
def small():
    moe = quack_moe()
    res = {}
    for name, (t, k, e, h, i, kw) in {
        "t64-k2-e6-sentinels-idle": (64, 2, 6, 128, 64, {"sentinels": True, "idle": (4,)}),
        "t333-k1-e8": (333, 1, 8, 256, 128, {}),
        "t257-k4-e16-sentinels": (257, 4, 16, 512, 384, {"sentinels": True}),
    }.items():
        print(f" {name}")
        inputs, gout = make(t, k, e, h, i, torch.bfloat16, **kw)
        res[name] = compare(moe.moe_experts, inputs, gout)[0]
    return res


BIG = dict(t=8192, k=8, e=128, h=2048, i=768)  # moe-30b-a3b; MOE_GPU_BIG="t,k,e,h,i" overrides (smoke tests)
if os.environ.get("MOE_GPU_BIG"):
    BIG = dict(zip("tkehi", map(int, os.environ["MOE_GPU_BIG"].split(","))))
_BIG_CACHE: dict = {}


def big_inputs():
    if "inputs" not in _BIG_CACHE:
        _BIG_CACHE["inputs"] = make(BIG["t"], BIG["k"], BIG["e"], BIG["h"], BIG["i"], torch.bfloat16, seed=1)
    return _BIG_CACHE["inputs"]


@section("moe30b")
def moe30b():
    moe = quack_moe()
    inputs, gout = big_inputs()
    res = {}
    print(" quack vs float64")
    res["quack_vs_f64"], quack_out, ref = compare(moe.moe_experts, inputs, gout)
    try:
        from veomni_triton.kernels.moe import moe_experts as triton_moe

        print(" triton vs float64")
        res["triton_vs_f64"], triton_out, _ = compare(triton_moe, inputs, gout, ref=ref, label="triton")
        print(" quack vs triton")
        res["quack_vs_triton"], _, _ = compare(moe.moe_experts, inputs, gout, ref=triton_out, label="quack~triton")
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        res["triton"] = {"error": f"{type(e).__name__}: {e}"}
    del ref
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return res


def bench_one(fn, inputs, gout, label):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    grad_of = [leaves[i] for i in (0, 2, 3, 4)]

    def fwd():
        with torch.no_grad():
            return fn(*leaves)

    def fwd_bwd_():
        out = fn(*leaves)
        return torch.autograd.grad(out, grad_of, gout)

    res = {}
    for name, f in (("fwd", fwd), ("fwd_bwd", fwd_bwd_)):
        for _ in range(3):
            f()
        sync()
        res[f"{name}_ms"] = median_ms(f)
        n = 20 if DEV == "cuda" else 2
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        sync()
        res[f"{name}_wall_ms"] = (time.perf_counter() - t0) / n * 1e3
        res[f"{name}_peak_extra_gib"] = float("nan")
        if DEV == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            f()
            torch.cuda.synchronize()
            res[f"{name}_peak_extra_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    tk = BIG["t"] * BIG["k"]
    flop = 6 * tk * BIG["h"] * BIG["i"]
    res["fwd_tflops"] = flop / res["fwd_ms"] / 1e9
    res["fwd_bwd_tflops"] = 3 * flop / res["fwd_bwd_ms"] / 1e9
    print(f"  {label:12s} fwd {res['fwd_ms']:.3f} ms ({res['fwd_tflops']:.0f} TFLOP/s, wall {res['fwd_wall_ms']:.3f})"
          f"  fwd+bwd {res['fwd_bwd_ms']:.3f} ms ({res['fwd_bwd_tflops']:.0f} TFLOP/s, wall "
          f"{res['fwd_bwd_wall_ms']:.3f})  peak extra fwd {res['fwd_peak_extra_gib']:.2f} GiB, "
          f"fwd+bwd {res['fwd_bwd_peak_extra_gib']:.2f} GiB")
    return res


@section("bench")
def bench():
    moe = quack_moe()
    inputs, gout = big_inputs()
    res = {}
    kernels = {"quack": lambda: moe.moe_experts}

    def triton_fn():
        from veomni_triton.kernels.moe import moe_experts

        return moe_experts

    def grouped_fn():
        from veomni_ops.kernels.moe import moe_experts_grouped_mm

        return moe_experts_grouped_mm

    kernels["triton"] = triton_fn
    kernels["grouped_mm"] = grouped_fn
    for label, get in kernels.items():
        try:
            res[label] = bench_one(get(), inputs, gout, label)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res[label] = {"error": f"{type(e).__name__}: {e}"}
    return res


@section("gemms")
def gemms():
    """Each Quack GEMM of the kernel alone at moe-30b (do_bench median), torch._grouped_mm beside it."""
    moe = quack_moe()
    (x, idx, w, gu, dn), gout = big_inputs()
    r = moe._Routes.sort(idx, gu.shape[0])
    tk, h, i = r.tk, BIG["h"], BIG["i"]
    preact, act = moe.gate_up_gemm(x, gu, r)
    ws = moe.sorted_weights(w, r)
    dpre, act_w, _ = moe.dgated_gemm(gout, dn, preact, ws, r)
    dpc = moe._deinterleave(dpre)
    offs = r.cu[1:].contiguous()
    x_sorted = x[r.tok.long()]
    gu_t, dn_t = gu.transpose(1, 2), dn.transpose(1, 2)
    grad_sorted = gout[r.tok.long()]
    flop_hi = 2 * tk * h * i  # one [TK, H] x [H, I] product
    steps = {
        "routing (sort, searchsorted, indices)": (lambda: moe._Routes.sort(idx, gu.shape[0]), 0),
        "fwd gate_up  gemm_gated(gather, swiglu)": (lambda: moe.gate_up_gemm(x, gu, r), 2 * flop_hi),
        "fwd down     gemm": (lambda: moe.down_gemm(act, dn, r), flop_hi),
        "fwd combine  (gather + bmm)": (
            lambda: torch.bmm(w.unsqueeze(1), moe._token_major(torch.empty(tk + 1, h, device=DEV, dtype=x.dtype), r,
                                                               BIG["t"], BIG["k"])), 0),
        "bwd dgated   gemm_dgated(gather, scale, reduce)": (lambda: moe.dgated_gemm(gout, dn, preact, ws, r), flop_hi),
        "bwd wgrad down   gemm varlen_k(gather)": (lambda: moe.wgrad_down_gemm(gout, act_w, r), flop_hi),
        "bwd deinterleave dpreact": (lambda: moe._deinterleave(dpre), 0),
        "bwd wgrad gate_up [sorted] gather x + gemm varlen_k": (
            lambda: moe.wgrad_gate_up_gemm(x, dpre, r, gu, dpc), 2 * flop_hi),
        "bwd wgrad gate_up [sorted] gemm varlen_k only": (
            lambda: moe._gi.gemm(dpc.mT, x_sorted, cu_seqlens_k=r.cu, tuned=moe.TUNED), 2 * flop_hi),
        "bwd wgrad gate_up [transpose] gemm varlen_k(gather) only": (
            lambda: moe._gi.gemm(x.mT, dpc, cu_seqlens_k=r.cu, A_idx=r.tok, tuned=moe.TUNED), 2 * flop_hi),
        "bwd wgrad gate_up [transpose] its transposing copy": (
            lambda: torch.empty(gu.shape[0], h, 2 * i, device=DEV, dtype=x.dtype).transpose(1, 2).contiguous(), 0),
        "bwd wgrad gate_up [in_place] gemm varlen_k(gather, m-major concat out)": (
            lambda: moe._gi.gemm(x.mT, dpre, out=torch.empty_like(gu).mT, cu_seqlens_k=r.cu, A_idx=r.tok,
                                 concat_layout=("out",), tuned=moe.TUNED), 2 * flop_hi),
        "bwd dx       gemm": (lambda: moe.dx_gemm(dpc, gu, r), 2 * flop_hi),
        "bwd dx combine (gather + sum over K)": (
            lambda: moe._token_major(torch.empty(tk + 1, h, device=DEV, dtype=x.dtype), r, BIG["t"],
                                     BIG["k"]).sum(1), 0),
        "torch: gather x[tok]": (lambda: x[r.tok.long()], 0),
        "torch: gate_up _grouped_mm (pre-gathered x)": (
            lambda: torch._grouped_mm(x_sorted, gu_t, offs=offs), 2 * flop_hi),
        "torch: down _grouped_mm": (lambda: torch._grouped_mm(act, dn_t, offs=offs), flop_hi),
        "torch: dact _grouped_mm (pre-gathered grad)": (lambda: torch._grouped_mm(grad_sorted, dn, offs=offs), flop_hi),
        "torch: wgrad down _grouped_mm (2d x 2d)": (
            lambda: torch._grouped_mm(grad_sorted.T, act_w, offs=offs), flop_hi),
        "torch: wgrad gate_up _grouped_mm (2d x 2d)": (lambda: torch._grouped_mm(dpc.T, x_sorted, offs=offs), 2 * flop_hi),
        "torch: dx _grouped_mm": (lambda: torch._grouped_mm(dpc, gu, offs=offs), 2 * flop_hi),
    }
    res = {}
    for name, (f, flop) in steps.items():
        try:
            f()
            sync()
            ms = median_ms(f, warmup=10, rep=100)
            res[name] = {"ms": ms, "tflops": flop / ms / 1e9 if flop else None}
            print(f"  {name:60s} {ms:7.3f} ms" + (f"  {flop / ms / 1e9:5.0f} TFLOP/s" if flop else ""))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res[name] = {"error": f"{type(e).__name__}: {e}"}
    return res


@section("wgrad_modes")
def wgrad_modes():
    """The other WGRAD_GATE_UP modes (d gate_up_proj): small numerics and moe-30b fwd+bwd."""
    moe = quack_moe()
    res = {}
    default = moe.WGRAD_GATE_UP
    for mode in ("transpose", "in_place"):
        moe.WGRAD_GATE_UP = mode
        try:
            inputs, gout = make(257, 4, 16, 512, 384, torch.bfloat16, sentinels=True, idle=(3,))
            res[f"{mode}.small"] = compare(moe.moe_experts, inputs, gout, label=mode)[0]
            inputs, gout = big_inputs()
            res[f"{mode}.bench"] = bench_one(moe.moe_experts, inputs, gout, f"quack {mode}")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res[mode] = {"error": f"{type(e).__name__}: {e}"}
        finally:
            moe.WGRAD_GATE_UP = default
    return res


@section("fp16")
def fp16():
    moe = quack_moe()
    inputs, gout = make(257, 4, 16, 512, 384, torch.float16, sentinels=True, idle=(3,))
    return compare(moe.moe_experts, inputs, gout, label="fp16")[0]


@section("compile")
def compile_():
    moe = quack_moe()
    inputs, gout = make(257, 4, 16, 512, 384, torch.bfloat16, sentinels=True)
    compiled = torch.compile(moe.moe_experts, fullgraph=True)
    return compare(compiled, inputs, gout, label="compiled")[0]


@section("tuned")
def tuned():
    left = BUDGET_S - (time.time() - T0)
    if left < 60:
        print(f"  skipped: {left:.0f} s left of the {BUDGET_S:.0f} s budget")
        return {"skipped": f"{left:.0f} s left"}
    moe = quack_moe()
    moe.TUNED = True
    try:
        inputs, gout = big_inputs()
        t0 = time.time()
        fwd_bwd(moe.moe_experts, inputs, gout)
        sync()
        first = time.time() - t0
        print(f"  first call with autotuning: {first:.1f} s")
        res = bench_one(moe.moe_experts, inputs, gout, "quack tuned")
        res["first_call_s"] = first
        return res
    finally:
        moe.TUNED = False


SECTIONS = {"env": env, "fingerprint": fingerprint, "primitives": primitives, "moe30b": moe30b, "bench": bench, "gemms": gemms, "small": small,
            "wgrad_modes": wgrad_modes, "fp16": fp16, "compile": compile_, "tuned": tuned}
#: Run by default only while the time budget lasts (name them on the command line to force them).
OPTIONAL = ("small", "wgrad_modes", "fp16", "compile", "tuned")

if __name__ == "__main__":
    # Optional arguments: the sections to run (default: all, in this order, the optional ones while time is left).
    named = sys.argv[1:]
    for name in named or list(SECTIONS):
        if not named and name in OPTIONAL and time.time() - T0 > BUDGET_S:
            print(f"\n=== {name}: skipped, past the {BUDGET_S:.0f} s budget (run: python3 {sys.argv[0]} {name})")
            RESULTS[name] = {"skipped": "time budget"}
            dump()
            continue
        SECTIONS[name]()
    print(f"\ndone in {time.time() - T0:.1f} s; JSON: {os.path.join(OUT, 'moe_gpu.json')}")
    failed = [k for k, v in RESULTS.items() if isinstance(v, dict) and "error" in v]
    if failed:
        print(f"FAILED sections: {failed}")
        sys.exit(1)
