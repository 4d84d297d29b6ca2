"""Edge-input and tolerance checks on a CUDA GPU (items 5 and 6): run from the repo root."""
import json
import os
import subprocess
import sys
import time
import traceback

sys.path[:0] = ["core/src", "plugins/veomni-triton/src", "plugins/veomni-liger/src", ".devrun/ioedge"]
import torch  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}


def log(*a):
    print(*a, flush=True)


def section(name):
    def deco(fn):
        t0 = time.time()
        try:
            report[name] = fn()
        except Exception as e:  # keep going
            report[name] = {"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-1500:]}
            log(f"[{name}] ERROR {type(e).__name__}: {e}")
        log(f"[{name}] {time.time() - t0:.1f}s")
        return fn
    return deco


import triton  # noqa: E402

report["triton"] = triton.__version__
import veomni_triton.specs as tspecs  # noqa: E402
from veomni_ops.testing.runner import check_kernel  # noqa: E402

SEED = 20261121


def summarize(results):
    rows = []
    for r in results:
        grads32 = [c.ratio for c in r.comparisons if c.name.startswith("grad")]
        rows.append({"case": r.case, "dtype": r.dtype, "status": r.status, "worst": r.worst, "worst_in": r.worst_in,
                     "baseline": r.baseline, "max_grad_ratio": max(grads32) if grads32 else None,
                     "n_grads_over_1": sum(x > 1 for x in grads32), "message": r.message[:300], "notes": r.notes})
        log(f"  {r.case} {r.dtype}: {r.status} worst {r.worst:.3g} in {r.worst_in}"
            f" grads>1: {sum(x > 1 for x in grads32)}/{len(grads32)} {r.message[:200]}")
    return rows


@section("lbl_new_full")
def _():
    from veomni_triton.kernels.load_balancing import load_balancing_loss as lbl
    spec = next(iter(tspecs.load_balancing_loss()))
    return summarize(check_kernel(lbl, spec, device="cuda", size="full", seed=SEED))


@section("lbl_old_full")
def _():
    import lb_old
    spec = next(iter(tspecs.load_balancing_loss()))
    return summarize(check_kernel(lb_old.load_balancing_loss, spec, device="cuda", size="full", seed=SEED,
                                  dtypes=["float32"]))


@section("moe_triton_full")
def _():
    from veomni_triton.kernels.moe import moe_experts
    spec = next(iter(tspecs.moe_experts()))
    return summarize(check_kernel(moe_experts, spec, device="cuda", size="full", seed=SEED))


@section("rms_triton_mixed_full")
def _():
    from veomni_triton.kernels import rms_norm as R
    out = []
    for s in tspecs.rms_norm():
        fn = getattr(R, s.factory.split(":")[1])
        out += summarize(check_kernel(fn, s, device="cuda", size="full", seed=SEED,
                                      cases=["fp32-weight-512x4096"]))
    return out


@section("grouped_mm_full")
def _():
    from veomni_ops.backends import reference
    from veomni_ops.kernels.moe import moe_experts_grouped_mm
    spec = next(s for s in reference.moe_experts() if s.name == "grouped_mm")
    return summarize(check_kernel(moe_experts_grouped_mm, spec, device="cuda", size="full", seed=SEED))


def moe_inputs(dtype, t=256, h=512, i=256, e=16, k=4, sentinels=True):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(t, h, device="cuda", generator=g).to(dtype).requires_grad_()
    idx = torch.rand(t, e, device="cuda", generator=g).argsort(-1)[:, :k].contiguous()
    if sentinels:
        idx[::3, 1] = e
        idx[1::5, 0] = -1
    w = torch.rand(t, k, device="cuda", generator=g).to(dtype).requires_grad_()
    gu = (torch.randn(e, 2 * i, h, device="cuda", generator=g) / h**0.5).to(dtype).requires_grad_()
    dn = (torch.randn(e, h, i, device="cuda", generator=g) / i**0.5).to(dtype).requires_grad_()
    return x, idx, w, gu, dn


@section("no_sync")
def _():
    """Forward + backward under torch.cuda.set_sync_debug_mode('error'): any host sync raises."""
    from veomni_ops.kernels.cross_entropy import chunked_fused_linear_cross_entropy_sum, cross_entropy_sum
    from veomni_ops.kernels.moe import moe_experts_grouped_mm
    from veomni_triton.kernels.load_balancing import load_balancing_loss as lbl
    from veomni_triton.kernels.moe import moe_experts
    out = {}
    cases = {
        "triton_moe": lambda: moe_experts(*moe_inputs(torch.bfloat16)).float().sum(),
        "grouped_mm": lambda: moe_experts_grouped_mm(*moe_inputs(torch.bfloat16)).float().sum(),
        "triton_lbl": lambda: lbl([torch.randn(512, 64, device="cuda", requires_grad=True) for _ in range(2)], 64, 4,
                                  torch.ones(2, 256, device="cuda", dtype=torch.long)),
        "ce_eager": lambda: cross_entropy_sum(torch.randn(64, 1000, device="cuda", requires_grad=True),
                                              torch.randint(0, 1000, (64,), device="cuda")),
        "ce_chunked": lambda: chunked_fused_linear_cross_entropy_sum(
            torch.randn(64, 32, device="cuda", requires_grad=True), torch.randn(1000, 32, device="cuda", requires_grad=True),
            torch.randint(0, 1000, (64,), device="cuda")),
    }
    for name, fn in cases.items():
        fn().backward()  # warm-up (compiles, caches)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn().backward()
            out[name] = "no host sync"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        log(f"  {name}: {out[name]}")
    return out


@section("sentinels_vs_eager")
def _():
    from veomni_ops.kernels.moe import moe_experts_eager, moe_experts_grouped_mm
    from veomni_triton.kernels.moe import moe_experts
    out = {}
    kernels = {"triton": moe_experts, "grouped_mm": moe_experts_grouped_mm}
    try:
        import veomni_liger.kernels.moe as lm
        kernels["liger"] = lm.moe_experts
    except Exception as e:
        out["liger_import"] = f"{type(e).__name__}: {e}"
    x, idx, w, gu, dn = moe_inputs(torch.bfloat16)
    ref_leaves = [t.detach().double().requires_grad_() for t in (x, w, gu, dn)]
    ref = moe_experts_eager(ref_leaves[0], idx, *ref_leaves[1:])
    cot = torch.randn_like(ref)
    ref.backward(cot)
    sentinel = (idx == -1) | (idx == gu.shape[0])
    for name, fn in kernels.items():
        leaves = [t.detach().clone().requires_grad_() for t in (x, w, gu, dn)]
        y = fn(leaves[0], idx, *leaves[1:])
        y.backward(cot.to(y.dtype))
        errs = {"out": ((y.double() - ref).abs().max() / ref.abs().max()).item()}
        for nm, a, b in zip(("x", "w", "gu", "dn"), leaves, ref_leaves):
            errs["grad_" + nm] = ((a.grad.double() - b.grad).abs().max() / b.grad.abs().max()).item()
        errs["sentinel_w_grad_zero"] = bool((leaves[1].grad[sentinel] == 0).all())
        out[name] = errs
        log(f"  {name}: {errs}")
    return out


@section("value_checks_flag")
def _():
    from veomni_ops.kernels import checks
    from veomni_ops.kernels.cross_entropy import cross_entropy_sum
    from veomni_ops.kernels.moe import moe_experts_grouped_mm
    from veomni_triton.kernels.moe import moe_experts
    out = {}
    x, idx, w, gu, dn = moe_inputs(torch.bfloat16)
    idx[5, 2] = 99
    with checks.value_checks():
        for name, fn in (("triton", moe_experts), ("grouped_mm", moe_experts_grouped_mm)):
            try:
                fn(x, idx, w, gu, dn)
                out[name] = "no error"
            except ValueError as e:
                out[name] = f"ValueError: {e}"
        try:
            cross_entropy_sum(torch.randn(4, 10, device="cuda"), torch.tensor([1, 2, 10, -100], device="cuda"))
            out["ce_eager"] = "no error"
        except ValueError as e:
            out["ce_eager"] = f"ValueError: {e}"
    for k, v in out.items():
        log(f"  {k}: {v}")
    return out


CHILD = r"""
import sys, torch
sys.path[:0] = ["core/src", "plugins/veomni-triton/src"]
from veomni_triton.kernels.moe import moe_experts
t, h, i, e, k = 64, 128, 64, 8, 2
x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
idx = torch.randint(0, e, (t, k), device="cuda"); idx[3, 1] = 42
w = torch.rand(t, k, device="cuda", dtype=torch.bfloat16)
gu = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16); dn = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16)
y = moe_experts(x, idx, w, gu, dn)
torch.cuda.synchronize()
print("NO ERROR", y.float().abs().sum().item())
"""


@section("device_assert_child")
def _():
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    tail = (p.stdout + p.stderr)[-800:]
    log(f"  rc={p.returncode}: {tail[-400:]}")
    return {"returncode": p.returncode, "tail": tail}


with open(os.path.join(OUT, "gpu_check.json"), "w") as f:
    json.dump(report, f, indent=1, default=str)
log("done")
