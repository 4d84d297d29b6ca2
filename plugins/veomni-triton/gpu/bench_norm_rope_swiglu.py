"""Speed of rms_norm, rotary and swiglu: eager vs Liger vs veomni-triton, at the seed shapes.

    python plugins/veomni-triton/gpu/bench_norm_rope_swiglu.py --json results.json [--ops rms_norm,rotary,swiglu]

Needs a CUDA GPU, torch, triton; liger-kernel is measured when importable; the core's eager
kernels (``veomni_ops.kernels``) are the eager rows when importable (else the same code inline).

Per case and pass ("fwd" or "fwd+bwd"):

* ``wall_ms``: median of ``triton.testing.do_bench(fn, warmup=50, rep=300)`` (CUDA events
  around each call, L2 flushed before each; launch and autograd overhead included).
* ``kernel_ms``: sum of the durations of every GPU kernel/memcpy/memset of one call, from
  ``torch.profiler``, mean over 20 calls, L2 flushed before each call (the flush kernel is
  excluded).
* ``tbps``: minimal bytes / ``kernel_ms`` (formulas below, also in the JSON header). Each
  tensor that must be read or written counts once; saved statistics (rstd), workspaces and
  copies an implementation makes do not count.
* ``peak_gib``: ``torch.cuda.max_memory_allocated()`` during one call (inputs included).
* ``tflops``: null (these ops are memory bound).

The JSON header also holds the device's copy bandwidth, measured in the same run: a
``1 GiB`` device-to-device ``copy_``, bytes read + written / median time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from _setup import SMOKE, device, pick

BYTE_FORMULAS = {
    "rms_norm fwd": "e*(2*M*N) + ew*N  (read x, w; write y)",
    "rms_norm fwd+bwd": "e*(5*M*N) + ew*3*N  (fwd + read dy, x, w; write dx, dw)",
    "rotary fwd": "2*e*(numel(q)+numel(k)) + ec*(numel(cos)+numel(sin))  (read q, k, cos, sin; write q', k')",
    "rotary fwd+bwd": "2 * fwd bytes  (bwd reads dq', dk', cos, sin; writes dq, dk)",
    "swiglu fwd": "3*e*M*I  (read gate, up; write y)",
    "swiglu fwd+bwd": "8*e*M*I  (fwd + read dy, gate, up; write dgate, dup)",
}
NOTE = (
    "e = bytes per element of the activations, ew of the weight, ec of cos/sin; "
    "tbps = bytes / kernel_ms; wall_ms includes launch and autograd overhead"
)

# --------------------------------------------------------------------------- timing
_flush_buf = None


def _l2_flush():
    """Overwrite a buffer larger than L2 with a uniquely named Triton kernel (excluded from kernel time)."""
    global _flush_buf
    if SMOKE:
        return
    import triton
    import triton.language as tl

    if _flush_buf is None:

        @triton.jit
        def _l2_flush_kernel(P, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            tl.store(P + offs, tl.zeros([BLOCK], dtype=tl.int32), mask=offs < n)

        _flush_buf = (torch.empty(64 << 20, dtype=torch.int32, device="cuda"), _l2_flush_kernel)  # 256 MiB
    buf, kern = _flush_buf
    kern[(triton.cdiv(buf.numel(), 4096),)](buf, buf.numel(), BLOCK=4096)


def wall_ms(fn, leaves) -> float:
    if SMOKE:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=50, rep=300, grad_to_none=leaves or None, return_mode="median"))


def kernel_ms(fn, leaves, calls: int = 20) -> float | None:
    if SMOKE:
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # compile / autotune outside the profile
        _clear(leaves)
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            _clear(leaves)
            _l2_flush()
            fn()
        torch.cuda.synchronize()
    total_us = 0.0
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and "l2_flush" not in e.name:
            total_us += e.time_range.elapsed_us()
    return total_us / calls / 1e3


def peak_gib(fn, leaves) -> float | None:
    if SMOKE:
        return None
    _clear(leaves)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def _clear(leaves):
    for t in leaves:
        t.grad = None


def copy_bandwidth() -> dict:
    if SMOKE:
        return {"copy_bytes": None, "copy_ms": None, "copy_tbps": None}
    n = 1 << 30
    bufs = [torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1), torch.empty(n, dtype=torch.uint8, device="cuda")]

    def copy():
        bufs[1].copy_(bufs[0])

    ms = wall_ms(copy, [])
    kms = kernel_ms(copy, [])
    out = {
        "copy_bytes": 2 * n,
        "copy_ms": ms,
        "copy_tbps": 2 * n / (ms * 1e-3) / 1e12,
        "copy_kernel_ms": kms,
        "copy_kernel_tbps": 2 * n / (kms * 1e-3) / 1e12 if kms else None,
        "copy_note": "1 GiB device-to-device copy_, bytes read + written",
    }
    bufs.clear()
    torch.cuda.empty_cache()
    return out


# --------------------------------------------------------------------------- implementations
def _core(module):
    try:
        return importlib.import_module(f"veomni_ops.kernels.{module}")
    except Exception:
        return None


def _liger(module):
    try:
        return importlib.import_module(f"liger_kernel.ops.{module}")
    except Exception:
        return None


def rms_impls(variant: str) -> dict:
    from veomni_triton.kernels import rms_norm as K

    c = _core("rms_norm")
    if c is not None:
        eager = c.rms_norm_standard if variant == "standard" else c.rms_norm_offset
    else:

        def eager(x, w, eps):
            xf = x.float()
            xh = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            return (w * xh.to(x.dtype)) if variant == "standard" else (xh * (1.0 + w.float())).to(x.dtype)

    impls = {"eager": eager}
    lg = _liger("rms_norm")
    if lg is not None:
        offset, mode = (0.0, "llama") if variant == "standard" else (1.0, "gemma")
        # LigerRMSNorm's defaults: in_place=True (dX written into dY), row_mode=None
        impls["liger"] = lambda x, w, eps: lg.LigerRMSNormFunction.apply(x, w, eps, offset, mode, True, None)
    if variant == "standard":
        impls["triton"] = K.rms_norm_standard
        impls["triton_batch_invariant"] = K.rms_norm_standard_batch_invariant
    else:
        impls["triton"] = K.rms_norm_offset
        impls["triton_batch_invariant"] = K.rms_norm_offset_batch_invariant
    return impls


def rotary_impls() -> dict:
    from veomni_triton.kernels.rotary import apply_rotary

    c = _core("rotary")
    if c is not None:
        eager = c.apply_rotary
    else:

        def eager(q, k, cos, sin):
            r = cos.shape[-1]
            cu, su = cos.unsqueeze(1), sin.unsqueeze(1)

            def one(x):
                rot, rest = x[..., :r], x[..., r:]
                rh = torch.cat((-rot[..., r // 2 :], rot[..., : r // 2]), dim=-1)
                return torch.cat((rot * cu + rh * su, rest), dim=-1)

            return one(q), one(k)

    impls = {"eager": eager}
    lg = _liger("rope")
    if lg is not None:
        impls["liger"] = lambda q, k, cos, sin: lg.LigerRopeFunction.apply(q, k, cos, sin)
    impls["triton"] = apply_rotary
    return impls


def swiglu_impls() -> dict:
    from veomni_triton.kernels.swiglu import silu_mul

    c = _core("swiglu")
    impls = {"eager": c.silu_mul if c is not None else (lambda g, u: F.silu(g) * u)}
    lg = _liger("swiglu")
    if lg is not None:
        impls["liger"] = lambda g, u: lg.LigerSiLUMulFunction.apply(g, u)
    impls["triton"] = silu_mul
    return impls


# --------------------------------------------------------------------------- cases
def cases(dev, dtype):
    """(op, variant, preset, shape text, impls, make_inputs(requires_grad) -> (args, leaves), bytes fwd, bytes fwd+bwd)."""
    out = []
    e = torch.tensor([], dtype=dtype).element_size()

    # rms_norm: seed hidden states [4, 2048, 2560]
    b, s, h = pick((4, 2048, 2560), (2, 3, 40))
    m = b * s
    for variant in ("standard", "offset"):

        def make(rg, b=b, s=s, h=h):
            x = torch.randn(b, s, h, device=dev, dtype=dtype, requires_grad=rg)
            w = (1 + 0.1 * torch.randn(h, device=dev)).to(dtype).requires_grad_(rg)
            return (x, w, 1e-6), [x, w]

        out.append(("rms_norm", variant, "seed", f"[{b},{s},{h}]", rms_impls(variant), make,
                    e * 2 * m * h + e * h, e * 5 * m * h + 3 * e * h))

    # rms_norm on q/k heads (Qwen3 q_norm: [4, 2048, 32, 128])
    qb, qs, qh, qd = pick((4, 2048, 32, 128), (2, 3, 4, 16))
    qm = qb * qs * qh

    def make_qn(rg):
        x = torch.randn(qb, qs, qh, qd, device=dev, dtype=dtype, requires_grad=rg)
        w = (1 + 0.1 * torch.randn(qd, device=dev)).to(dtype).requires_grad_(rg)
        return (x, w, 1e-6), [x, w]

    out.append(("rms_norm", "standard", "q_norm", f"[{qb},{qs},{qh},{qd}]", rms_impls("standard"), make_qn,
                e * 2 * qm * qd + e * qd, e * 5 * qm * qd + 3 * e * qd))

    # rotary: seed [4, 2048], 32 q / 8 kv heads, head dim 128; cos/sin [1, S, D] (shared position_ids)
    for preset, (rb, rs, hq, hk, d, r), layout in (
        ("seed", pick((4, 2048, 32, 8, 128, 128), (2, 3, 4, 2, 16, 16)), "bshd"),
        ("seed-contiguous-bhsd", pick((4, 2048, 32, 8, 128, 128), (2, 3, 4, 2, 16, 16)), "bhsd"),
        ("qwen3.5-partial", pick((4, 2048, 16, 4, 256, 64), (2, 3, 4, 2, 16, 4)), "bshd"),
    ):
        variant = "full" if r == d else "partial"

        def make_r(rg, rb=rb, rs=rs, hq=hq, hk=hk, d=d, r=r, layout=layout):
            if layout == "bshd":  # what a model passes: the projection [B,S,H,D] transposed
                q = torch.randn(rb, rs, hq, d, device=dev, dtype=dtype).transpose(1, 2)
                k = torch.randn(rb, rs, hk, d, device=dev, dtype=dtype).transpose(1, 2)
            else:
                q = torch.randn(rb, hq, rs, d, device=dev, dtype=dtype)
                k = torch.randn(rb, hk, rs, d, device=dev, dtype=dtype)
            q.requires_grad_(rg)
            k.requires_grad_(rg)
            inv = 1.0 / (10000 ** (torch.arange(0, r, 2, device=dev, dtype=torch.float32) / r))
            f = torch.arange(rs, device=dev, dtype=torch.float32)[:, None] * inv
            emb = torch.cat((f, f), dim=-1)[None]
            return (q, k, emb.cos().to(dtype), emb.sin().to(dtype)), [q, k]

        qk = rb * rs * (hq + hk) * d
        cs = 2 * rs * r
        layout_txt = "q/k [B,S,H,D].transpose(1,2)" if layout == "bshd" else "q/k contiguous [B,H,S,D]"
        out.append(("rotary", variant, preset, f"B={rb} S={rs} Hq={hq} Hk={hk} D={d} R={r}, {layout_txt}, cos [1,S,R]",
                    rotary_impls(), make_r, 2 * e * qk + e * cs, 2 * (2 * e * qk + e * cs)))

    # swiglu: [8192, 6912]
    sm, si = pick((8192, 6912), (6, 50))

    def make_s(rg):
        g = torch.randn(sm, si, device=dev, dtype=dtype, requires_grad=rg)
        u = torch.randn(sm, si, device=dev, dtype=dtype, requires_grad=rg)
        return (g, u), [g, u]

    out.append(("swiglu", "standard", "seed", f"[{sm},{si}]", swiglu_impls(), make_s, 3 * e * sm * si, 8 * e * sm * si))

    def make_c(rg):
        gu = torch.randn(sm, 2 * si, device=dev, dtype=dtype, requires_grad=rg)
        g, u = gu.chunk(2, dim=-1)
        return (g, u), [gu]

    out.append(("swiglu", "standard", "fused-gate_up-chunk", f"[{sm},2*{si}].chunk(2)", swiglu_impls(), make_c,
                3 * e * sm * si, 8 * e * sm * si))
    return out


def run_one(op, variant, kernel, preset, shape, dtype, pas, impl, make, nbytes):
    rg = pas == "fwd+bwd"
    args, leaves = make(rg)
    leaves = leaves if rg else []
    if rg:
        with torch.no_grad():
            probe = impl(*args)
        outs = probe if isinstance(probe, tuple) else (probe,)
        grads = [torch.randn_like(o) for o in outs]
        del probe, outs

        def fn():
            o = impl(*args)
            o = o if isinstance(o, tuple) else (o,)
            torch.autograd.backward(o, grads)

    else:

        def fn():
            with torch.no_grad():
                impl(*args)

    w = wall_ms(fn, leaves)
    k = kernel_ms(fn, leaves)
    p = peak_gib(fn, leaves)
    return {
        "op": op, "variant": variant, "kernel": kernel, "preset": preset, "shape": shape,
        "dtype": str(dtype).removeprefix("torch."), "pass": pas,
        "wall_ms": w, "kernel_ms": k,
        "tbps": (nbytes / (k * 1e-3) / 1e12) if k else None,
        "tflops": None, "peak_gib": p,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--ops", default="rms_norm,rotary,swiglu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args()
    picked = device("this benchmark runs on a GPU", "cpu (smoke run: Triton interpreter, tiny shapes, no timings)")
    if picked is None:
        return 2
    dev, name = picked
    dtype = getattr(torch, args.dtype)
    wanted = set(args.ops.split(","))
    torch.manual_seed(0)

    versions = {"torch": torch.__version__}
    for mod in ("triton", "liger_kernel", "veomni_triton", "veomni_ops"):
        try:
            from importlib.metadata import version

            versions[mod] = version(mod.replace("_", "-")) if mod != "triton" else importlib.import_module(mod).__version__
        except Exception:
            versions[mod] = None
    header = {"device": name, "versions": versions, "byte_formulas": BYTE_FORMULAS, "note": NOTE,
              "timing": "wall: median do_bench(warmup=50ms, rep=300ms); kernel: profiler, mean of 20 calls, L2 flushed"}
    print(f"device: {name}  {versions}", flush=True)
    header.update(copy_bandwidth())
    if header.get("copy_tbps"):
        print(f"copy bandwidth: {header['copy_tbps']:.3f} TB/s (wall)  {header['copy_kernel_tbps']:.3f} TB/s (kernel)")

    rows, errors = [], []
    fmt = "{:<9} {:<9} {:<23} {:<21} {:<8} {:>9} {:>10} {:>7} {:>8}"
    print(fmt.format("op", "variant", "kernel", "preset", "pass", "wall_ms", "kernel_ms", "TB/s", "peakGiB"))
    for op, variant, preset, shape, impls, make, b_fwd, b_all in cases(dev, dtype):
        if op not in wanted:
            continue
        for kernel, impl in impls.items():
            for pas, nbytes in (("fwd", b_fwd), ("fwd+bwd", b_all)):
                try:
                    row = run_one(op, variant, kernel, preset, shape, dtype, pas, impl, make, nbytes)
                except Exception as e:  # record and go on: one failing peer must not stop the run
                    traceback.print_exc()
                    errors.append({"op": op, "variant": variant, "kernel": kernel, "preset": preset, "pass": pas,
                                   "error": f"{type(e).__name__}: {e}"[:300]})
                    continue
                finally:
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                rows.append(row)

                def f(v, spec):
                    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)

                print(fmt.format(op, variant, kernel, preset[:21], pas, f(row["wall_ms"], ".4f"),
                                 f(row["kernel_ms"], ".4f"), f(row["tbps"], ".3f"), f(row["peak_gib"], ".2f")),
                      flush=True)

    # ours vs liger summary (kernel time) for the lead's quick read
    summary = []
    for r in rows:
        if r["kernel"] != "triton":
            continue
        peer = [x for x in rows if x["kernel"] == "liger" and all(x[k] == r[k] for k in ("op", "variant", "preset", "pass"))]
        if peer and r["kernel_ms"] and peer[0]["kernel_ms"]:
            summary.append({k: r[k] for k in ("op", "variant", "preset", "pass")} | {
                "kernel_speedup_vs_liger": peer[0]["kernel_ms"] / r["kernel_ms"],
                "wall_speedup_vs_liger": peer[0]["wall_ms"] / r["wall_ms"],
            })
    if summary:
        print("\nours vs liger (>1 = ours faster):")
        for s_ in summary:
            print(f"  {s_['op']:<9} {s_['variant']:<9} {s_['preset']:<21} {s_['pass']:<8} kernel x{s_['kernel_speedup_vs_liger']:.2f}"
                  f"  wall x{s_['wall_speedup_vs_liger']:.2f}")
    with open(args.json, "w") as fh:
        json.dump({"header": header, "rows": rows, "errors": errors, "summary": summary}, fh, indent=1)
    print(f"\nwrote {args.json}: {len(rows)} rows, {len(errors)} errors")
    if errors:
        print("errors:", *[f"  {e_}" for e_ in errors], sep="\n")
    # a peer that fails is reported, not fatal; one of ours that fails is
    return 1 if any(e_["kernel"].startswith("triton") for e_ in errors) else 0


if __name__ == "__main__":
    sys.exit(main())
