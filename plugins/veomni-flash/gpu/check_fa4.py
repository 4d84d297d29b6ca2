"""FlashAttention-4 through veomni-flash's adapter: numerics against sdpa / eager / fp32, and a benchmark.

Run on a CUDA machine (Hopper or Blackwell; FA4's backward needs sm90+) where
``import flash_attn.cute`` works (flash-attn-4 + nvidia-cutlass-dsl; a ``pip install --target DIR``
is fine: put DIR on PYTHONPATH or pass ``--path DIR``; ``flash_attn`` may then be a namespace
package holding only ``cute``)::

    python plugins/veomni-flash/gpu/check_fa4.py --json fa4.json

Numerics (bf16, 32 query / 8 key-value heads, head dim 128): every case runs forward and
backward through ``veomni_flash.kernels.fa4.flash_attention_4`` (the transformers attention
signature: [B, H, S, D] in, [B, S, H, D] out), through ``F.scaled_dot_product_attention`` and
through the core's eager attention, all in bf16, and compares each with a float32 reference
(TF32 off, computed one batch row at a time). FA4 passes a case when its error is at most
twice sdpa's bf16 error plus 1e-3 of the reference's magnitude (the criterion of the
flash-attention test suite); whether it is inside the KernelSpec tolerance is reported too.
Padded query rows are excluded (flash returns zeros there, sdpa garbage).

Benchmark (batch 4, sequence 4096, 32/8 heads, d 128, causal, bf16): FA4 through the
adapter, FA4 called directly, and sdpa; forward and forward+backward. Median wall time of
``triton.testing.do_bench`` (50 ms warm-up, 300 ms of repeats), kernel time = sum of the GPU
kernels of one call from ``torch.profiler`` (mean of 20 calls), TFLOP/s from wall time with
causal forward FLOPs = 4*B*Hq*S*S*D/2 and forward+backward = 3.5x that, peak memory.

``--smoke`` runs the whole script on the CPU at tiny shapes with the float64 stand-in of
``flash_attn.cute`` from the tests (plumbing check only, no measurement).

Every case catches its own exception; the JSON always gets written.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback
import zlib
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN_SRC = os.path.normpath(os.path.join(HERE, "..", "src"))
CORE_SRC = os.path.normpath(os.path.join(HERE, "..", "..", "..", "core", "src"))
STANDINS = os.path.normpath(os.path.join(HERE, "..", "tests", "standins"))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--path", action="append", default=[], help="extra sys.path entry (e.g. a pip --target dir)")
    p.add_argument("--smoke", action="store_true", help="CPU plumbing check with the float64 stand-in")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--cases", default="", help="comma-separated subset of numerics cases")
    return p.parse_args()


ARGS = parse_args()
for extra in reversed(ARGS.path):
    sys.path.insert(0, extra)
if ARGS.smoke:
    sys.path[:0] = [os.path.join(STANDINS, "fa4_only"), STANDINS]
for mod, path in (("veomni_ops", CORE_SRC), ("veomni_flash", PLUGIN_SRC)):
    if importlib.util.find_spec(mod) is None and os.path.isdir(path):
        sys.path.insert(0, path)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEVICE = "cpu" if ARGS.smoke else "cuda"
DTYPE = torch.bfloat16
HQ, HK, D = (8, 2, 16) if ARGS.smoke else (32, 8, 128)

RESULTS: dict[str, Any] = {"meta": {}, "checks": [], "bench": [], "bench_details": [], "errors": [], "notes": []}


def write_json() -> None:
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)
        log(f"wrote {ARGS.json}")


def dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def meta() -> None:
    m = RESULTS["meta"]
    m.update(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        flash_attn_4=dist_version("flash-attn-4"),
        nvidia_cutlass_dsl=dist_version("nvidia-cutlass-dsl"),
        triton=dist_version("triton"),
        smoke=ARGS.smoke,
        heads=f"{HQ}/{HK}",
        head_dim=D,
    )
    if DEVICE == "cuda":
        m.update(device=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()))
    else:
        m.update(device="cpu (smoke: float64 stand-in for flash_attn.cute)")


# ---- the implementations ---------------------------------------------------------------------


class Attn(torch.nn.Module):
    def __init__(self, is_causal: bool):
        super().__init__()
        self.is_causal = is_causal
        self.eval()  # no dropout anywhere


def load_fa4():
    from veomni_flash.kernels import fa4

    return fa4


def core_eager():
    try:
        from veomni_ops.kernels.attention import eager_attention

        return eager_attention, "veomni_ops.kernels.attention.eager_attention"
    except Exception as e:  # keep the script useful when the core (or pluggy/pyyaml) is missing
        RESULTS["notes"].append(f"core eager not importable ({e!r}); using a local eager with the same math")

        def local_eager(module, q, k, v, mask, *, scaling=None, softcap=None, **_):
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            s = (q @ k.transpose(-1, -2)) * (scaling or q.shape[-1] ** -0.5)
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            if mask is not None:
                s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
            p = torch.softmax(s, -1, dtype=torch.float32).to(q.dtype)
            return (p @ v).transpose(1, 2), None

        return local_eager, "local eager (core import failed)"


def build_mask(b, s, *, causal, window=None, valid=None, segments=None, device):
    """Boolean [B|1, 1, S, S]; padded query rows see themselves only, so every row is finite."""
    i = torch.arange(s, device=device)[:, None]
    j = torch.arange(s, device=device)[None, :]
    m = torch.ones(1, 1, s, s, dtype=torch.bool, device=device)
    if causal:
        m = m & (j <= i)
    if window is not None:
        m = m & (j > i - window) & (True if causal else (j < i + window))
    if valid is not None:
        m = m & valid[:, None, None, :]
        m = m | (~valid[:, None, :, None] & (i == j))
    if segments is not None:
        m = m & (segments[:, None, :, None] == segments[:, None, None, :])
    return m


def reference_fp32(q, k, v, dout, mask, causal, scale, softcap):
    """float32 attention (TF32 off) and its gradients, one batch row at a time (memory)."""
    outs, dqs, dks, dvs = [], [], [], []
    rep = q.shape[1] // k.shape[1]
    s_len = q.shape[2]
    for b in range(q.shape[0]):
        qb, kb, vb = (t[b : b + 1].float().detach().requires_grad_(True) for t in (q, k, v))
        kk, vv = kb.repeat_interleave(rep, 1), vb.repeat_interleave(rep, 1)
        s = (qb @ kk.transpose(-1, -2)) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        if mask is not None:
            mb = mask[b : b + 1] if mask.shape[0] > 1 else mask
            s = s.masked_fill(~mb, float("-inf"))
        elif causal:
            s = s.masked_fill(~torch.ones(s_len, s_len, dtype=torch.bool, device=q.device).tril(), float("-inf"))
        p = torch.softmax(s, -1)
        ob = (p @ vv).transpose(1, 2)  # [1, S, H, D]
        ob.backward(dout[b : b + 1].float())
        outs.append(ob.detach())
        dqs.append(qb.grad)
        dks.append(kb.grad)
        dvs.append(vb.grad)
        del s, p, ob
    return torch.cat(outs), (torch.cat(dqs), torch.cat(dks), torch.cat(dvs))


def fwd_bwd(fn, q, k, v, dout):
    q_, k_, v_ = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = fn(q_, k_, v_)
    out.backward(dout)
    return out.detach(), (q_.grad, k_.grad, v_.grad)


# ---- numerics ---------------------------------------------------------------------------------


def cases() -> list[dict[str, Any]]:
    if ARGS.smoke:
        return [
            dict(name="dense_causal", b=2, s=64, causal=True),
            dict(name="dense_bidirectional", b=2, s=48, causal=False),
            dict(name="padded_causal", b=3, s=64, causal=True, padded=True),
            dict(name="packed_position_ids", b=1, s=96, causal=True, packed=[40, 7, 30, 19]),
            dict(name="packed_cu_seq_lens", b=1, s=96, causal=True, packed=[40, 7, 30, 19], use_cu=True),
            dict(name="sliding_window", b=2, s=64, causal=True, window=16),
            dict(name="softcap", b=2, s=32, causal=True, softcap=5.0),
        ]
    return [
        dict(name="dense_causal_b2_s1024", b=2, s=1024, causal=True),
        dict(name="dense_causal_b4_s4096", b=4, s=4096, causal=True),
        dict(name="dense_bidirectional_b2_s2048", b=2, s=2048, causal=False),
        dict(name="padded_causal_b3_s2048", b=3, s=2048, causal=True, padded=True),
        dict(name="packed_position_ids_s4096", b=1, s=4096, causal=True, packed=[1000, 37, 2048, 1011]),
        dict(name="packed_cu_seq_lens_s4096", b=1, s=4096, causal=True, packed=[1000, 37, 2048, 1011], use_cu=True),
        dict(name="sliding_window1024_b2_s4096", b=2, s=4096, causal=True, window=1024),
        dict(name="softcap50_b2_s1024", b=2, s=1024, causal=True, softcap=50.0),
    ]


def metric(a: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor | None) -> tuple[float, float, bool]:
    a, ref = a.float(), ref.float()
    if rows is not None:
        a, ref = a[rows], ref[rows]
    err = (a - ref).abs().max().item()
    scale = ref.abs().max().item()
    return err, scale, bool(torch.isfinite(a).all().item())


def run_case(c: dict[str, Any], fa4, eager, spec_tol) -> None:
    b, s, causal = c["b"], c["s"], c["causal"]
    shape = f"B={b},S={s},Hq={HQ},Hk={HK},D={D}"
    log(f"case {c['name']} ({shape}, causal={causal})")
    g = torch.Generator(device=DEVICE).manual_seed(zlib.crc32(c["name"].encode()))
    # [B, S, H, D] projections viewed as [B, H, S, D], as in a transformers model.
    q = torch.randn(b, s, HQ, D, device=DEVICE, dtype=DTYPE, generator=g).transpose(1, 2)
    k = torch.randn(b, s, HK, D, device=DEVICE, dtype=DTYPE, generator=g).transpose(1, 2)
    v = torch.randn(b, s, HK, D, device=DEVICE, dtype=DTYPE, generator=g).transpose(1, 2)
    dout = torch.randn(b, s, HQ, D, device=DEVICE, dtype=DTYPE, generator=g)
    scale = D**-0.5
    module = Attn(causal)
    kw: dict[str, Any] = {}
    attn_mask2d = None
    valid = None
    segments = None
    if c.get("padded"):
        lens = [s, s - s // 3, s // 2][:b]
        valid = torch.zeros(b, s, dtype=torch.bool, device=DEVICE)
        valid[0, :] = True
        valid[1, s - lens[1] :] = True  # left padding
        valid[2, : lens[2]] = True  # right padding
        attn_mask2d = valid.long()
    if c.get("packed"):
        lens = c["packed"]
        assert sum(lens) == s
        pos = torch.cat([torch.arange(n, device=DEVICE) for n in lens])[None]
        segments = torch.cat([torch.full((n,), i, device=DEVICE) for i, n in enumerate(lens)])[None]
        if c.get("use_cu"):
            cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
            kw.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lens), max_length_k=max(lens))
        else:
            kw["position_ids"] = pos
    window, softcap = c.get("window"), c.get("softcap")
    mask = None
    if valid is not None or segments is not None or window is not None:
        mask = build_mask(b, s, causal=causal, window=window, valid=valid, segments=segments, device=DEVICE)
    rows = valid if valid is not None else None
    if rows is not None:
        dout = dout * rows[:, :, None, None].to(dout.dtype)

    impls: dict[str, Any] = {}

    def fa4_fn(q_, k_, v_):
        return fa4.flash_attention_4(module, q_, k_, v_, attn_mask2d, scaling=scale, sliding_window=window,
                                     softcap=softcap, **kw)[0]

    def sdpa_fn(q_, k_, v_):
        if softcap:
            raise NotImplementedError("sdpa has no softcap")
        if mask is None:
            o = F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal, scale=scale, enable_gqa=True)
        else:
            rep = HQ // HK
            o = F.scaled_dot_product_attention(q_, k_.repeat_interleave(rep, 1), v_.repeat_interleave(rep, 1),
                                               attn_mask=mask, scale=scale)
        return o.transpose(1, 2)

    def eager_fn(q_, k_, v_):
        m = mask
        if m is None and causal:
            m = build_mask(1, s, causal=True, device=DEVICE)
        return eager(module, q_, k_, v_, m, scaling=scale, softcap=softcap)[0]

    for name, fn in (("flash_attention_4", fa4_fn), ("sdpa", sdpa_fn), ("eager", eager_fn)):
        try:
            t0 = time.perf_counter()
            impls[name] = fwd_bwd(fn, q, k, v, dout)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            log(f"  {name}: fwd+bwd ok ({time.perf_counter() - t0:.1f} s incl. compile)")
        except NotImplementedError as e:
            log(f"  {name}: n/a ({e})")
        except Exception as e:
            RESULTS["errors"].append({"case": c["name"], "impl": name, "error": repr(e),
                                      "traceback": traceback.format_exc()})
            log(f"  {name}: FAILED {e!r}")
        if DEVICE == "cuda":
            torch.cuda.empty_cache()

    try:
        old_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = reference_fp32(q, k, v, dout, mask, causal, scale, softcap)
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    except Exception as e:
        RESULTS["errors"].append({"case": c["name"], "impl": "fp32 reference", "error": repr(e)})
        log(f"  reference FAILED {e!r}")
        return

    def pick(name: str, t_i: int) -> torch.Tensor:
        out, grads = impls[name]
        # Gradients are [B, H, S, D] like the inputs; compare everything as [B, S, H, D].
        return out if t_i == 0 else grads[t_i - 1].transpose(1, 2)

    for t_i, tname in enumerate(("out", "dq", "dk", "dv")):
        ref_t = ref[0] if t_i == 0 else ref[1][t_i - 1].transpose(1, 2)
        r = rows if tname in ("out", "dq") else None  # padded query rows: flash zeros, sdpa garbage
        errs = {name: metric(pick(name, t_i), ref_t, r) for name in impls}
        if "flash_attention_4" not in errs:
            RESULTS["checks"].append({"case": c["name"], "shape": shape, "tensor": tname, "ok": False,
                                      "why": "flash_attention_4 failed to run"})
            continue
        fa_err, scale_t, finite = errs["flash_attention_4"]
        base = errs.get("sdpa") or errs.get("eager")  # softcap: sdpa has none, eager is the baseline
        bound = 2 * base[0] + 1e-3 * scale_t if base else None
        a, rr = pick("flash_attention_4", t_i).float(), ref_t.float()
        if r is not None:
            a, rr = a[r], rr[r]
        # The spec tolerance, with atol scaled to the tensor's magnitude (gradients are not O(1)).
        spec_ok = bool(torch.allclose(a, rr, atol=spec_tol.atol * max(scale_t, 1e-6), rtol=spec_tol.rtol))
        ok = finite and bound is not None and fa_err <= bound
        row = {
            "case": c["name"],
            "shape": shape,
            "causal": causal,
            "tensor": tname,
            "ref_max_abs": scale_t,
            "fa4_max_err": fa_err,
            "sdpa_max_err": errs["sdpa"][0] if "sdpa" in errs else None,
            "eager_max_err": errs["eager"][0] if "eager" in errs else None,
            "fa4_vs_sdpa": metric(pick("flash_attention_4", t_i), pick("sdpa", t_i), r)[0] if "sdpa" in impls else None,
            "fa4_vs_eager": metric(pick("flash_attention_4", t_i), pick("eager", t_i), r)[0]
            if "eager" in impls else None,
            "bound_2x_baseline": bound,
            "spec_tolerance_ok": spec_ok,
            "finite": finite,
            "ok": ok,
        }
        RESULTS["checks"].append(row)
        log(f"  {tname}: fa4 err {fa_err:.3g} (sdpa {row['sdpa_max_err']}, eager {row['eager_max_err']}, "
            f"|ref| {scale_t:.3g}) -> {'OK' if ok else 'FAIL'}{'' if spec_ok else ' (outside spec tolerance)'}")


def check_all() -> None:
    fa4 = load_fa4()
    eager, eager_name = core_eager()
    RESULTS["meta"]["eager"] = eager_name
    try:
        from veomni_flash.specs import attention as attention_specs

        spec = next(sp for sp in attention_specs() if sp.name == "flash_attention_4")
        tol = spec.tolerance("bfloat16")
    except Exception as e:  # the spec module needs veomni_ops (pluggy, packaging)
        from types import SimpleNamespace

        tol = SimpleNamespace(atol=3e-2, rtol=3e-2)
        RESULTS["notes"].append(f"veomni_flash.specs not importable ({e!r}); spec tolerance taken as 3e-2/3e-2")
    RESULTS["meta"]["spec_tolerance_bf16"] = [tol.atol, tol.rtol]
    wanted = {x for x in ARGS.cases.split(",") if x}
    for c in cases():
        if wanted and c["name"] not in wanted:
            continue
        try:
            run_case(c, fa4, eager, tol)
        except Exception as e:
            RESULTS["errors"].append({"case": c["name"], "error": repr(e), "traceback": traceback.format_exc()})
            log(f"case {c['name']} FAILED: {e!r}")
        finally:
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        write_json()


# ---- benchmark ----------------------------------------------------------------------------------


def wall_ms(fn, grad_to_none=None) -> float:
    if DEVICE == "cuda":
        try:
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=50, rep=300, grad_to_none=grad_to_none, return_mode="median"))
        except ImportError:
            pass
        times = []
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        for _ in range(100):
            if grad_to_none:
                for t in grad_to_none:
                    t.grad = None
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_ms(fn, iters: int = 20) -> tuple[float | None, list[str]]:
    """Mean GPU time of one call: the sum of the CUDA kernels' durations in the profiler trace."""
    if DEVICE != "cuda":
        return None, []
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total_us = 0.0
    per_name: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            us = e.time_range.elapsed_us()
            total_us += us
            per_name[e.name] = per_name.get(e.name, 0.0) + us
    top = sorted(per_name, key=per_name.get, reverse=True)[:4]
    return total_us / iters / 1e3, [f"{n[:90]} ({per_name[n] / iters / 1e3:.3f} ms)" for n in top]


