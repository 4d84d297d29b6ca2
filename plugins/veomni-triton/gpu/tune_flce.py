"""Fused linear cross-entropy on a CUDA GPU: our Triton kernel's chunk sweep beside its peers.

    python plugins/veomni-triton/gpu/tune_flce.py --tokens 8192 16384 32768 --json out.json

Shapes: hidden 2560 (``--hidden``), vocabulary 151,936 (Qwen), bf16, forward + backward of the summed loss
(gradients for hidden and weight). Each row: median of ``--reps`` timed calls after
``--warmup`` (CUDA events around the call, so launch gaps count), and the peak memory beyond the
inputs and their gradients (``max_memory_allocated`` during one call, minus the inputs and the
bytes of the two gradients). ``% ceiling`` is 6·T·H·V FLOPs (three GEMMs) over the time,
against a bf16 matmul ceiling measured in the same run. Peers run only where installed:
Liger (``liger-kernel``, called as its users call it, and through veomni-liger's adapter),
Cut Cross-Entropy (``cut-cross-entropy``, default gradient filter and ``filter_eps=None``).
Inputs (``--logits``): ``peaked`` by default, the logits of the bench's ``flce-*`` presets
(the logit of id v is -ln(v + 1) + N(0, 1), from a constant hidden feature whose weight column
is -ln(v + 1): ``veomni_ops.testing.cases.cross_entropy.peaked_linear``); ``dense`` the former
inputs (randn hidden states, a randn weight of scale 2/sqrt(H)), on which Cut Cross-Entropy can
skip no gradient tile. ``--errors T...``: instead of timing (or before it, with ``--tokens``), each
implementation's loss, dH and dW against a float64 reference from the same bf16 inputs, beside
eager's (Cut Cross-Entropy's filter drops the tiles it skips; this shows what that costs). This is the kernel-specific tuning sweep; `veomni-ops bench --preset
flce-16k` is the project's benchmark of every usable kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

H, V = 2560, 151936  # H: --hidden (2560 the bench presets'; 1024 the small step jobs', 2048 Qwen3-30B-A3B's)
GiB = 2**30


def event_times(fn, reps: int) -> list[float]:
    """Milliseconds of ``reps`` calls of ``fn``, each between its own CUDA events."""
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return times


def matmul_ceiling(reps: int = 20) -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    return 2 * 8192**3 / (statistics.median(event_times(lambda: a @ b, reps)) * 1e-3) / 1e12


def impls(chunks: list[int]) -> dict:
    out = {}

    def eager(h, w, y):
        return F.cross_entropy(F.linear(h, w).float(), y, reduction="sum")

    out["eager"] = eager
    from veomni_ops.kernels.cross_entropy import chunked_fused_linear_cross_entropy_sum

    out["core chunked"] = chunked_fused_linear_cross_entropy_sum
    from veomni_triton.kernels.cross_entropy import fused_linear_cross_entropy_sum

    out["triton (default chunk)"] = fused_linear_cross_entropy_sum  # VEOMNI_TRITON_FLCE_CHUNK_MIB, else the default
    for c in chunks:
        out[f"triton chunk {c}"] = lambda h, w, y, c=c: fused_linear_cross_entropy_sum(h, w, y, chunk_size=c)
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss(reduction="sum")
        out["liger direct"] = lambda h, w, y: liger(w, h, y)
        from veomni_liger.kernels.cross_entropy import fused_linear_cross_entropy_sum as liger_adapter

        out["veomni-liger"] = liger_adapter
    except ImportError as e:
        print(f"liger not measured: {e}")
    try:
        from cut_cross_entropy import linear_cross_entropy

        out["cce (default filter)"] = lambda h, w, y: linear_cross_entropy(h, w, y, reduction="sum")
        out["cce (filter_eps=None)"] = lambda h, w, y: linear_cross_entropy(h, w, y, reduction="sum",
                                                                            filter_eps=None)
    except ImportError as e:
        print(f"cut-cross-entropy not measured: {e}")
    return out


def inputs(tokens: int, logits: str, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 hidden states [tokens, H] and weight [V, H] whose logits are ``peaked`` or ``dense``."""
    torch.manual_seed(0)
    if logits == "peaked":
        from veomni_ops.testing.cases.cross_entropy import peaked_linear

        def gauss(*shape):
            return torch.randn(shape, device=device)

        h, w = (t.to(torch.bfloat16) for t in peaked_linear(gauss, tokens, H, V))
    elif logits == "dense":
        h = torch.randn(tokens, H, device=device, dtype=torch.bfloat16)
        w = (torch.randn(V, H, device=device) * (2.0 / H**0.5)).to(torch.bfloat16)
    else:
        raise ValueError(f"--logits must be peaked or dense, got {logits!r}")
    return h.requires_grad_(), w.requires_grad_()


