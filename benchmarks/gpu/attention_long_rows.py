"""Attention at long rows on one GPU (issue 35): every attention path torch and the core offer,
at 8k-128k tokens a row, causal, GQA with Qwen3-30B-A3B's heads (32 query / 4 key-value heads of
128), bf16, batch 1; dense rows (one document) and packed rows (documents of mixed lengths).

Per kernel and row: forward + backward time (CUDA events; median of ``--reps`` after ``--warmup``
calls), TFLOP/s of the work the mask leaves (causal: half of the square; packed: each document's
causal triangle), against a bf16 matmul's measured TFLOP/s in the same process, and the peak memory
the call adds over its inputs. A kernel that fails (out of memory, unsupported) is a row with its
error. Usage (from the repository root, the core on the path):

    PYTHONPATH=core/src python benchmarks/gpu/attention_long_rows.py --json out.json

Kernels:
- ``sdpa``: the core's ``sdpa`` kernel (what ``attn_implementation: sdpa`` binds), sdpa's own
  backend choice; ``sdpa[flash|cudnn|efficient]``: the same with that sdpa backend forced.
- ``flex_attention``: the core's FlexAttention kernel (compiled; block mask from the packing).
- ``varlen``: torch's ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention's varlen kernel
  in torch), given ``cu_seq_lens``; the one path here that takes a packed row without a mask.
Packed rows reach the core's kernels as transformers passes them: ``position_ids`` restarting at
each document (``sdpa`` builds a dense ``[S, S]`` mask from them; FlexAttention a block mask).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

HQ, HKV, D = 32, 4, 128
ROWS = (8192, 16384, 32768, 65536, 131072)
#: Documents of a packed row: lognormal lengths around this median, within [64, row].
DOC_MEDIAN, DOC_SIGMA = 2048, 1.0


def doc_lengths(total: int, seed: int) -> list[int]:
    """Greedy packing of lognormal document lengths into one row of ``total`` tokens (the last
    document cut at the row's end), as a packing collator fills a row."""
    g = torch.Generator().manual_seed(seed)
    out: list[int] = []
    left = total
    while left > 0:
        n = int(math.exp(math.log(DOC_MEDIAN) + DOC_SIGMA * torch.randn(1, generator=g).item()))
        n = max(64, min(n, total))
        out.append(min(n, left))
        left -= out[-1]
    return out


def flops(lengths: list[int]) -> float:
    """Forward + backward FLOPs of causal attention over these documents (the backward: 2.5 forwards)."""
    return sum(4.0 * HQ * n * n * D / 2 for n in lengths) * 3.5


class Module(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim, self.is_causal, self.scaling, self.layer_idx = D, True, D**-0.5, 0


def timed(fn: Callable[[], None], warmup: int, reps: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return times


def matmul_ceiling() -> float:
    """bf16 matmul TFLOP/s (8192^3), the device's measured ceiling for this table."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = statistics.median(timed(lambda: a @ b, 5, 20))
    return 2 * 8192**3 / (ms / 1e3) / 1e12


def varlen_call() -> Callable[..., torch.Tensor] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters

    def call(q, k, v, cu, max_len):  # q [T, Hq, D], k/v [T, Hkv, D]
        kw: dict[str, Any] = {"scale": D**-0.5}
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            k, v = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
        if "is_causal" in params:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)

    return call


def row_cases(s: int, layout: str, lengths: list[int], varlen: Callable[..., torch.Tensor] | None
              ) -> dict[str, Callable[[], None]]:
    """Forward + backward of each kernel on one row's fresh inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from veomni_ops.ops.attention.kernel import flex_attention_kernel, sdpa_attention

    dev = torch.device("cuda")
    mod = Module()
    g = torch.Generator(device=dev).manual_seed(s)
    q = torch.randn(1, s, HQ, D, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(1, s, HKV, D, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(1, s, HKV, D, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    grad = torch.randn(1, s, HQ, D, device=dev, dtype=torch.bfloat16, generator=g)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=dev, dtype=torch.int32)
    pos = torch.cat([torch.arange(n, device=dev) for n in lengths])[None]
    kw: dict[str, Any] = {} if layout == "dense" else {"position_ids": pos}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}

    def core(fn: Callable[..., Any], extra: dict[str, Any] = kw, backend: str | None = None) -> Callable[[], None]:
        def step() -> None:
            q.grad = k.grad = v.grad = None
            with sdpa_kernel([backends[backend]]) if backend else contextlib.nullcontext():
                out, _ = fn(mod, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None,
                            scaling=D**-0.5, **extra)
                out.backward(grad)
        return step

    cases = {"sdpa": core(sdpa_attention)}
    if layout == "dense":
        cases.update({f"sdpa[{b}]": core(sdpa_attention, backend=b) for b in backends})
    cases["flex_attention"] = core(flex_attention_kernel)
    if layout == "packed":
        longest = max(lengths)
        cases["flex_attention (cu_seq_lens)"] = core(
            flex_attention_kernel, {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest,
                                    "max_length_k": longest})
    if varlen is not None:
        def vstep() -> None:
            q.grad = k.grad = v.grad = None
            varlen(q[0], k[0], v[0], cu, max(lengths)).backward(grad[0])
        cases["varlen"] = vstep
    return cases


def measure(fn: Callable[[], None], lengths: list[int], ceiling: float, warmup: int, reps: int) -> dict[str, Any]:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.time()
    row: dict[str, Any] = {}
    try:
        ms = timed(fn, warmup, reps)
        med = statistics.median(ms)
        quart = statistics.quantiles(ms, n=4)
        row.update(ms=med, p25=quart[0], p75=quart[2], tflops=flops(lengths) / (med / 1e3) / 1e12,
                   peak_extra_gib=(torch.cuda.max_memory_allocated() - base) / 2**30)
        row["of_ceiling"] = row["tflops"] / ceiling
    except Exception as e:  # out of memory, an unsupported backend: a row with the error
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    row["wall_s"] = round(time.time() - t0, 1)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="*", default=list(ROWS))
    p.add_argument("--layouts", nargs="*", choices=("dense", "packed"), default=["dense", "packed"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", help="write the results here (and a .md beside it)")
    args = p.parse_args()
    varlen = varlen_call()
    ceiling = matmul_ceiling()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; bf16 matmul ceiling {ceiling:.0f} TFLOP/s; "
          f"varlen_attn {'found' if varlen else 'not in this torch'}", flush=True)
    rows: list[dict[str, Any]] = []
    for s in args.rows:
        for layout in args.layouts:
            lengths = [s] if layout == "dense" else doc_lengths(s, seed=s)
            for name, fn in row_cases(s, layout, lengths, varlen).items():
                row: dict[str, Any] = {"row": s, "layout": layout, "documents": len(lengths), "kernel": name}
                row.update(measure(fn, lengths, ceiling, args.warmup, args.reps))
                rows.append(row)
                print(row, flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
              "shape": {"batch": 1, "q_heads": HQ, "kv_heads": HKV, "head_dim": D, "dtype": "bfloat16",
                        "causal": True, "doc_median": DOC_MEDIAN, "doc_sigma": DOC_SIGMA},
              "matmul_ceiling_tflops": ceiling, "warmup": args.warmup, "reps": args.reps, "rows": rows}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
        with open(args.json.removesuffix(".json") + ".md", "w") as fh:
            fh.write(render(result))
    print(render(result))


def render(result: dict[str, Any]) -> str:
    lines = [f"# Attention at long rows: {result['device']}, torch {result['torch']}", "",
             f"Batch 1, {HQ} query / {HKV} key-value heads of {D}, bf16, causal; packed rows: lognormal documents "
             f"(median {DOC_MEDIAN}, sigma {DOC_SIGMA}). Forward + backward, median ms of {result['reps']} after "
             f"{result['warmup']} warm-up calls (p25..p75); TFLOP/s of the unmasked work, and its share of the bf16 "
             f"matmul ceiling measured in the same process ({result['matmul_ceiling_tflops']:.0f} TFLOP/s); "
             "peak: memory the call adds over its inputs.", "",
             "| row | layout | docs | kernel | ms (p25..p75) | TFLOP/s | of ceiling | peak GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['row']} | {r['layout']} | {r['documents']} | {r['kernel']} | {r['error']} | | | |")
        else:
            lines.append(f"| {r['row']} | {r['layout']} | {r['documents']} | {r['kernel']} | {r['ms']:.2f} "
                         f"({r['p25']:.2f}..{r['p75']:.2f}) | {r['tflops']:.0f} | {r['of_ceiling']:.0%} | "
                         f"{r['peak_extra_gib']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
