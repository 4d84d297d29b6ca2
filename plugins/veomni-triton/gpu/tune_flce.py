"""Fused linear cross-entropy on a CUDA GPU: our Triton kernel's chunk sweep beside its peers.

    python plugins/veomni-triton/gpu/tune_flce.py --tokens 8192 16384 32768 --json out.json

Shapes: hidden 2560, vocabulary 151,936 (Qwen), bf16, forward + backward of the summed loss
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
skip no gradient tile. This is the kernel-specific tuning sweep; `veomni-ops bench --preset
flce-16k` is the project's benchmark of every usable kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

H, V = 2560, 151936
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

    out["triton (default chunk)"] = fused_linear_cross_entropy_sum
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


def main() -> None:
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
    a = p.parse_args()
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
                       "H": H, "V": V, "dtype": "bfloat16", "logits": a.logits, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
