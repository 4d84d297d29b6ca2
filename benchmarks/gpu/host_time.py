"""Host time per call of the fusion kernels' wrappers beside eager's, on one CUDA GPU.

    python benchmarks/gpu/host_time.py [--json FILE]

For each wrapper: microseconds of host time per call (``perf_counter`` over N calls with no
synchronisation inside the loop, tiny inputs so the GPU never holds the host back), forward and
forward+backward, and whether the fast launch path (``veomni_triton.kernels.launch``) holds an
entry for each Triton kernel launched. A diagnostic for a kernel that is faster on the GPU and
slower in an eager step.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def per_call(fn, n: int = 2000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def fwd_bwd(fn):
    def run():
        out = fn()
        out = out if isinstance(out, tuple) else (out,)
        sum(o.float().sum() for o in out if o.is_floating_point()).backward()
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    from veomni_ops.ops.moe_router.kernel import moe_router as eager_router
    from veomni_ops.ops.residual_rms_norm.kernel import residual_rms_norm as eager_residual
    from veomni_triton.kernels import launch
    from veomni_triton.kernels.residual_rms_norm import residual_rms_norm
    from veomni_triton.kernels.router import moe_router

    dev, dt = "cuda", torch.bfloat16
    logits = torch.randn(64, 128, device=dev, dtype=dt, requires_grad=True)
    x = torch.randn(64, 1024, device=dev, dtype=dt, requires_grad=True)
    r = torch.randn(64, 1024, device=dev, dtype=dt, requires_grad=True)
    w = torch.ones(1024, device=dev, dtype=dt, requires_grad=True)
    cases = {
        "moe_router eager": lambda: eager_router(logits, 8, True),
        "moe_router triton": lambda: moe_router(logits, 8, True),
        "residual_rms_norm eager": lambda: eager_residual(x, r, w, 1e-6),
        "residual_rms_norm triton": lambda: residual_rms_norm(x, r, w, 1e-6),
    }
    rows = []
    for name, fn in cases.items():
        f = per_call(fn)
        fb = per_call(fwd_bwd(fn), 1000)
        rows.append({"case": name, "fwd_us": round(f, 1), "fwd_bwd_us": round(fb, 1)})
        print(f"{name:28s} fwd {f:8.1f} us   fwd+bwd {fb:8.1f} us", flush=True)
    cache = {}
    for key, entry in launch._LAUNCH_CACHE.items():
        k = getattr(key[0], "__name__", str(key[0]))
        cache[k] = cache.get(k, []) + ["fast" if entry else "triton's path"]
    print("fast launch cache:", cache)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "launch_cache": cache, "fast_launch": launch._FAST_LAUNCH}, f, indent=1)


if __name__ == "__main__":
    main()
