"""Host cost of veomni-triton's eager wrappers on a GPU (issue 12): lbl-48 and the `host` preset.

Run from the repo root:  source benchmarks/gpu/setup.sh; python3 benchmarks/gpu/host_cost.py
Writes everything to stdout and $OUT/host_gpu.json (OUT defaults to .devrun/host/out). --no-bench
skips the final bench command; --cpu-smoke runs every code path on the CPU (TRITON_INTERPRET=1).

Per workload and pass (fwd under no_grad; fwd+bwd = forward + torch.autograd.grad over the leaves):
  wall   median over rounds of (perf_counter around N calls, torch.cuda.synchronize at both ends) / N
  host   median time for one call to return to Python (no sync inside; the GPU may lag behind)
  kernel CUDA kernel time per call (torch.profiler, sum of the device kernels), and launches per call
  peak   torch.cuda.max_memory_allocated of one call (MiB)
for veomni-triton with the fast launch path on and off (VEOMNI_TRITON_FAST_LAUNCH), the wrappers as
they were before (commit b51bc90: before_*.py beside this script, when present, for lbl-48 and rms_norm, Triton's launch
path), and the eager torch reference beside it. Fails (a traceback) if the fast path's results differ
from Triton's path by a bit, or ours from the references beyond a loose tolerance. Then a cProfile of lbl-48 fwd+bwd with the autograd engine on the main
thread (so that the backward's Python shows up), and the bench command itself.
"""
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

# --cpu-smoke: a quick run of every code path on the CPU under TRITON_INTERPRET=1 (tiny shapes,
# no timing worth reading, no profiler, no bench): to catch mistakes in this script, nothing more
SMOKE = "--cpu-smoke" in sys.argv
assert SMOKE or torch.cuda.is_available(), "needs a CUDA GPU"
import triton  # noqa: E402
import veomni_triton  # noqa: E402
from veomni_ops.kernels import load_balancing as core_lbl  # noqa: E402
from veomni_triton.kernels import launch as _launch  # noqa: E402
from veomni_triton.kernels import load_balancing as LB  # noqa: E402
from veomni_triton.kernels import rms_norm as RN  # noqa: E402
from veomni_triton.kernels import rotary as RO  # noqa: E402
from veomni_triton.kernels import swiglu as SW  # noqa: E402

# the wrappers as they were before this work (commit b51bc90, custom ops renamed), for the "before" rows:
# copies placed beside this script (benchmarks/results/h100-2026-11-25-host/README.md says how); absent: no such rows
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import before_load_balancing as LB0  # noqa: E402
    import before_rms_norm as RN0  # noqa: E402
except ImportError:
    LB0 = RN0 = None

OUT = os.environ.get("OUT") or ".devrun/host/out"
os.makedirs(OUT, exist_ok=True)
dev = torch.device("cpu" if SMOKE else "cuda")
T0 = time.time()
sync = (lambda: None) if SMOKE else torch.cuda.synchronize
REPS = 1 if SMOKE else None
results: dict = {
    "env": {"torch": torch.__version__, "triton": triton.__version__, "gpu": "cpu-smoke" if SMOKE else torch.cuda.get_device_name(),
            "python": platform.python_version(), "veomni_triton": getattr(veomni_triton, "__version__", "?"),
            "fast_launch_default": _launch._FAST_LAUNCH, "cpu": platform.processor() or platform.machine()},
    "rows": [],
}
print(json.dumps(results["env"]))


def wall_ms(fn, n, rounds=7):
    n, rounds = (REPS, 1) if SMOKE else (n, rounds)
    per = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        per.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(per)


def host_ms(fn, n):
    n = REPS or n
    ts = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    sync()
    return statistics.median(ts)