def peak_gib(fn) -> float | None:
    if DEVICE != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def bench() -> None:
    b, s = (1, 64) if ARGS.smoke else (4, 4096)
    preset = "smoke" if ARGS.smoke else "anchors_b4_s4096"
    shape = f"B={b},S={s},Hq={HQ},Hk={HK},D={D},causal"
    fwd_flops = 4 * b * HQ * s * s * D / 2
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q4 = torch.randn(b, s, HQ, D, device=DEVICE, dtype=DTYPE, generator=g)
    k4 = torch.randn(b, s, HK, D, device=DEVICE, dtype=DTYPE, generator=g)
    v4 = torch.randn(b, s, HK, D, device=DEVICE, dtype=DTYPE, generator=g)
    dout = torch.randn(b, s, HQ, D, device=DEVICE, dtype=DTYPE, generator=g)
    # Model layout: [B, H, S, D] views of [B, S, H, D] projections.
    qh, kh, vh = (t.transpose(1, 2).detach().requires_grad_(True) for t in (q4, k4, v4))
    q4r, k4r, v4r = (t.detach().requires_grad_(True) for t in (q4, k4, v4))
    fa4 = load_fa4()
    module = Attn(True)
    raw = fa4.BACKEND.flash_attn_func

    def run_adapter():
        return fa4.flash_attention_4(module, qh, kh, vh, None, scaling=D**-0.5)[0]

    def run_raw():
        out = raw(q4r, k4r, v4r, softmax_scale=D**-0.5, causal=True)
        return out[0] if isinstance(out, tuple) else out

    def run_sdpa():
        return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=D**-0.5, enable_gqa=True).transpose(1, 2)

    kernels = [
        ("flash_attention_4", run_adapter, [qh, kh, vh]),
        ("flash_attn.cute (direct)", run_raw, [q4r, k4r, v4r]),
        ("sdpa", run_sdpa, [qh, kh, vh]),
    ]
    for name, fn, leaves in kernels:
        for pass_name in ("fwd", "fwd+bwd"):
            log(f"bench {name} {pass_name}")
            try:
                if pass_name == "fwd":

                    def call(fn=fn):
                        with torch.no_grad():
                            return fn()
                else:

                    def call(fn=fn, leaves=leaves):
                        for t in leaves:
                            t.grad = None
                        fn().backward(dout)

                call()  # compile / warm up
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                w = wall_ms(call, grad_to_none=leaves if pass_name != "fwd" else None)
                kms, top = kernel_ms(call)
                pk = peak_gib(call)
                flops = fwd_flops * (1.0 if pass_name == "fwd" else 3.5)
                row = {
                    "op": "attention",
                    "variant": "standard",
                    "kernel": name,
                    "preset": preset,
                    "shape": shape,
                    "dtype": "bfloat16",
                    "pass": pass_name,
                    "wall_ms": round(w, 4),
                    "kernel_ms": round(kms, 4) if kms is not None else None,
                    "tbps": None,
                    "tflops": round(flops / (w * 1e-3) / 1e12, 1),
                    "peak_gib": round(pk, 3) if pk is not None else None,
                }
                RESULTS["bench"].append(row)
                RESULTS["bench_details"].append({"kernel": name, "pass": pass_name, "top_gpu_kernels": top,
                                                 "tflops_from_kernel_time": round(flops / (kms * 1e-3) / 1e12, 1)
                                                 if kms else None})
                log(f"  wall {w:.3f} ms, kernel {kms if kms is None else round(kms, 3)} ms, "
                    f"{row['tflops']} TFLOP/s, peak {row['peak_gib']} GiB; top: {top[:2]}")
            except Exception as e:
                RESULTS["errors"].append({"bench": name, "pass": pass_name, "error": repr(e),
                                          "traceback": traceback.format_exc()})
                log(f"  FAILED {e!r}")
            finally:
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
            write_json()