def measure(fn, tokens: int, warmup: int, reps: int, logits: str = "peaked") -> dict:
    h, w = inputs(tokens, logits)
    y = torch.randint(0, V, (tokens,), device="cuda")
    y[::7] = -100

    def call():
        h.grad = w.grad = None
        loss = fn(h, w, y)
        loss.backward()
        return loss

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    h.grad = w.grad = None
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = call()
    torch.cuda.synchronize()
    grads = h.numel() * 2 + w.numel() * 2
    extra = (torch.cuda.max_memory_allocated() - base - grads) / GiB
    times = event_times(call, reps)
    return {"ms": statistics.median(times), "ms_min": min(times), "ms_max": max(times), "extra_gib": extra,
            "loss": float(loss.detach())}


def phases(chunk: int, reps: int = 10) -> None:
    """Each step of one chunk alone (median of ``reps``): where the time of a chunk goes."""
    from veomni_ops.kernels.cross_entropy import add_weight_grad_
    from veomni_triton.kernels.cross_entropy import _row_pass

    h = torch.randn(chunk, H, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(V, H, device="cuda") * (2.0 / H**0.5)).to(torch.bfloat16)
    y = torch.randint(0, V, (chunk,), device="cuda")
    z = h @ w.t()
    loss_rows = torch.empty(chunk, device="cuda")
    acc = torch.zeros(V, H, device="cuda")
    gh = torch.empty_like(h)
    gemm = 2 * chunk * H * V
    steps = {
        "logits GEMM": (lambda: torch.mm(h, w.t(), out=z), gemm, None),
        "row pass (lse + grad)": (lambda: _row_pass(z, y, loss_rows, -100, True, 0), None, 3 * z.numel() * 2),
        "row pass (lse only)": (lambda: _row_pass(z, y, loss_rows, -100, False, 0), None, z.numel() * 2),
        "dH GEMM": (lambda: torch.mm(z, w, out=gh), gemm, None),
        "dW GEMM, fp32 acc in place": (lambda: add_weight_grad_(acc, z, h), gemm, None),
        "dW GEMM, bf16 out": (lambda: torch.mm(z.t(), h), gemm, None),
    }
    print(f"\nphases of one chunk of {chunk} tokens (median of {reps}):")
    for name, (fn, flops, nbytes) in steps.items():
        for _ in range(2):
            fn()
        ms = statistics.median(event_times(fn, reps))
        rate = f"{flops / ms / 1e9:.0f} TFLOP/s" if flops else f"{nbytes / ms / 1e9:.2f} TB/s of logits read + written"
        print(f"  {name:30s} {ms:8.3f} ms  {rate}")


def reference64(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, chunk: int = 2048):
    """float64 loss, dH and dW of ``sum CE(h @ w.T, y)`` from the bf16 inputs, in token chunks."""
    h64, w64 = h.detach().double(), w.detach().double()
    loss = torch.zeros((), dtype=torch.float64, device=h.device)
    dh, dw = torch.empty_like(h64), torch.zeros_like(w64)
    for s in range(0, h.shape[0], chunk):
        z = h64[s:s + chunk] @ w64.t()
        yc = y[s:s + chunk]
        keep = yc != -100
        loss += torch.nn.functional.cross_entropy(z, yc, reduction="sum")
        g = z.softmax(-1)
        del z
        rows = torch.nonzero(keep).squeeze(1)
        g[rows, yc[rows]] -= 1.0
        g[~keep] = 0.0
        dh[s:s + chunk] = g @ w64
        dw += g.t() @ h64[s:s + chunk]
        del g
    return loss, dh, dw