def kernel_ms(fn, calls=10):
    if SMOKE:
        return 0.0, 0.0, []
    sync()
    # CPU activity too, as the bench's kernel_ms: kernels are then correlated with their launches
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        sync()
    evs = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    kern = [e for e in evs if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    total_us = sum(e.time_range.elapsed_us() for e in evs)
    return total_us / calls / 1e3, len(kern) / calls, sorted({e.name[:60] for e in kern})


def peak_mib(fn):
    if SMOKE:
        return 0.0
    sync()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    sync()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def measure(workload, impl, fwd, fwd_bwd, n):
    for f in (fwd, fwd_bwd):
        for _ in range(1 if SMOKE else 20):
            f()
    sync()
    for pass_, f in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
        k_ms, launches, names = kernel_ms(f)
        row = {"workload": workload, "impl": impl, "pass": pass_, "wall_ms": wall_ms(f, n), "host_ms": host_ms(f, n),
               "kernel_ms": k_ms, "launches": launches, "peak_mib": peak_mib(f), "kernels": names}
        results["rows"].append(row)
        print(f"{workload:10s} {impl:24s} {pass_:8s} wall {row['wall_ms']:7.3f} ms  host {row['host_ms']:7.3f} ms  "
              f"kernel {k_ms:7.4f} ms  launches {launches:4.1f}  peak {row['peak_mib']:8.1f} MiB", flush=True)


def triton_both(workload, fwd, fwd_bwd, n):
    for fast in (True, False):
        _launch._FAST_LAUNCH = fast
        measure(workload, f"veomni-triton fast={'on' if fast else 'off'}", fwd, fwd_bwd, n)
    _launch._FAST_LAUNCH = results["env"]["fast_launch_default"]


def same(a, b, what):
    a = a if isinstance(a, (list, tuple)) else [a]
    b = b if isinstance(b, (list, tuple)) else [b]
    for x, y in zip(a, b):
        if not torch.equal(x, y):
            raise AssertionError(f"{what}: fast launch path differs from Triton's (max diff {(x - y).abs().max()})")


def close(a, b, what, atol, rtol):
    a = a if isinstance(a, (list, tuple)) else [a]
    b = b if isinstance(b, (list, tuple)) else [b]
    for x, y in zip(a, b):
        torch.testing.assert_close(x.float(), y.float(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def check_fast_vs_triton(name, fn):
    """fn() -> tensors; run with the fast path off then on (twice: first launch, then cached)."""
    _launch._FAST_LAUNCH = False
    ref = [t.clone() for t in fn()]
    _launch._FAST_LAUNCH = True
    for _ in range(3):
        same([t.clone() for t in fn()], ref, name)
    _launch._FAST_LAUNCH = results["env"]["fast_launch_default"]
    return ref


# ---------------------------------------------------------------- lbl-48
L, T, E, K = (4, 16, 128, 8) if SMOKE else (48, 8192, 128, 8)
g = torch.Generator(device=dev).manual_seed(0)
layers = [torch.randn(T, E, device=dev, generator=g).requires_grad_() for _ in range(L)]
plain = [x.detach() for x in layers]


def lbl_fwd():
    with torch.no_grad():
        return LB.load_balancing_loss(plain, E, K)


def lbl_fb():
    return torch.autograd.grad(LB.load_balancing_loss(layers, E, K), layers)


def lbl_ref_fwd():
    with torch.no_grad():
        return core_lbl.load_balancing_loss(plain, E, K)


def lbl_ref_fb():
    return torch.autograd.grad(core_lbl.load_balancing_loss(layers, E, K), layers)


ours = check_fast_vs_triton("lbl-48", lambda: [LB.load_balancing_loss(layers, E, K), *lbl_fb()])
ref = [core_lbl.load_balancing_loss(layers, E, K), *lbl_ref_fb()]
close(ours[0], ref[0], "lbl-48 loss vs core eager", 1e-5, 1e-4)
close(ours[1:], ref[1:], "lbl-48 grads vs core eager", 1e-9, 1e-3)
print(f"lbl-48 correctness ok ({time.time() - T0:.0f} s)")


def lbl0_fwd():
    with torch.no_grad():
        return LB0.load_balancing_loss(plain, E, K)


def lbl0_fb():
    return torch.autograd.grad(LB0.load_balancing_loss(layers, E, K), layers)


def lbl_fwd_grad_on():  # forward of a call that will need a gradient (autograd node, saves)
    return LB.load_balancing_loss(layers, E, K)


if LB0 is not None:
    _launch._FAST_LAUNCH = False
    before = [LB0.load_balancing_loss(layers, E, K), *lbl0_fb()]
    _launch._FAST_LAUNCH = results["env"]["fast_launch_default"]
    close(ours, before, "lbl-48 vs before (b51bc90)", 0, 0)
triton_both("lbl-48", lbl_fwd, lbl_fb, 50)
if LB0 is not None:
    _launch._FAST_LAUNCH = False
    measure("lbl-48", "before b51bc90", lbl0_fwd, lbl0_fb, 50)
    _launch._FAST_LAUNCH = results["env"]["fast_launch_default"]
measure("lbl-48", "core eager torch", lbl_ref_fwd, lbl_ref_fb, 20)
for name, f in (("fwd, grad on (no bwd)", lbl_fwd_grad_on), ("fwd+bwd", lbl_fb)):
    h = host_ms(f, 50)
    results["rows"].append({"workload": "lbl-48", "impl": "veomni-triton", "pass": name, "host_ms": h})
    print(f"lbl-48 host return, {name}: {h:.3f} ms")

# ---------------------------------------------------------------- host preset (tiny shapes), bf16
bf = torch.bfloat16
x = torch.randn(16, 256, device=dev, dtype=bf, generator=g).requires_grad_()
w = (torch.randn(256, device=dev, dtype=bf, generator=g) * 0.1 + 1).requires_grad_()
dy = torch.randn(16, 256, device=dev, dtype=bf, generator=g)


def rms_eager(x, w, eps=1e-6):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


cases = {
    "rms_norm": (lambda a, b: RN.rms_norm_standard(a, b, 1e-6), rms_eager, (x, w), (dy,)),
}
q = torch.randn(1, 16, 4, 64, device=dev, dtype=bf, generator=g).transpose(1, 2).requires_grad_()
k = torch.randn(1, 16, 2, 64, device=dev, dtype=bf, generator=g).transpose(1, 2).requires_grad_()
ang = torch.randn(1, 16, 32, device=dev, generator=g)
cos = torch.cat([ang.cos(), ang.cos()], -1).to(bf)
sin = torch.cat([ang.sin(), ang.sin()], -1).to(bf)
dq = torch.randn(1, 4, 16, 64, device=dev, dtype=bf, generator=g)
dk = torch.randn(1, 2, 16, 64, device=dev, dtype=bf, generator=g)


def rot_half(t):
    a, b = t.chunk(2, -1)
    return torch.cat((-b, a), -1)


def rope_eager(q, k):
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + rot_half(q) * s, k * c + rot_half(k) * s


cases["rotary"] = (lambda a, b: RO.apply_rotary(a, b, cos, sin), rope_eager, (q, k), (dq, dk))
gt = torch.randn(16, 256, device=dev, dtype=bf, generator=g).requires_grad_()
up = torch.randn(16, 256, device=dev, dtype=bf, generator=g).requires_grad_()
cases["swiglu"] = (SW.silu_mul, lambda a, b: F.silu(a) * b, (gt, up), (dy,))

for name, (ours_fn, ref_fn, leaves, cots) in cases.items():
    detached = tuple(t.detach() for t in leaves)

    def mk(fn, detached=detached, leaves=leaves, cots=cots):
        def fwd():
            with torch.no_grad():
                return fn(*detached)

        def fb():
            out = fn(*leaves)
            return torch.autograd.grad(out, leaves, cots)

        return fwd, fb

    o_fwd, o_fb = mk(ours_fn)
    r_fwd, r_fb = mk(ref_fn)

    def both(ours_fn=ours_fn, leaves=leaves, cots=cots):
        out = ours_fn(*leaves)
        out = out if isinstance(out, tuple) else (out,)
        return [*out, *torch.autograd.grad(out, leaves, cots)]

    got = check_fast_vs_triton(name, both)
    want_out = ref_fn(*leaves)
    want_out = want_out if isinstance(want_out, tuple) else (want_out,)
    want = [*want_out, *torch.autograd.grad(want_out, leaves, cots)]
    close(got, want, f"{name} vs eager torch", 0.1, 0.05)
    triton_both(name, o_fwd, o_fb, 200)
    if name == "rms_norm" and RN0 is not None:
        b_fwd, b_fb = mk(lambda a, b: RN0.rms_norm_standard(a, b, 1e-6))
        _launch._FAST_LAUNCH = False
        measure(name, "before b51bc90", b_fwd, b_fb, 200)
        _launch._FAST_LAUNCH = results["env"]["fast_launch_default"]
    measure(name, "eager torch", r_fwd, r_fb, 200)

# ---------------------------------------------------------------- where lbl-48's host time goes
torch.autograd.set_multithreading_enabled(False)  # backward on this thread: cProfile sees it
for _ in range(5):
    lbl_fb()
sync()
pr = cProfile.Profile()
pr.enable()
for _ in range(2 if SMOKE else 50):
    lbl_fb()
pr.disable()
sync()
torch.autograd.set_multithreading_enabled(True)
buf = io.StringIO()
pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(25)
print("cProfile, 50 calls of lbl-48 fwd+bwd (fast launch on, engine on the main thread):")
print(buf.getvalue())
results["cprofile_lbl48"] = buf.getvalue()

print("\nsummary: wall ms / host-return ms / kernel ms per call (launches)")
for row in results["rows"]:
    if "wall_ms" in row:
        print(f"  {row['workload']:9s} {row['pass']:8s} {row['impl']:24s} {row['wall_ms']:8.3f} / {row['host_ms']:8.3f} / "
              f"{row['kernel_ms']:7.4f} ({row['launches']:.0f})")
with open(os.path.join(OUT, "host_gpu.json"), "w") as f:
    json.dump(results, f, indent=1)
print(f"measurements done ({time.time() - T0:.0f} s)", flush=True)

# ---------------------------------------------------------------- the bench command itself
if "--no-bench" not in sys.argv and not SMOKE:
    bench_json = os.path.join(OUT, "bench-lbl-host.json")
    cmd = ["veomni-ops", "bench", "--preset", "lbl-48", "--preset", "host", "--backend", "veomni-triton",
           "--rep-ms", "200", "--warmup-ms", "50", "--quiet", "--json", bench_json]
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    print(r.stdout[-6000:])
    print(r.stderr[-3000:], file=sys.stderr)
    if r.returncode != 0:
        raise SystemExit(f"bench command failed with exit status {r.returncode}")
print(f"total {time.time() - T0:.0f} s")