def main() -> int:
    meta()
    log(f"meta: {RESULTS['meta']}")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        RESULTS["errors"].append({"where": "setup", "error": "no CUDA device; use --smoke for a CPU plumbing run"})
        write_json()
        log("no CUDA device")
        return 2
    try:
        load_fa4()
    except Exception as e:
        RESULTS["errors"].append({"where": "import flash_attn.cute via veomni_flash", "error": repr(e)})
        write_json()
        log(f"cannot load FA4: {e}")
        return 2
    if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        log("warning: FA4's backward needs sm90+; backward cases will fail on this GPU")
    if not ARGS.skip_check:
        check_all()
    if not ARGS.skip_bench:
        bench()
    n_ok = sum(1 for c in RESULTS["checks"] if c.get("ok"))
    RESULTS["summary"] = {"checks_ok": n_ok, "checks": len(RESULTS["checks"]), "errors": len(RESULTS["errors"]),
                          "bench_rows": len(RESULTS["bench"])}
    write_json()
    log(f"summary: {RESULTS['summary']}")
    for r in RESULTS["bench"]:
        log(f"  {r['kernel']:<26} {r['pass']:<8} wall {r['wall_ms']} ms  kernel {r['kernel_ms']} ms  "
            f"{r['tflops']} TFLOP/s  peak {r['peak_gib']} GiB")
    return 0 if n_ok == len(RESULTS["checks"]) and not RESULTS["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
