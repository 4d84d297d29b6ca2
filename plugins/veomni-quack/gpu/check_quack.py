#!/usr/bin/env python
"""Check every kernel veomni-quack registers against a float64 reference on a CUDA GPU, and time it.

Shapes (the seed benchmark's): RMSNorm batch 4 x sequence 2048 x hidden 2560; cross-entropy
(logits) 8192 tokens x vocabulary 151936; fused linear cross-entropy 8192 tokens, hidden 2560,
vocabulary 151936. Forward and backward, bfloat16 by default (``--dtypes``). Each output and
gradient must satisfy the kernel's declared tolerance (``veomni_quack.specs``):
``|got - ref| <= atol * max(1, max|ref|) + rtol * |ref|`` elementwise. Small edge cases
follow (odd token counts, misaligned views, ignored labels).

Then (``--no-bench`` to skip) a benchmark against the core's eager kernels: median wall time of
``triton.testing.do_bench`` (50 ms warm-up, 300 ms of repeats) and the GPU kernel time of one call
from ``torch.profiler`` (mean of 20 calls), with the implied TB/s (row ops) or TFLOP/s (fused
linear cross-entropy) and the peak memory of the fused-linear call.

Every Quack module and adapter is imported first, separately, and any import error is printed
in full (``quack.linear_cross_entropy`` failed to import against nvidia-cutlass-dsl 4.8.1 once);
a kernel whose import fails is reported as such and its cases are skipped.

Usage (from the repository root; the script finds core/ and the plugin)::

    python plugins/veomni-quack/gpu/check_quack.py --json quack_check.json

Needs: a CUDA GPU sm 9.0+ (H100), torch, quack-kernels 0.6.5, nvidia-cutlass-dsl 4.8.1 (e.g.
``pip install --target DIR`` and PYTHONPATH=DIR), triton for do_bench (a CUDA-event timer is used
without it). ``--smoke`` runs tiny shapes on the CPU against the unit tests' stand-in Quack (tests
the script, not Quack). Exit status 1 if any case fails or errors.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve()
PLUGIN = HERE.parents[1]
REPO = HERE.parents[3]
for p in (REPO / "core" / "src", PLUGIN / "src"):
    if p.is_dir() and str(p) not in sys.path:
        sys.path.insert(0, str(p))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the results as JSON to this path")
    ap.add_argument("--dtypes", default="bfloat16", help="comma-separated (bfloat16,float16,float32)")
    ap.add_argument("--only", default="", help="comma-separated case-name prefixes (default: all)")
    ap.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on the CPU against tests/fakes' stand-in quack (checks this script only)")
    return ap.parse_args()


ARGS = parse_args()
if ARGS.smoke:
    sys.path.insert(0, str(PLUGIN / "tests" / "fakes"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEV = "cpu" if ARGS.smoke else "cuda"
SHAPES = {"rms": (4, 2048, 2560), "ce": (8192, 151936), "flce": (8192, 2560, 151936)}
if ARGS.smoke:
    SHAPES = {"rms": (2, 8, 64), "ce": (24, 300), "flce": (24, 32, 304)}
RESULTS: dict = {"cases": [], "imports": {}, "bench": []}


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------
# environment and imports
# ---------------------------------------------------------------------------------------


def environment() -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "smoke": ARGS.smoke}
    for dist in ("quack-kernels", "nvidia-cutlass-dsl", "apache-tvm-ffi", "triton", "veomni-ops", "veomni-quack"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            env[dist] = None
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
        env["cuda"] = torch.version.cuda
    return env


MODULES = {
    "quack.rmsnorm": None,
    "quack.cross_entropy": None,
    "quack.linear_cross_entropy": None,
    "veomni_quack.kernels.rms_norm": None,
    "veomni_quack.kernels.cross_entropy": None,
    "veomni_quack.kernels.linear_cross_entropy": None,
}


def probe_imports() -> None:
    if ARGS.smoke:
        import veomni_quack.kernels._common as common

        common.CHECKS.device_types = ("cuda", "cpu")
    for name in MODULES:
        t0 = time.perf_counter()
        try:
            MODULES[name] = importlib.import_module(name)
            RESULTS["imports"][name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 2)}
            log(f"import {name}: ok ({time.perf_counter() - t0:.1f} s)")
        except BaseException as e:  # noqa: BLE001 - report anything, keep going
            tb = traceback.format_exc()
            RESULTS["imports"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": tb}
            log(f"import {name}: FAILED\n{tb}")


def spec_for(op: str, variant: str):
    import veomni_quack.specs as specs

    return next(s for s in getattr(specs, op)() if s.variant == variant)


# ---------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------


def compare(got: torch.Tensor, ref: torch.Tensor, tol, chunk: int = 1 << 25) -> dict:
    """Elementwise check in float64, chunk by chunk (the CE gradient has 1.2e9 elements)."""
    if tuple(got.shape) != tuple(ref.shape):
        return {"ok": False, "why": f"shape {tuple(got.shape)} != {tuple(ref.shape)}"}
    g, r = got.detach().reshape(-1), ref.detach().reshape(-1)
    if g.numel() == 0:
        return {"ok": True, "numel": 0}
    ref_max = max(r[i:i + chunk].abs().max().item() for i in range(0, r.numel(), chunk))
    scale = max(1.0, ref_max)
    n_bad, max_err, worst, finite = 0, 0.0, 0.0, True
    for i in range(0, g.numel(), chunk):
        gc, rc = g[i:i + chunk].double(), r[i:i + chunk].double()
        finite = finite and bool(torch.isfinite(gc).all())
        err = (gc - rc).abs()
        bound = tol.atol * scale + tol.rtol * rc.abs()
        n_bad += int((err > bound).sum())
        # NaN/inf count as infinite error (Python's max() would silently drop a NaN).
        max_err = max(max_err, err.nan_to_num(nan=float("inf")).max().item())
        worst = max(worst, (err / bound).nan_to_num(nan=float("inf")).max().item())  # <= 1 passes
    return {"ok": finite and n_bad == 0, "max_abs_err": max_err, "ref_max_abs": ref_max,
            "worst_err_over_bound": worst, "n_bad": n_bad, "numel": g.numel(), "finite": finite,
            "tolerance": [tol.atol, tol.rtol]}


def expect_refusal(fn, exc: type, match: str):
    """A case that passes when the adapter refuses the input itself (before Quack is called)."""
    import re

    def case():
        try:
            fn()
        except exc as e:
            ok = re.search(match, str(e)) is not None
            return {"refused": {"ok": ok, "why": f"{type(e).__name__}: {e}"}}
        return {"refused": {"ok": False, "why": f"expected {exc.__name__} matching {match!r}, got no error"}}

    return case


def run_case(name: str, needs: str, fn) -> None:
    if ARGS.only and not any(name.startswith(p) for p in ARGS.only.split(",")):
        return
    entry: dict = {"case": name}
    if MODULES.get(needs) is None:
        entry.update(ok=False, skipped=f"{needs} did not import: {RESULTS['imports'][needs].get('error')}")
        log(f"[SKIP] {name}: {entry['skipped']}")
        RESULTS["cases"].append(entry)
        return
    t0 = time.perf_counter()
    try:
        checks = fn()
        entry["checks"] = checks
        entry["ok"] = all(c.get("ok") for c in checks.values())
    except BaseException as e:  # noqa: BLE001
        entry.update(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    entry["seconds"] = round(time.perf_counter() - t0, 2)
    status = "PASS" if entry["ok"] else "FAIL"
    log(f"[{status}] {name} ({entry['seconds']} s)")
    for k, c in entry.get("checks", {}).items():
        log(f"    {k}: ok={c.get('ok')} max_err={c.get('max_abs_err', 0):.3g} "
            f"worst/bound={c.get('worst_err_over_bound', 0):.3g} n_bad={c.get('n_bad', 0)}"
            + ("" if c.get("finite", True) else " NOT FINITE")
            + (f" {c['why']}" if "why" in c else ""))
    if "error" in entry:
        log(entry["traceback"])
    RESULTS["cases"].append(entry)
    if DEV == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------


def labels_for(n: int, vocab: int, ignore_index: int = -100) -> torch.Tensor:
    y = torch.randint(0, vocab, (n,), device=DEV)
    y[torch.rand(n, device=DEV) < 0.1] = ignore_index
    return y


def rms_case(variant: str, dtype: torch.dtype, shape=None, view: bool = False):
    def case():
        mod = MODULES["veomni_quack.kernels.rms_norm"]
        kernel = mod.rms_norm_standard if variant == "standard" else mod.rms_norm_offset
        tol = spec_for("rms_norm", variant).tolerance(str(dtype).removeprefix("torch."))
        b, s, h = shape or SHAPES["rms"]
        if view:  # a column slice at an odd offset: the adapter must copy it
            x0 = (torch.randn(b, s, h + 8, device=DEV) * 2).to(dtype)[..., 3:h + 3]
        else:
            x0 = (torch.randn(b, s, h, device=DEV) * 2).to(dtype)
        w0 = (torch.randn(h, device=DEV) * 0.1 + (1.0 if variant == "standard" else 0.0)).to(dtype)
        cot = torch.randn(b, s, h, device=DEV, dtype=dtype)
        x, w = x0.detach().requires_grad_(), w0.detach().requires_grad_()
        out = kernel(x, w, 1e-6)
        gx, gw = torch.autograd.grad(out, (x, w), cot)
        xr, wr = x0.double().requires_grad_(), w0.double().requires_grad_()
        xhat = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6)
        ref = xhat * wr if variant == "standard" else xhat * (1.0 + wr)
        rx, rw = torch.autograd.grad(ref, (xr, wr), cot.double())
        return {"out": compare(out, ref, tol), "dx": compare(gx, rx, tol), "dw": compare(gw, rw, tol),
                "out_dtype": {"ok": out.dtype == dtype}}

    return case


def ce_case(dtype: torch.dtype, shape=None, transposed: bool = False, ignore_index: int = -100):
    def case():
        kernel = MODULES["veomni_quack.kernels.cross_entropy"].cross_entropy_sum
        tol = spec_for("cross_entropy", "logits").tolerance(str(dtype).removeprefix("torch."))
        n, v = shape or SHAPES["ce"]
        if transposed:
            z0 = (torch.randn(v, n, device=DEV) * 3).to(dtype).t()
        else:
            z0 = (torch.randn(n, v, device=DEV) * 3).to(dtype)
        y = labels_for(n, v, ignore_index)
        z = z0.detach().requires_grad_()
        loss = kernel(z, y, ignore_index=ignore_index)
        (g,) = torch.autograd.grad(loss, z, torch.tensor(0.5, device=DEV))
        del z
        # float64 reference chunk by chunk (the full float64 logits would be 10 GB)
        total = torch.zeros((), dtype=torch.float64, device=DEV)
        grad_checks = []
        for s in range(0, n, 1024):
            zc = z0[s:s + 1024].double().requires_grad_()
            lc = F.cross_entropy(zc, y[s:s + 1024], ignore_index=ignore_index, reduction="sum")
            (gc,) = torch.autograd.grad(lc, zc, torch.tensor(0.5, dtype=torch.float64, device=DEV))
            total += lc.detach()
            grad_checks.append(compare(g[s:s + 1024], gc, tol))
            del zc, gc
        bad = [c for c in grad_checks if not c["ok"]]
        dz = {"ok": not bad, "n_bad": sum(c.get("n_bad", 0) for c in grad_checks),
              "max_abs_err": max(c.get("max_abs_err", 0) for c in grad_checks),
              "worst_err_over_bound": max(c.get("worst_err_over_bound", 0) for c in grad_checks),
              "finite": all(c.get("finite", True) for c in grad_checks)}
        return {"loss": compare(loss, total, tol), "dlogits": dz, "loss_dtype": {"ok": loss.dtype == torch.float32}}

    return case


def flce_case(dtype: torch.dtype, shape=None, misaligned: bool = False, all_ignored: bool = False):
    def case():
        kernel = MODULES["veomni_quack.kernels.linear_cross_entropy"].fused_linear_cross_entropy_sum
        tol = spec_for("cross_entropy", "fused_linear").tolerance(str(dtype).removeprefix("torch."))
        n, h, v = shape or SHAPES["flce"]
        if misaligned:
            h0 = (torch.randn(n * h + 8, device=DEV) * 0.5).to(dtype)[3:3 + n * h].view(n, h)
        else:
            h0 = (torch.randn(n, h, device=DEV) * 0.5).to(dtype)
        w0 = (torch.randn(v, h, device=DEV) * 0.05).to(dtype)
        y = torch.full((n,), -100, device=DEV) if all_ignored else labels_for(n, v)
        checks: dict = {}
        lce = MODULES["quack.linear_cross_entropy"]
        if DEV == "cuda" and hasattr(lce, "scaled_exp_lce_supported"):
            checks["pipeline"] = {"ok": True, "scaled_exp": bool(lce.scaled_exp_lce_supported(
                h0, w0, MODULES["veomni_quack.kernels.linear_cross_entropy"].CHUNK_SIZE, "sum"))}
        hx, wx = h0.detach().requires_grad_(), w0.detach().requires_grad_()
        if DEV == "cuda":
            torch.cuda.reset_peak_memory_stats()
        loss = kernel(hx, wx, y)
        gh, gw = torch.autograd.grad(loss, (hx, wx), torch.tensor(0.5, device=DEV))
        if DEV == "cuda":
            checks["peak_gib"] = {"ok": True, "value": torch.cuda.max_memory_allocated() / 2**30}
        # float64 reference in token chunks, float64 weight-gradient accumulator
        w64 = w0.double()
        total = torch.zeros((), dtype=torch.float64, device=DEV)
        gw_ref = torch.zeros_like(w64)
        gh_ref = torch.empty(n, h, dtype=torch.float64, device=DEV)
        for s in range(0, n, 512):
            hc = h0[s:s + 512].double()
            zc = (hc @ w64.t()).requires_grad_()
            lc = F.cross_entropy(zc, y[s:s + 512], ignore_index=-100, reduction="sum")
            (dz,) = torch.autograd.grad(lc, zc, torch.tensor(0.5, dtype=torch.float64, device=DEV))
            total += lc.detach()
            gh_ref[s:s + 512] = dz @ w64
            gw_ref += dz.t() @ hc
            del zc, dz
        checks.update(loss=compare(loss, total, tol), dhidden=compare(gh, gh_ref, tol),
                      dweight=compare(gw, gw_ref, tol))
        if all_ignored:
            checks["zero"] = {"ok": loss.item() == 0.0 and not gh.any().item() and not gw.any().item()}
        return checks

    return case


# ---------------------------------------------------------------------------------------
# benchmark
# ---------------------------------------------------------------------------------------


def wall_ms(fn) -> float:
    if DEV == "cuda":
        try:
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median"))
        except ImportError:
            pass
        times = []
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)
    fn()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    return (time.perf_counter() - t0) / 3 * 1e3


def kernel_ms(fn, calls: int = 20) -> float | None:
    """Sum of the GPU kernel times of one call (torch.profiler, mean over ``calls``)."""
    if DEV != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total_us = 0.0
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", None)
        if t is None:
            t = getattr(ev, "self_cuda_time_total", 0.0)
        total_us += t
    return total_us / calls / 1e3


def bench_one(name: str, impl: str, fn, bytes_moved: float | None = None, flops: float | None = None) -> None:
    entry: dict = {"case": name, "impl": impl}
    try:
        if DEV == "cuda":
            torch.cuda.reset_peak_memory_stats()
        entry["wall_ms"] = wall_ms(fn)
        entry["kernel_ms"] = kernel_ms(fn)
        if DEV == "cuda":
            entry["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        k = entry["kernel_ms"] or entry["wall_ms"]
        if bytes_moved:
            entry["tb_per_s"] = bytes_moved / (k * 1e-3) / 1e12
        if flops:
            entry["tflop_per_s"] = flops / (k * 1e-3) / 1e12
        rate = (f" {entry['tb_per_s']:.2f} TB/s" if "tb_per_s" in entry else "") + (
            f" {entry['tflop_per_s']:.0f} TFLOP/s" if "tflop_per_s" in entry else "")
        kern = f"{entry['kernel_ms']:.3f} ms" if entry["kernel_ms"] is not None else "n/a"
        log(f"  {name:<28} {impl:<6} wall {entry['wall_ms']:8.3f} ms  kernel {kern}{rate}"
            + (f"  peak {entry['peak_gib']:.2f} GiB" if "peak_gib" in entry else ""))
    except BaseException as e:  # noqa: BLE001
        entry.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        log(f"  {name} {impl}: ERROR\n{entry['traceback']}")
    RESULTS["bench"].append(entry)
    if DEV == "cuda":
        torch.cuda.empty_cache()


def bench(dtype: torch.dtype) -> None:
    import veomni_ops.kernels.cross_entropy as core_ce
    import veomni_ops.kernels.rms_norm as core_rms

    log(f"\nbenchmark ({dtype}; wall = do_bench median, kernel = profiler sum per call)")
    elt = torch.finfo(dtype).bits // 8
    if MODULES["veomni_quack.kernels.rms_norm"] is not None:
        b, s, h = SHAPES["rms"]
        m = b * s
        x = torch.randn(b, s, h, device=DEV, dtype=dtype, requires_grad=True)
        w = torch.ones(h, device=DEV, dtype=dtype, requires_grad=True)
        cot = torch.randn_like(x)
        for impl, fn in (("quack", MODULES["veomni_quack.kernels.rms_norm"].rms_norm_standard),
                         ("eager", core_rms.rms_norm_standard)):
            with torch.no_grad():
                bench_one("rms_norm fwd", impl, lambda fn=fn: fn(x, w, 1e-6), bytes_moved=2 * m * h * elt)
            # fwd+bwd bytes: x, w read, y written; x, dy read, dx written (dw partials ignored)
            bench_one("rms_norm fwd+bwd", impl,
                      lambda fn=fn: torch.autograd.grad(fn(x, w, 1e-6), (x, w), cot), bytes_moved=5 * m * h * elt)
        del x, w, cot
    if MODULES["veomni_quack.kernels.cross_entropy"] is not None:
        n, v = SHAPES["ce"]
        z = torch.randn(n, v, device=DEV, dtype=dtype, requires_grad=True)
        y = labels_for(n, v)
        for impl, fn in (("quack", MODULES["veomni_quack.kernels.cross_entropy"].cross_entropy_sum),
                         ("eager", core_ce.cross_entropy_sum)):
            # logits read in forward and backward, gradient written
            bench_one("ce logits fwd+bwd", impl, lambda fn=fn: torch.autograd.grad(fn(z, y), z),
                      bytes_moved=3 * n * v * elt)
        del z
    if MODULES["veomni_quack.kernels.linear_cross_entropy"] is not None and dtype != torch.float32:
        n, h, v = SHAPES["flce"]
        hx = (torch.randn(n, h, device=DEV) * 0.5).to(dtype).requires_grad_()
        wx = (torch.randn(v, h, device=DEV) * 0.05).to(dtype).requires_grad_()
        y = labels_for(n, v)
        impls = [("quack", MODULES["veomni_quack.kernels.linear_cross_entropy"].fused_linear_cross_entropy_sum),
                 ("chunked", core_ce.chunked_fused_linear_cross_entropy_sum),
                 ("eager", core_ce.fused_linear_cross_entropy_sum)]
        for impl, fn in impls:
            bench_one("flce fwd+bwd", impl, lambda fn=fn: torch.autograd.grad(fn(hx, wx, y), (hx, wx)),
                      flops=6.0 * n * h * v)


# ---------------------------------------------------------------------------------------


def main() -> int:
    torch.manual_seed(ARGS.seed)
    RESULTS["environment"] = environment()
    log(json.dumps(RESULTS["environment"]))
    if not ARGS.smoke and not torch.cuda.is_available():
        log("no CUDA device: this script checks Quack on a GPU (use --smoke to check the script on the CPU)")
        return 1
    probe_imports()
    dtypes = [getattr(torch, d) for d in ARGS.dtypes.split(",") if d]
    rms_mod, ce_mod, lce_mod = ("veomni_quack.kernels.rms_norm", "veomni_quack.kernels.cross_entropy",
                                "veomni_quack.kernels.linear_cross_entropy")
    for dtype in dtypes:
        dn = str(dtype).removeprefix("torch.")
        for variant in ("standard", "offset"):
            run_case(f"rms_norm/{variant}/{dn}", rms_mod, rms_case(variant, dtype))
        run_case(f"cross_entropy/logits/{dn}", ce_mod, ce_case(dtype))
        if dtype != torch.float32:  # fused_linear declares bfloat16 and float16 only
            run_case(f"cross_entropy/fused_linear/{dn}", lce_mod, flce_case(dtype))
    # Edge cases, small, bf16: odd shapes, misaligned views, ignored labels.
    bf = torch.bfloat16
    run_case("edge/rms_norm/standard/odd_hidden_view", rms_mod, rms_case("standard", bf, (3, 17, 1000), view=True))
    # Odd H with 16-bit tensors: Quack 0.6.5 cannot compile it (CuTe "'cp_size' only supports (32, 64,
    # 128), but got 16" on the first H100 run); the adapter must refuse it before calling Quack.
    run_case("edge/rms_norm/offset/hidden_37_refused", rms_mod,
             expect_refusal(rms_case("offset", bf, (2, 9, 37)), ValueError, r"H = 37 is odd"))
    run_case("edge/rms_norm/offset/hidden_38", rms_mod, rms_case("offset", bf, (2, 9, 38)))  # 32-bit copies
    run_case("edge/rms_norm/standard/hidden_37_float32", rms_mod, rms_case("standard", torch.float32, (2, 9, 37)))
    # Odd V (16-bit): the adapter pads the vocabulary to 1008 with finite negative logits.
    run_case("edge/cross_entropy/logits/transposed_odd_vocab", ce_mod, ce_case(bf, (37, 1001), transposed=True))
    # Vocabularies whose cluster tiling leaves a warp with no column (NaN on the first H100 run at
    # 151936): padded by the adapter. 100352 is another; 128256 needs no padding.
    for v in (151936, 100352, 128256):
        run_case(f"edge/cross_entropy/logits/vocab_{v}", ce_mod, ce_case(bf, (64, v)))
    run_case("edge/cross_entropy/logits/ignore_index_0", ce_mod, ce_case(bf, (64, 512), ignore_index=0))
    run_case("edge/cross_entropy/fused_linear/21_tokens_misaligned", lce_mod,
             flce_case(bf, (21, 256, 4096), misaligned=True))
    run_case("edge/cross_entropy/fused_linear/all_ignored", lce_mod, flce_case(bf, (64, 256, 4096), all_ignored=True))
    run_case("edge/cross_entropy/fused_linear/5000_tokens_two_chunks", lce_mod, flce_case(bf, (40, 32, 304) if ARGS.smoke else (5000, 512, 32000)))
    if not ARGS.no_bench:
        for dtype in dtypes:
            bench(dtype)
    n_fail = sum(not c["ok"] for c in RESULTS["cases"])
    log(f"\n{len(RESULTS['cases']) - n_fail}/{len(RESULTS['cases'])} cases passed")
    if ARGS.json:
        ARGS.json.write_text(json.dumps(RESULTS, indent=1, default=str))
        log(f"wrote {ARGS.json}")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
