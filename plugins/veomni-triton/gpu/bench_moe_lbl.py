"""Speed and memory of moe_experts and load_balancing_loss: PyTorch baselines vs veomni-triton.

    python plugins/veomni-triton/gpu/bench_moe_lbl.py --json results.json [--ops moe,lbl] [--no-sweep]

Needs a CUDA GPU, torch, triton. The core's kernels (``veomni_ops.kernels.moe``,
``.load_balancing``) are used for the baselines when importable, else small PyTorch versions
written here (same algorithms); transformers, when importable, gives the load-balancing
baseline (its ``load_balancing_loss_func``).

Shapes (the ANCHORS ones): MoE Qwen3-30B-A3B-like, T=8192 tokens, H=2048, I=768, E=128,
top-8, bf16, router-like routing (softmax top-k of random logits); load-balancing loss
48 layers x 8192 tokens x 128 experts, top-8, fp32 logits, no mask (and one masked row).

Per row (implementation x pass):

* ``wall_ms``: median of ``triton.testing.do_bench(fn, warmup=50, rep=300)`` (launch and
  autograd overhead included; do_bench flushes L2 before each call).
* ``kernel_ms``: sum of the durations of every GPU kernel/memcpy/memset of one call, from
  ``torch.profiler``, mean over 20 calls (L2 flushed before each call by a kernel excluded
  from the sum). ``kernels`` breaks it down by kernel name (ms per call).
* ``tflops`` (MoE): FLOPs / kernel_ms with fwd = 2*T*K*(2I*H + H*I) = 6*T*K*H*I and
  fwd+bwd = 3 * fwd (routes with a sentinel expert would count, there are none here).
* ``tbps`` (load balancing): bytes / kernel_ms with fwd = L*T*E*e (read the logits once) and
  fwd+bwd = 3*L*T*E*e (read twice, write the gradient once); e = bytes per logit.
* ``peak_gib``: ``torch.cuda.max_memory_allocated()`` during one call (inputs included);
  ``extra_gib``: that peak minus what was allocated before the call.

The JSON header holds a bf16 8192^3 ``torch.matmul`` TFLOP/s ceiling measured in the same
run. ``preset`` rows (MoE, ``--no-sweep`` to skip) rerun our kernel with other tile
configurations (``veomni_triton.kernels.moe.override_configs``): the per-kernel breakdown
says which configuration is fastest for each of the five GEMM kernels.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
import traceback
from collections import defaultdict

import torch
import torch.nn.functional as F
from _setup import SMOKE, pick

ROWS: list[dict] = []
HEADER: dict = {}
JSON_PATH: str | None = None


def write_json(partial: bool) -> None:
    """The header and every row so far (after each row: a run cut short keeps its measurements)."""
    if JSON_PATH:
        with open(JSON_PATH, "w") as f:
            json.dump({"header": HEADER, "partial": partial, "rows": ROWS}, f, indent=1)

# --------------------------------------------------------------------------- measurement
_flush = None


def l2_flush() -> None:
    """Overwrite 256 MiB (more than any L2) with a uniquely named kernel, excluded from kernel_ms."""
    global _flush
    if SMOKE:
        return
    import triton
    import triton.language as tl

    if _flush is None:

        @triton.jit
        def _bench_l2_flush_kernel(P, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            tl.store(P + offs, tl.zeros([BLOCK], dtype=tl.int32), mask=offs < n)

        _flush = (torch.empty(64 << 20, dtype=torch.int32, device="cuda"), _bench_l2_flush_kernel)
    buf, kern = _flush
    kern[(triton.cdiv(buf.numel(), 4096),)](buf, buf.numel(), BLOCK=4096)


def clear(leaves) -> None:
    for t in leaves:
        t.grad = None


def wall_ms(fn, leaves) -> float:
    if SMOKE:
        times = []
        for _ in range(2):
            clear(leaves)
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=50, rep=300, grad_to_none=leaves or None, return_mode="median"))


def kernel_ms(fn, leaves, calls: int = 20) -> tuple[float | None, dict]:
    if SMOKE:
        return None, {}
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # compiles and caches outside the profile
        clear(leaves)
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            clear(leaves)
            l2_flush()
            fn()
        torch.cuda.synchronize()
    total = 0.0
    per_name: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and "l2_flush" not in e.name:
            us = e.time_range.elapsed_us()
            total += us
            per_name[e.name[:80]] += us
    breakdown = {k: round(v / calls / 1e3, 4) for k, v in sorted(per_name.items(), key=lambda kv: -kv[1])}
    return total / calls / 1e3, breakdown


def peak(fn, leaves) -> tuple[float | None, float | None]:
    if SMOKE:
        return None, None
    clear(leaves)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    top = torch.cuda.max_memory_allocated()
    clear(leaves)
    return top / 2**30, (top - before) / 2**30


def measure(op, kernel, preset, shape, dtype, pas, fn, leaves, flops=None, nbytes=None, note=""):
    row = {
        "op": op, "variant": "standard", "kernel": kernel, "preset": preset, "shape": shape,
        "dtype": str(dtype).removeprefix("torch."), "pass": pas, "wall_ms": None, "kernel_ms": None,
        "tbps": None, "tflops": None, "peak_gib": None, "extra_gib": None, "kernels": {}, "note": note,
    }
    try:
        row["wall_ms"] = wall_ms(fn, leaves)
        row["kernel_ms"], row["kernels"] = kernel_ms(fn, leaves)
        row["peak_gib"], row["extra_gib"] = peak(fn, leaves)
        t = row["kernel_ms"] or row["wall_ms"]
        if flops:
            row["tflops"] = flops / (t * 1e-3) / 1e12
        if nbytes:
            row["tbps"] = nbytes / (t * 1e-3) / 1e12
    except Exception as e:  # one failing implementation must not hide the others
        traceback.print_exc()
        row["note"] = (note + "; " if note else "") + f"ERROR {type(e).__name__}: {e}"[:300]
    finally:
        clear(leaves)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    ROWS.append(row)
    kms = "" if row["kernel_ms"] is None else f"{row['kernel_ms']:.3f}"
    rate = f"{row['tflops']:.0f} TFLOP/s" if row["tflops"] else (f"{row['tbps']:.2f} TB/s" if row["tbps"] else "")
    wall = "" if row["wall_ms"] is None else f"{row['wall_ms']:.3f}"
    print(f"{op:20s} {kernel:12s} {preset:14s} {pas:8s} wall {wall:>9s} ms  kernel {kms:>9s} ms  {rate:>14s}  "
          f"peak {row['peak_gib'] or 0:.2f} GiB  {row['note']}", flush=True)
    if kernel == "triton" and preset == "default" and row["kernels"]:
        # where the time goes (per call): the first thing to read when tuning
        for name, ms in list(row["kernels"].items())[:10]:
            print(f"{'':24s}{ms:9.4f} ms  {name}", flush=True)
    write_json(partial=True)
    return row


def matmul_ceiling() -> dict:
    if SMOKE:
        return {"matmul_bf16_tflops": None}
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = wall_ms(lambda: torch.matmul(a, b), [])
    return {"matmul_bf16_ms": ms, "matmul_bf16_tflops": 2 * n**3 / (ms * 1e-3) / 1e12,
            "matmul_note": "bf16 8192x8192x8192 torch.matmul, median of do_bench"}


def core(module):
    try:
        return importlib.import_module(f"veomni_ops.kernels.{module}")
    except Exception:
        return None


# --------------------------------------------------------------------------- MoE
def eager_loop(x, idx, w, gate_up, down):
    """transformers' Qwen3MoeExperts.forward (loop over the experts that are hit)."""
    num_experts = gate_up.shape[0]
    out = torch.zeros_like(x)
    with torch.no_grad():
        mask = F.one_hot(idx, num_classes=num_experts).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit:
        e = e[0]
        pos, tok = torch.where(mask[e])
        g, u = F.linear(x[tok], gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(g) * u, down[e]) * w[tok, pos, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


def sort_grouped_mm(x, idx, w, gate_up, down):
    """Sort routes by expert, gather, two torch._grouped_mm, scatter back, weighted sum over K."""
    t, k = idx.shape
    h = x.shape[1]
    num_experts = gate_up.shape[0]
    flat = idx.reshape(-1)
    sorted_e, order = torch.sort(flat, stable=True)
    offs = torch.searchsorted(sorted_e, torch.arange(num_experts, device=x.device), right=True, out_int32=True)
    xs = x[order // k]
    gu = torch._grouped_mm(xs, gate_up.transpose(1, 2), offs=offs)
    g, u = gu.chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(g) * u, down.transpose(1, 2), offs=offs)
    y = torch.empty_like(y).index_copy(0, order, y).view(t, k, h)
    return torch.bmm(w.to(y.dtype).unsqueeze(1), y).squeeze(1)


def moe_impls() -> dict:
    from veomni_triton.kernels.moe import moe_experts

    c = core("moe")
    impls = {"eager": c.moe_experts_eager if c is not None else eager_loop}
    if hasattr(torch, "_grouped_mm") and not SMOKE:
        impls["grouped_mm"] = c.moe_experts_grouped_mm if c is not None else sort_grouped_mm
    impls["triton"] = moe_experts
    return impls


def moe_presets() -> dict:
    from veomni_triton.kernels.moe import GemmConfig as G

    # the sm90 defaults are the first run's best ("wide_n"); these vary one or two kernels from there
    return {
        "first_table": dict(gate_up=G(128, 128, 64, 8, 3), down=G(128, 128, 64, 4, 4), dh=G(128, 64, 64, 8, 4),
                            dx=G(128, 128, 64, 4, 4), wgrad=G(128, 128, 64, 8, 3)),
        "wgrad_s4": dict(wgrad=G(128, 128, 64, 8, 4)),
        "wgrad_n256": dict(wgrad=G(128, 256, 64, 8, 3)),
        "gate_up_s3": dict(gate_up=G(128, 64, 64, 4, 3)),
        "dh_64": dict(dh=G(128, 64, 64, 8, 4)),
        "s4": dict(gate_up=G(128, 128, 64, 8, 4), wgrad=G(128, 128, 64, 8, 4), dh=G(128, 64, 64, 8, 3)),
        "bm64": dict(gate_up=G(64, 128, 64, 4, 4), down=G(64, 128, 64, 4, 4), dh=G(64, 64, 64, 4, 4),
                     dx=G(64, 128, 64, 4, 4)),
        "wide_n": dict(gate_up=G(128, 64, 64, 4, 4), down=G(128, 256, 64, 8, 3), dx=G(128, 256, 64, 8, 3),
                       dh=G(128, 128, 64, 8, 3)),
        "w8_k32": dict(down=G(128, 128, 64, 8, 4), dx=G(128, 128, 64, 8, 4), wgrad=G(128, 128, 32, 8, 4),
                       gate_up=G(128, 128, 32, 8, 4)),
        "wgrad_wide": dict(wgrad=G(128, 256, 64, 8, 3), dh=G(128, 64, 32, 4, 4)),
    }


def bench_moe(sweep: bool) -> None:
    from veomni_triton.kernels.moe import override_configs

    t, h, inter, e, k = pick((8192, 2048, 768, 128, 8), (64, 64, 48, 8, 4))
    dtype = torch.bfloat16
    dev = "cpu" if SMOKE else "cuda"
    shape = f"T={t} H={h} I={inter} E={e} K={k}"
    logits = torch.randn(t, e, device=dev)
    w, idx = torch.softmax(logits, -1).topk(k, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    x = torch.randn(t, h, device=dev, dtype=dtype)
    gate_up = (torch.randn(e, 2 * inter, h, device=dev) * h**-0.5).to(dtype)
    down = (torch.randn(e, h, inter, device=dev) * inter**-0.5).to(dtype)
    grad = torch.randn(t, h, device=dev, dtype=dtype)
    flops_fwd = 6 * t * k * h * inter
    leaves = [a.detach().requires_grad_() for a in (x, w, gate_up, down)]

    def fwd_of(fn):
        def run():
            with torch.no_grad():
                fn(x, idx, w, gate_up, down)
        return run

    def fwd_bwd_of(fn):
        def run():
            out = fn(leaves[0], idx, leaves[1], leaves[2], leaves[3])
            out.backward(grad)
        return run

    for name, fn in moe_impls().items():
        row = measure("moe_experts", name, "default", shape, dtype, "fwd", fwd_of(fn), [], flops=flops_fwd)
        if name == "eager" and (row["wall_ms"] is None or row["wall_ms"] > 1000):
            continue  # fwd+bwd only when the forward is under a second
        measure("moe_experts", name, "default", shape, dtype, "fwd+bwd", fwd_bwd_of(fn), leaves, flops=3 * flops_fwd)
    if sweep and not SMOKE:
        from veomni_triton.kernels.moe import moe_experts

        for preset, cfgs in moe_presets().items():
            with override_configs(**cfgs):
                note = "; ".join(f"{kind}={tuple(c.__dict__.values())}" for kind, c in cfgs.items())
                measure("moe_experts", "triton", preset, shape, dtype, "fwd+bwd", fwd_bwd_of(moe_experts), leaves,
                        flops=3 * flops_fwd, note=note)


def tune_candidates(G) -> dict:
    """Tile configurations tried per kernel by ``--tune`` (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)."""
    c = {
        "gate_up": [(128, 64, 64, 4, 3), (128, 64, 64, 8, 4), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4),
                    (128, 64, 128, 4, 3), (128, 64, 128, 8, 3), (64, 128, 64, 4, 4), (128, 32, 64, 4, 5),
                    (256, 64, 64, 8, 3)],
        "down": [(128, 256, 64, 8, 4), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4), (128, 256, 32, 8, 4),
                 (128, 128, 128, 8, 3), (256, 128, 64, 8, 3), (128, 256, 128, 8, 2), (64, 256, 64, 4, 4)],
        "dh": [(128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (128, 64, 64, 8, 4), (128, 128, 128, 8, 2),
               (128, 256, 64, 8, 3), (64, 128, 64, 4, 4), (128, 128, 32, 8, 5)],
        "wgrad": [(128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 128, 32, 8, 4), (128, 128, 128, 8, 2),
                  (128, 128, 128, 8, 3), (256, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4)],
    }
    c["dx"] = c["down"]
    c["wgrad_down"] = c["wgrad_gate_up"] = c.pop("wgrad")
    return {kind: [G(*v) for v in vals] for kind, vals in c.items()}


def tune_moe() -> None:
    """Each GEMM kernel of moe_experts alone, per candidate tile configuration (do_bench median).

    Inputs as in the benchmark (router-like routing); the backward kernels get the forward's
    saved tensors and a random output gradient. Prints per kernel the candidates from fastest
    to slowest, then the table the fastest ones make (``_TABLE_SM90`` in kernels/moe.py).
    """
    import triton
    import triton.testing
    from veomni_triton.kernels import moe as M

    t, h, inter, e, k = pick((8192, 2048, 768, 128, 8), (64, 64, 48, 8, 4))
    dtype = torch.bfloat16
    dev = "cpu" if SMOKE else "cuda"
    logits = torch.randn(t, e, device=dev)
    w, idx = torch.softmax(logits, -1).topk(k, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    x = torch.randn(t, h, device=dev, dtype=dtype)
    gate_up = (torch.randn(e, 2 * inter, h, device=dev) * h**-0.5).to(dtype)
    down = (torch.randn(e, h, inter, device=dev) * inter**-0.5).to(dtype)
    grad = torch.randn(t, h, device=dev, dtype=dtype)
    tk = t * k
    _out, gu, hw, perm, offs = M._moe_fwd(x, idx.contiguous(), w.contiguous(), gate_up, down, True)
    tiles = M._Tiles(offs, tk, e)
    dgu = (torch.randn(tk, 2 * inter, device=dev) * 0.1).to(dtype)
    gu2, hw2, dgu2 = torch.empty_like(gu), torch.empty_like(hw), torch.empty_like(dgu)
    rows_out = torch.empty(tk, h, device=dev, dtype=dtype)
    dd_w, dgu_w = torch.empty_like(down), torch.empty_like(gate_up)

    def dh(cfg):
        dwp = torch.empty((tk, triton.cdiv(inter, cfg.block_n)), device=dev, dtype=torch.float32)
        M._dh(grad, perm, w, down, tiles, gu, dgu2, dwp, k, cfg)

    launch = {
        "gate_up": (lambda cfg: M._gate_up(x, perm, w, gate_up, tiles, gu2, hw2, k, True, cfg), 2 * tk * h * 2 * inter),
        "down": (lambda cfg: M._grouped_scatter(hw, perm, tiles, down, rows_out, h, inter, down.stride(2),
                                                down.stride(1), cfg), 2 * tk * inter * h),
        "dh": (dh, 2 * tk * h * inter),
        "dx": (lambda cfg: M._grouped_scatter(dgu, perm, tiles, gate_up, rows_out, h, 2 * inter, gate_up.stride(1),
                                              gate_up.stride(2), cfg), 2 * tk * 2 * inter * h),
        "wgrad_down": (lambda cfg: M._wgrad(grad, True, hw, False, perm, offs, dd_w, k, cfg), 2 * tk * h * inter),
        "wgrad_gate_up": (lambda cfg: M._wgrad(dgu, False, x, True, perm, offs, dgu_w, k, cfg),
                          2 * tk * 2 * inter * h),
    }
    device = torch.device(dev)
    index = 0 if SMOKE else torch.cuda.current_device()
    budget = None if SMOKE else M._max_shared_mem(index) - 8192
    best: dict = {}
    for kind, cands in tune_candidates(M.GemmConfig).items():
        current = M._config(kind, device, dtype, tk / e)
        results = []
        for cfg in [current] + [c for c in cands if c != current]:
            tag = tuple(cfg.__dict__.values())
            if SMOKE:
                cfg = M._INTERPRET_TABLE["down"]
            elif M._smem_bytes(kind if kind == "gate_up" else "down", cfg, 2) > budget:
                results.append((float("inf"), tag, "shared memory"))
                continue
            fn, flops = launch[kind]
            try:
                fn(cfg)
                if SMOKE:
                    ms = wall_ms(lambda fn=fn, cfg=cfg: fn(cfg), [])
                else:
                    torch.cuda.synchronize()
                    ms = float(triton.testing.do_bench(lambda fn=fn, cfg=cfg: fn(cfg), warmup=25, rep=100,
                                                       return_mode="median"))
                results.append((ms, tag, f"{flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s"))
            except Exception as ex:  # out of resources etc.: next candidate
                results.append((float("inf"), tag, f"ERROR {type(ex).__name__}: {str(ex)[:120]}"))
            if SMOKE:
                break
        results.sort(key=lambda r: r[0])
        print(f"\n{kind} (current: {tuple(current.__dict__.values())})", flush=True)
        for ms, tag, note in results:
            mark = "  <- current" if tag == tuple(current.__dict__.values()) else ""
            print(f"  {ms:9.4f} ms  {str(tag):24s} {note}{mark}", flush=True)
            ROWS.append({"op": "moe_experts", "kernel": "triton", "preset": f"tune:{kind}", "pass": kind,
                         "shape": f"T={t} H={h} I={inter} E={e} K={k}", "dtype": "bfloat16", "config": tag,
                         "wall_ms": None if ms == float("inf") else ms, "kernel_ms": None, "note": note,
                         "kernels": {}, "tflops": None, "tbps": None})
        write_json(partial=True)
        best[kind] = results[0]
    print("\nfastest per kernel (a candidate _TABLE_SM90):", flush=True)
    saved = 0.0
    for kind, (ms, tag, note) in best.items():
        cur = next(r for r in ROWS if r.get("preset") == f"tune:{kind}" and r.get("config") == tuple(
            M._config(kind, device, dtype, tk / e).__dict__.values()))
        if cur["wall_ms"] is not None and ms != float("inf"):
            saved += cur["wall_ms"] - ms
        print(f'    "{kind}": GemmConfig{tag},  # {ms:.4f} ms, {note}', flush=True)
    print(f"sum of per-kernel savings vs the current table: {saved:.3f} ms per fwd+bwd", flush=True)


# --------------------------------------------------------------------------- load balancing
def lbl_impls() -> dict:
    from veomni_triton.kernels.load_balancing import load_balancing_loss

    impls = {}
    try:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

        impls["transformers"] = lambda lg, e, k, m: load_balancing_loss_func(tuple(lg), e, k, m)
    except Exception as ex:
        print(f"transformers not importable ({ex}); no transformers row", file=sys.stderr)
    c = core("load_balancing")
    if c is not None:
        impls["core_eager"] = c.load_balancing_loss
    impls["triton"] = load_balancing_loss
    return impls


def bench_lbl() -> None:
    layers, b, s, e, k = pick((48, 4, 2048, 128, 8), (3, 2, 19, 16, 4))
    dev = "cpu" if SMOKE else "cuda"
    dtype = torch.float32
    t = b * s
    logits = [torch.randn(t, e, device=dev, dtype=dtype) for _ in range(layers)]
    leaves = [x.detach().requires_grad_() for x in logits]
    mask = torch.ones(b, s, dtype=torch.long, device=dev)
    mask[:, -s // 8:] = 0
    elt = logits[0].element_size()
    fwd_bytes = layers * t * e * elt
    for masked in (False, True):
        m = mask if masked else None
        shape = f"L={layers} T={t} E={e} K={k}" + (" masked" if masked else "")
        for name, fn in lbl_impls().items():
            def fwd(fn=fn, m=m):
                with torch.no_grad():
                    fn(logits, e, k, m)

            def fwd_bwd(fn=fn, m=m):
                fn(leaves, e, k, m).backward()

            measure("load_balancing_loss", name, "default", shape, dtype, "fwd", fwd, [], nbytes=fwd_bytes)
            measure("load_balancing_loss", name, "default", shape, dtype, "fwd+bwd", fwd_bwd, leaves,
                    nbytes=3 * fwd_bytes)


def summary() -> None:
    def get(op, kernel, pas, preset="default"):
        for r in ROWS:
            if (r["op"], r["kernel"], r["pass"], r["preset"]) == (op, kernel, pas, preset) and r["wall_ms"]:
                return r
        return None

    print("\nspeedups (ours vs baseline; kernel time where measured, else wall):")
    for op, baselines in (("moe_experts", ("grouped_mm", "eager")), ("load_balancing_loss", ("transformers",))):
        for pas in ("fwd", "fwd+bwd"):
            ours = get(op, "triton", pas)
            for base in baselines:
                other = get(op, base, pas)
                if ours and other:
                    kx = (other["kernel_ms"] / ours["kernel_ms"]) if ours["kernel_ms"] and other["kernel_ms"] else None
                    wx = other["wall_ms"] / ours["wall_ms"]
                    print(f"  {op:20s} {pas:8s} vs {base:12s} wall x{wx:.2f}" + (f"  kernel x{kx:.2f}" if kx else ""))
    best = {}
    for r in ROWS:
        if r["op"] == "moe_experts" and r["kernel"] == "triton" and r["pass"] == "fwd+bwd" and r["kernels"]:
            for name, ms in r["kernels"].items():
                if name not in best or ms < best[name][0]:
                    best[name] = (ms, r["preset"])
    if best:
        print("\nfastest preset per kernel (moe fwd+bwd):")
        for name, (ms, preset) in sorted(best.items(), key=lambda kv: -kv[1][0]):
            print(f"  {ms:8.4f} ms  {preset:12s} {name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write header and rows as JSON to this path")
    ap.add_argument("--ops", default="moe,lbl")
    ap.add_argument("--no-sweep", action="store_true", help="skip the MoE tile-configuration presets")
    ap.add_argument("--tune", action="store_true",
                    help="instead of the benchmark: time each MoE GEMM kernel alone over candidate tile configurations")
    args = ap.parse_args()
    if not SMOKE and not torch.cuda.is_available():
        print("no CUDA device: this script measures the compiled kernels on a GPU", file=sys.stderr)
        return 2
    import triton

    global JSON_PATH
    JSON_PATH = args.json
    torch.manual_seed(0)
    header = HEADER
    header.update({
        "device": "cpu (smoke run)" if SMOKE else torch.cuda.get_device_name(),
        "torch": torch.__version__, "triton": triton.__version__,
        "flops": "moe fwd = 2*T*K*(2I*H + H*I) = 6*T*K*H*I; fwd+bwd = 3*fwd",
        "bytes": "load_balancing fwd = L*T*E*e (logits read once); fwd+bwd = 3*L*T*E*e",
        "timing": "wall: median do_bench(warmup=50, rep=300); kernel: torch.profiler sum of GPU kernels per call, "
                  "mean of 20 calls, L2 flushed before each",
    })
    header.update(matmul_ceiling())
    print(json.dumps(header, indent=1), flush=True)
    if args.tune:
        tune_moe()
        write_json(partial=False)
        return 0
    for op in args.ops.split(","):
        if op == "moe":
            bench_moe(sweep=not args.no_sweep)
        elif op == "lbl":
            bench_lbl()
        else:
            print(f"unknown op {op!r}", file=sys.stderr)
            return 2
    summary()
    write_json(partial=False)
    failed = [r for r in ROWS if "ERROR" in r["note"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