def errors(tokens: int, chunks: list[int], logits: str, only: list[str] | None) -> list[dict]:
    """Each implementation's loss, dH and dW against float64 (the same bf16 inputs), beside eager's:
    the relative norm of the difference and its largest entry over the reference's largest."""
    h, w = inputs(tokens, logits)
    y = torch.randint(0, V, (tokens,), device="cuda")
    y[::7] = -100
    ref_loss, ref_dh, ref_dw = reference64(h, w, y)
    print(f"\nerrors against float64, {tokens} tokens, H {H}, V {V}, {logits} logits "
          f"(norm: |a - ref| / |ref|; max: max|a - ref| / max|ref|)")
    out = []
    for name, fn in impls(chunks).items():
        if only and not any(s_ in name for s_ in only):
            continue
        h.grad = w.grad = None
        try:
            loss = fn(h, w, y)
            loss.backward()
        except Exception as e:  # a peer that fails is a row that says so
            out.append({"name": name, "tokens": tokens, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            print(f"  {name:26s} {out[-1]['error']}")
            continue
        r: dict = {"name": name, "tokens": tokens,
                   "loss_rel": float(abs(float(loss.detach()) - float(ref_loss)) / abs(float(ref_loss)))}
        for what, got, ref in (("dH", h.grad, ref_dh), ("dW", w.grad, ref_dw)):
            d = got.double() - ref
            r[f"{what}_norm"] = float(d.norm() / ref.norm())
            r[f"{what}_max"] = float(d.abs().max() / ref.abs().max())
            del d
        print(f"  {name:26s} loss {r['loss_rel']:.2e}  dH norm {r['dH_norm']:.2e} max {r['dH_max']:.2e}  "
              f"dW norm {r['dW_norm']:.2e} max {r['dW_max']:.2e}")
        out.append(r)
    h.grad = w.grad = None
    return out


def main() -> None:
    global H
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="*", default=[8192, 16384, 32768])
    p.add_argument("--chunks", type=int, nargs="*", default=[1024, 2048, 4096, 8192])
    p.add_argument("--only", nargs="*", default=None, help="substrings of implementation names to run")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--phases", type=int, nargs="*", default=[], help="time each step of one chunk of N tokens")
    p.add_argument("--logits", choices=("peaked", "dense"), default="peaked",
                   help="how the inputs' logits are distributed (see the module docstring)")
    p.add_argument("--hidden", type=int, default=H, help="hidden size H (vocabulary: Qwen's 151,936)")
    p.add_argument("--errors", type=int, nargs="*", default=[],
                   help="token counts at which to measure each implementation's error against float64 (no timing)")
    a = p.parse_args()
    H = a.hidden
    err_rows = [r for t in a.errors for r in errors(t, a.chunks, a.logits, a.only)]
    if a.errors and not a.tokens:
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "H": H, "V": V,
                           "dtype": "bfloat16", "logits": a.logits, "errors": err_rows}, f, indent=1)
        return
    for c in a.phases:
        phases(c)
    if a.phases and not a.tokens:
        return
    ceiling = matmul_ceiling()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; bf16 matmul ceiling {ceiling:.0f} TFLOP/s")
    rows = []
    table = impls(a.chunks)
    for t in a.tokens:
        floor = 6 * t * H * V / (ceiling * 1e12) * 1e3
        print(f"\n{t} tokens, H {H}, V {V}: floor (3 GEMMs at the ceiling) {floor:.1f} ms")
        for name, fn in table.items():
            if a.only and not any(s in name for s in a.only):
                continue
            if name == "eager" and t > 32768:
                continue
            try:
                r = measure(fn, t, a.warmup, a.reps, a.logits)
            except Exception as e:  # a peer that fails is a row that says so
                r = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                torch.cuda.empty_cache()
            r.update(name=name, tokens=t, floor_ms=floor)
            if "ms" in r:
                r["pct_ceiling"] = 100 * floor / r["ms"]
                print(f"  {name:26s} {r['ms']:8.2f} ms (min {r['ms_min']:.2f}, max {r['ms_max']:.2f})  "
                      f"{r['pct_ceiling']:5.1f}% of ceiling  +{r['extra_gib']:.3f} GiB  loss {r['loss']:.6g}")
            else:
                print(f"  {name:26s} {r['error']}")
            rows.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceiling_tflops": ceiling,
                       "H": H, "V": V, "dtype": "bfloat16", "logits": a.logits, "rows": rows,
                       "errors": err_rows}, f, indent=1)


if __name__ == "__main__":
    main()
