"""Sweep the launch heuristics of rms_norm / rotary / swiglu at the seed shapes (optional, ~2 min).

    python plugins/veomni-triton/gpu/tune_norm_rope_swiglu.py [--json tune.json]

The kernels use a small heuristic table instead of autotuning (no compile storms, no host
syncs). This script times the alternatives the table chose between, per kernel, with CUDA
graphs (``triton.testing.do_bench_cudagraph``: kernel time without launch overhead), and
prints the default next to the best, so the table can be corrected from a real measurement.
Needs a CUDA GPU, torch, triton.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch
import triton
import triton.testing
from _setup import SMOKE, device, pick

RESULTS: list[dict] = []


def timed(fn) -> float:
    if SMOKE:  # plumbing only
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def sweep(name: str, nbytes: int, default, candidates, install, make_fn) -> None:
    """``install(cfg)`` patches the module's heuristic; ``make_fn()`` returns the call to time."""
    rows = []
    for cfg in sorted(set(candidates) | {tuple(default)}):
        restore = install(cfg)
        try:
            ms = timed(make_fn())
            rows.append((cfg, ms))
        except Exception as e:
            print(f"  {name} {cfg}: {type(e).__name__}: {e}")
        finally:
            restore()
    if not rows:
        return
    rows.sort(key=lambda r: r[1])
    d = next((ms for cfg, ms in rows if cfg == default), None)
    best_cfg, best_ms = rows[0]
    print(f"{name}: default {default} -> {d if d is None else f'{d * 1e3:.1f} us ({nbytes / d / 1e9:.2f} TB/s)'}; "
          f"best {best_cfg} -> {best_ms * 1e3:.1f} us ({nbytes / best_ms / 1e9:.2f} TB/s)")
    for cfg, ms in rows[:5]:
        print(f"    {cfg}: {ms * 1e3:.1f} us")
    RESULTS.append({"kernel": name, "default": list(default), "default_ms": d, "best": list(best_cfg),
                    "best_ms": best_ms, "bytes": nbytes, "all": [[list(c), m] for c, m in rows]})


def _clear_caches(module) -> None:
    # launch configurations derived from the patched heuristic are memoised (lru_cache)
    for obj in list(vars(module).values()):
        if callable(getattr(obj, "cache_clear", None)):
            obj.cache_clear()


def patch(module, attr, value):
    old = getattr(module, attr)
    setattr(module, attr, value)
    _clear_caches(module)

    def undo():
        setattr(module, attr, old)
        _clear_caches(module)

    return undo


def tune_rms_norm(dev) -> None:
    from veomni_triton.kernels import rms_norm as K

    sms = K.num_sms(dev)
    ops = torch.ops.veomni_triton
    for label, (m, n) in pick({"seed [8192,2560]": (8192, 2560), "q_norm [262144,128]": (262144, 128)}, {"smoke": (6, 40)}).items():
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, device=dev, dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        bn, rows0, warps0 = K.fwd_config(m, n, False, sms)
        cands = sorted({(r, wp) for r in (1, 2, 4, 8, 16, 32) if r * bn <= 16384 for wp in (2, 4, 8, 16)})
        sweep(f"rms_norm fwd {label}", 4 * m * n, (rows0, warps0), cands,
              lambda c, bn=bn: patch(K, "fwd_config", lambda *a, c=c: (bn, c[0], c[1])),
              lambda x=x, w=w: (lambda: ops.rms_norm_fwd(x, w, 1e-6, False, False)))
        _, rstd = ops.rms_norm_fwd(x, w, 1e-6, False, False)
        bn, rows0, warps0, progs0 = K.bwd_config(m, n, sms)
        per0 = max(1, round(progs0 / sms))
        cands = sorted({(r, wp, p) for r in (1, 2, 4, 8, 16, 32) if r * bn <= 16384
                        for wp in (4, 8, 16) for p in (1, 2, 4, 8)})

        def install_bwd(c, bn=bn, m=m):
            return patch(K, "bwd_config", lambda *a, c=c: (bn, c[0], c[1], max(1, min(triton.cdiv(m, c[0]), c[2] * sms))))

        sweep(f"rms_norm bwd {label}", 6 * m * n, (rows0, warps0, per0), cands, install_bwd,
              lambda x=x, w=w, dy=dy, rstd=rstd: (lambda: ops.rms_norm_bwd(dy, x, w, rstd, False)))


def tune_rotary(dev) -> None:
    from veomni_triton.kernels import rotary as R

    b, s, hq, hk, d = pick((4, 2048, 32, 8, 128), (1, 2, 4, 2, 16))
    q = torch.randn(b, s, hq, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, s, hk, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    cos = torch.randn(1, s, d, device=dev, dtype=torch.bfloat16)
    sin = torch.randn(1, s, d, device=dev, dtype=torch.bfloat16)
    default = R.rope_config(hq, hk, d, d)
    bh, bp = default[0], default[1]
    cands = sorted({(bh, bp, q_, min(q_, triton.next_power_of_2(hk)), wp) for q_ in (4, 8, 16, 32) for wp in (1, 2, 4, 8)})
    nbytes = 2 * 2 * (q.numel() + k.numel()) + 2 * 2 * cos.numel()
    sweep("rotary fwd seed (transposed q/k)", nbytes, tuple(default), cands,
          lambda c: patch(R, "rope_config", lambda *a, c=c: c),
          lambda: (lambda: torch.ops.veomni_triton.rotary(q, k, cos, sin, False)))


def tune_swiglu(dev) -> None:
    from veomni_triton.kernels import swiglu as S

    g = torch.randn(pick((8192, 6912), (3, 40)), device=dev, dtype=torch.bfloat16)
    u = torch.randn_like(g)
    dy = torch.randn_like(g)
    cands = [(b, w) for b in (512, 1024, 2048, 4096, 8192) for w in (2, 4, 8, 16) if b // (32 * w) >= 4]
    sweep("swiglu fwd [8192,6912]", 3 * 2 * g.numel(), S.FWD_CONFIG, cands,
          lambda c: patch(S, "FWD_CONFIG", c), lambda: (lambda: torch.ops.veomni_triton.swiglu_fwd(g, u)))
    sweep("swiglu bwd [8192,6912]", 5 * 2 * g.numel(), S.BWD_CONFIG, cands,
          lambda c: patch(S, "BWD_CONFIG", c), lambda: (lambda: torch.ops.veomni_triton.swiglu_bwd(dy, g, u)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--ops", default="rms_norm,rotary,swiglu")
    args = ap.parse_args()
    picked = device("", "cpu (smoke run, timings meaningless)")
    if picked is None:
        return 2
    dev, name = picked
    print(f"device: {name}  torch {torch.__version__}  triton {triton.__version__}")
    failed = False
    for op in args.ops.split(","):
        try:
            {"rms_norm": tune_rms_norm, "rotary": tune_rotary, "swiglu": tune_swiglu}[op](dev)
        except Exception:
            traceback.print_exc()
            failed = True
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "results": RESULTS}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
