"""``veomni-ops bench``: every usable kernel of each op against eager, at named shapes.

    veomni-ops bench                                   default presets for this device
    veomni-ops bench --preset seed --op rms_norm       one preset, one op
    veomni-ops bench --json                            also write benchmarks/results/<device>-<date>.json (+ .md)
    veomni-ops bench --json out.json --plot out.png    chosen paths; the chart needs matplotlib
    veomni-ops bench --from out.json --plot out.png    re-render a saved result (no run)

What is measured, per preset workload, kernel and pass (``fwd``: forward on inputs that do
not require grad; ``fwd+bwd``: forward, then the gradients of every differentiable input
for a fixed random cotangent):

* wall time per call: median of many calls after warm-up. On CUDA as
  ``triton.testing.do_bench`` does it — each call between its own CUDA events, the L2
  cache flushed (a 256 MiB write) before each, warm-up 50 ms and repeats 300 ms by default;
  on the CPU ``time.perf_counter`` around each call.
* kernel time per call (CUDA): the sum of the durations of all device kernels (and
  copies) ``torch.profiler`` records over 20 calls, divided by 20. Wall minus kernel time
  is launch, Python and autograd overhead.
* achieved rate from the op's minimal traffic or work (see :data:`FORMULAS` and
  ``benchmarks/README.md``), against the device's ceilings measured in the same run:
  device-to-device copy (bytes read + written) and a dense matmul (bf16 8192³ on CUDA,
  fp32 on the CPU).
* peak memory (CUDA): ``torch.cuda.max_memory_allocated`` over one call, inputs included.

Module-level imports stay light: the CLI imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .spec import OPS

PASSES = ("fwd", "fwd+bwd")
GIB = 2**30


# --------------------------------------------------------------------------- workloads
@dataclass(frozen=True)
class Workload:
    """One op at one shape and dtype. ``build(device)`` returns the harness inputs (see
    :mod:`veomni_ops.testing.cases`); ``diff`` the differentiable ones; ``metric`` is
    ``"bytes"`` or ``"flops"`` and ``amount(pass)`` its minimal amount for that pass."""

    preset: str
    op: str
    variant: str
    dtype: str
    shape: dict[str, int]
    metric: str
    formula: str  # the op's formula key in FORMULAS

    def amount(self, pass_: str) -> float:
        return FORMULAS[self.formula][1](self.shape, _itemsize(self.dtype), pass_ == "fwd+bwd")


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}[dtype]


def _rms_bytes(sh, s, bwd):
    n, h = sh["tokens"], sh["hidden"]
    return (5 * n * h + 3 * h) * s if bwd else (2 * n * h + h) * s


def _swiglu_bytes(sh, s, bwd):
    n, i = sh["tokens"], sh["intermediate"]
    return (8 if bwd else 3) * n * i * s


def _rotary_bytes(sh, s, bwd):
    b, hq, hk, seq, d, r = sh["batch"], sh["q_heads"], sh["kv_heads"], sh["seq"], sh["head_dim"], sh["rotary_dim"]
    qk = b * (hq + hk) * seq * d
    cs = b * seq * r
    return ((4 if bwd else 2) * qk + (4 if bwd else 2) * cs) * s


def _ce_bytes(sh, s, bwd):
    n, v = sh["tokens"], sh["vocab"]
    return (2 if bwd else 1) * n * v * s + n * 8


def _flce_flops(sh, s, bwd):
    return (6 if bwd else 2) * sh["tokens"] * sh["hidden"] * sh["vocab"]


def _moe_flops(sh, s, bwd):
    return (18 if bwd else 6) * sh["tokens"] * sh["top_k"] * sh["hidden"] * sh["intermediate"]


def _lbl_bytes(sh, s, bwd):
    return (3 if bwd else 1) * sh["layers"] * sh["tokens"] * sh["experts"] * s


def _attn_flops(sh, s, bwd):
    f = 4 * sh["batch"] * sh["q_heads"] * sh["seq"] * sh["seq"] * sh["head_dim"]
    if sh.get("causal", 1):
        f /= 2
    return f * (3.5 if bwd else 1.0)


#: op formula -> (text, function(shape, itemsize, backward) -> bytes or FLOPs). s = bytes per element.
FORMULAS: dict[str, tuple[str, Callable[[dict, int, bool], float]]] = {
    "rms_norm": ("fwd (2·N·H + H)·s: read x, w, write y; fwd+bwd (5·N·H + 3·H)·s: backward reads x, w, dy, "
                 "writes dx, dw", _rms_bytes),
    "swiglu": ("fwd 3·N·I·s: read gate, up, write out; fwd+bwd 8·N·I·s: backward reads gate, up, dout, "
               "writes dgate, dup", _swiglu_bytes),
    "rotary": ("fwd 2·(Q+K)·s + 2·C·s: read q, k, cos, sin, write q', k'; fwd+bwd twice that (backward reads "
               "dq', dk', cos, sin, writes dq, dk); Q = B·Hq·S·D, K = B·Hk·S·D, C = B·S·R", _rotary_bytes),
    "cross_entropy/logits": ("fwd N·V·s: read the logits once; fwd+bwd 2·N·V·s: read logits, write their "
                             "gradient (+ 8·N for the labels)", _ce_bytes),
    "cross_entropy/fused_linear": ("FLOPs: fwd 2·N·H·V (logits GEMM); fwd+bwd 6·N·H·V (plus the two gradient "
                                   "GEMMs)", _flce_flops),
    "moe_experts": ("FLOPs: fwd 6·T·K·H·I (gate_up 4·H·I and down 2·H·I per route); fwd+bwd 3x", _moe_flops),
    "load_balancing_loss": ("fwd L·T·E·s: read every layer's router logits; fwd+bwd 3·L·T·E·s (read again, "
                            "write the gradient)", _lbl_bytes),
    "attention": ("FLOPs: fwd 4·B·Hq·S²·D (halved when causal); fwd+bwd 3.5x fwd (backward = 2.5 forwards)",
                  _attn_flops),
}


def _w(preset, op, variant, dtype, metric, formula=None, **shape) -> Workload:
    return Workload(preset, op, variant, dtype, dict(shape), metric, formula or op)


def _seed(p: str) -> list[Workload]:
    bf = "bfloat16"
    rope = dict(batch=4, q_heads=32, kv_heads=8, seq=2048, head_dim=128)
    return [
        _w(p, "rms_norm", "standard", bf, "bytes", tokens=8192, hidden=2560),
        _w(p, "rms_norm", "offset", bf, "bytes", tokens=8192, hidden=2560),
        _w(p, "swiglu", "standard", bf, "bytes", tokens=8192, intermediate=6912),
        _w(p, "rotary", "full", bf, "bytes", rotary_dim=128, **rope),
        _w(p, "rotary", "partial", bf, "bytes", rotary_dim=64, **rope),
    ]


def _flce(p: str, tokens: int) -> list[Workload]:
    bf = "bfloat16"
    return [
        _w(p, "cross_entropy", "fused_linear", bf, "flops", "cross_entropy/fused_linear",
           tokens=tokens, hidden=2560, vocab=151936),
        _w(p, "cross_entropy", "logits", bf, "bytes", "cross_entropy/logits", tokens=tokens, vocab=151936),
    ]


def _cpu_small(p: str) -> list[Workload]:
    f32, bf = "float32", "bfloat16"
    return [
        _w(p, "rms_norm", "standard", f32, "bytes", tokens=256, hidden=512),
        _w(p, "rms_norm", "offset", f32, "bytes", tokens=256, hidden=512),
        _w(p, "swiglu", "standard", f32, "bytes", tokens=256, intermediate=1024),
        _w(p, "rotary", "full", f32, "bytes", batch=1, q_heads=4, kv_heads=2, seq=128, head_dim=64, rotary_dim=64),
        _w(p, "rotary", "partial", f32, "bytes", batch=1, q_heads=4, kv_heads=2, seq=128, head_dim=64,
           rotary_dim=16),
        _w(p, "cross_entropy", "logits", f32, "bytes", "cross_entropy/logits", tokens=256, vocab=4096),
        _w(p, "cross_entropy", "fused_linear", f32, "flops", "cross_entropy/fused_linear",
           tokens=256, hidden=256, vocab=4096),
        # bfloat16: the dtype MoE kernels train in (grouped_mm takes only bfloat16)
        _w(p, "moe_experts", "standard", bf, "flops", tokens=128, experts=8, top_k=2, hidden=256, intermediate=128),
        _w(p, "load_balancing_loss", "standard", f32, "bytes", layers=4, tokens=512, experts=16, top_k=2),
        _w(p, "attention", "standard", f32, "flops", batch=1, q_heads=4, kv_heads=2, seq=256, head_dim=64, causal=1),
    ]


#: preset name -> (description, workloads)
PRESETS: dict[str, tuple[str, Callable[[str], list[Workload]]]] = {
    "seed": ("the seed benchmark: batch 4 x seq 2048 tokens, hidden 2560, intermediate 6912; RoPE 32 q / 8 kv "
             "heads, head dim 128 (partial: 64 rotary channels); bf16", _seed),
    "moe-30b-a3b": ("Qwen3-30B-A3B-like experts: 128 experts, top-8, hidden 2048, expert intermediate 768, 8192 "
                    "tokens; bf16",
                    lambda p: [_w(p, "moe_experts", "standard", "bfloat16", "flops", tokens=8192, experts=128,
                                  top_k=8, hidden=2048, intermediate=768)]),
    "flce-8k": ("cross-entropy, 8192 tokens, hidden 2560, vocabulary 151936 (Qwen); fused linear and from logits; "
                "bf16", lambda p: _flce(p, 8192)),
    "flce-16k": ("cross-entropy, 16384 tokens, hidden 2560, vocabulary 151936; bf16", lambda p: _flce(p, 16384)),
    "flce-32k": ("cross-entropy, 32768 tokens, hidden 2560, vocabulary 151936; bf16", lambda p: _flce(p, 32768)),
    "lbl-48": ("load-balancing loss: 48 layers x 8192 tokens x 128 experts, top-8, fp32 router logits",
               lambda p: [_w(p, "load_balancing_loss", "standard", "float32", "bytes", layers=48, tokens=8192,
                             experts=128, top_k=8)]),
    "attn": ("attention: batch 4, seq 4096, 32 q / 8 kv heads, head dim 128, causal, model layout; bf16",
             lambda p: [_w(p, "attention", "standard", "bfloat16", "flops", batch=4, q_heads=32, kv_heads=8,
                           seq=4096, head_dim=128, causal=1)]),
    "cpu-small": ("every op at small shapes (runs anywhere; the default on the CPU)", _cpu_small),
}
GPU_DEFAULT = ("seed", "moe-30b-a3b", "flce-8k", "flce-16k", "flce-32k", "lbl-48", "attn")
CPU_DEFAULT = ("cpu-small",)


def workloads(presets: Sequence[str], op: str | None = None) -> list[Workload]:
    out = []
    for name in presets:
        if name not in PRESETS:
            raise SystemExit(f"veomni-ops bench: unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        out += [w for w in PRESETS[name][1](name) if op is None or w.op == op]
    return out


def build_inputs(w: Workload, device: Any, seed: int = 0) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Inputs for ``w`` in the form the conformance harness calls kernels with."""
    import torch

    from .testing.cases import TORCH_DTYPES, AttentionModule, Builder, _cos_sin, _router_logits

    b = Builder(seed, TORCH_DTYPES[w.dtype], device)
    sh = w.shape
    dev = torch.device(device)

    g = torch.Generator(device=dev).manual_seed(seed)

    def randn(*shape, scale=1.0, dtype=None):
        # Generated on the device: float64 on the CPU (as the conformance kit does) is far too slow here.
        return (torch.randn(shape, generator=g, device=dev, dtype=torch.float32) * scale).to(dtype or b.dtype)

    if w.op == "rms_norm":
        shift = 1.0 if w.variant == "standard" else 0.0
        return {"hidden_states": randn(sh["tokens"], sh["hidden"]),
                "weight": randn(sh["hidden"], scale=0.1) + shift, "eps": 1e-6}, ("hidden_states", "weight")
    if w.op == "swiglu":
        return {"gate": randn(sh["tokens"], sh["intermediate"]), "up": randn(sh["tokens"], sh["intermediate"])}, \
            ("gate", "up")
    if w.op == "rotary":
        bsz, s, d = sh["batch"], sh["seq"], sh["head_dim"]
        # the model layout: [B, S, H, D] projections viewed as [B, H, S, D]
        q = randn(bsz, s, sh["q_heads"], d).transpose(1, 2)
        k = randn(bsz, s, sh["kv_heads"], d).transpose(1, 2)
        cos, sin = _cos_sin(b, bsz, s, sh["rotary_dim"])
        return {"q": q, "k": k, "cos": cos, "sin": sin}, ("q", "k")
    if w.op == "cross_entropy":
        n, v = sh["tokens"], sh["vocab"]
        labels = torch.randint(0, v, (n,), generator=g, device=dev)
        labels[::7] = -100  # some tokens do not count, as with padding / prompts
        if w.variant == "logits":
            return {"logits": randn(n, v, scale=2.0), "labels": labels, "ignore_index": -100}, ("logits",)
        h = sh["hidden"]
        return {"hidden": randn(n, h), "weight": randn(v, h, scale=2.0 / math.sqrt(h)), "labels": labels,
                "ignore_index": -100, "bias": None}, ("hidden", "weight")
    if w.op == "moe_experts":
        t, e, k, h, i = sh["tokens"], sh["experts"], sh["top_k"], sh["hidden"], sh["intermediate"]
        logits = torch.randn(t, e, generator=g, device=dev)
        top_w, top_i = torch.topk(logits.softmax(-1), k, dim=-1)
        top_w = (top_w / top_w.sum(-1, keepdim=True)).to(b.dtype)
        return {"hidden_states": randn(t, h), "top_k_index": top_i, "top_k_weights": top_w,
                "gate_up_proj": randn(e, 2 * i, h, scale=1 / math.sqrt(h)),
                "down_proj": randn(e, h, i, scale=1 / math.sqrt(i))}, \
            ("hidden_states", "top_k_weights", "gate_up_proj", "down_proj")
    if w.op == "load_balancing_loss":
        if dev.type == "cpu":
            layers = [_router_logits(b, sh["tokens"], sh["experts"]) for _ in range(sh["layers"])]
        else:
            layers = [randn(sh["tokens"], sh["experts"]) for _ in range(sh["layers"])]
        return {"gate_logits": layers, "num_experts": sh["experts"], "top_k": sh["top_k"],
                "attention_mask": None}, ("gate_logits",)
    if w.op == "attention":
        bsz, s, d = sh["batch"], sh["seq"], sh["head_dim"]
        q = randn(bsz, s, sh["q_heads"], d).transpose(1, 2)
        k = randn(bsz, s, sh["kv_heads"], d).transpose(1, 2)
        v = randn(bsz, s, sh["kv_heads"], d).transpose(1, 2)
        mod = AttentionModule(d, bool(sh.get("causal", 1)))
        return {"module": mod, "query": q, "key": k, "value": v, "attention_mask": None, "scaling": d**-0.5}, \
            ("query", "key", "value")
    raise ValueError(f"no workload builder for op {w.op!r}")


# --------------------------------------------------------------------------- timing
@dataclass
class Timer:
    """Median wall time per call: CUDA events per call with an L2 flush, or perf_counter."""

    device: Any
    warmup_ms: float = 50.0
    rep_ms: float = 300.0
    min_reps: int = 5
    max_reps: int = 10000
    _flush: Any = field(default=None, repr=False)

    def wall_ms(self, fn: Callable[[], Any]) -> float:
        import torch

        if self.device.type == "cuda":
            if self._flush is None:
                self._flush = torch.empty(256 * 2**20, dtype=torch.int8, device=self.device)
            fn()
            torch.cuda.synchronize()
            est_start, est_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            est_start.record()
            for _ in range(5):
                self._flush.zero_()
                fn()
            est_end.record()
            torch.cuda.synchronize()
            est = max(est_start.elapsed_time(est_end) / 5, 1e-3)
            n_warm = max(1, int(self.warmup_ms / est))
            n_rep = min(self.max_reps, max(self.min_reps, int(self.rep_ms / est)))
            for _ in range(n_warm):
                fn()
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
            for i in range(n_rep):
                self._flush.zero_()
                starts[i].record()
                fn()
                ends[i].record()
            torch.cuda.synchronize()
            return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
        # CPU (and any device without events): perf_counter around each call.
        sync = _sync_fn(self.device)
        t_end = time.perf_counter() + self.warmup_ms / 1e3
        fn()
        sync()
        while time.perf_counter() < t_end:
            fn()
            sync()
        times: list[float] = []
        t_end = time.perf_counter() + self.rep_ms / 1e3
        while len(times) < self.min_reps or (time.perf_counter() < t_end and len(times) < self.max_reps):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def _sync_fn(device: Any) -> Callable[[], None]:
    import torch

    mod = getattr(torch, device.type, None)
    if device.type != "cpu" and mod is not None and hasattr(mod, "synchronize"):
        return mod.synchronize
    return lambda: None


def kernel_ms(fn: Callable[[], Any], device: Any, calls: int = 20) -> float | None:
    """Sum of device kernel (and copy) time per call from ``torch.profiler``, mean of ``calls``."""
    if device.type != "cuda":
        return None
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    # CPU activity too: kernels are then correlated with their launches, as in every profiler
    # table; only the device-side events are summed.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total_us = 0.0
    for e in prof.events():
        if getattr(e, "device_type", None) == DeviceType.CUDA:
            total_us += e.time_range.elapsed_us()
    return total_us / calls / 1e3 if total_us > 0 else None


def peak_gib(fn: Callable[[], Any], device: Any) -> float | None:
    """``torch.cuda.max_memory_allocated`` over one call (inputs included), in GiB; None off CUDA."""
    if device.type != "cuda":
        return None
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) / GIB


def measure_ceilings(device: Any, timer: Timer) -> dict[str, Any]:
    """Device-to-device copy TB/s (read + write) and dense matmul TFLOP/s, measured now."""
    import torch

    out: dict[str, Any] = {}
    if device.type == "cuda":
        n_bytes, mm, mm_dtype = GIB, 8192, torch.bfloat16
    else:
        n_bytes, mm, mm_dtype = 64 * 2**20, 1024, torch.float32
    try:
        src = torch.empty(n_bytes, dtype=torch.uint8, device=device).random_(0, 255)
        dst = torch.empty_like(src)
        ms = timer.wall_ms(lambda s=src, d=dst: d.copy_(s))  # type: ignore[misc]
        out["copy_tbps"] = 2 * n_bytes / (ms * 1e-3) / 1e12
        out["copy_bytes"] = n_bytes
        del src, dst
    except Exception as e:  # a ceiling that cannot be measured is reported, not fatal
        out["copy_tbps"] = None
        out["copy_error"] = f"{type(e).__name__}: {e}"
    try:
        a = torch.randn(mm, mm, device=device, dtype=mm_dtype)
        b = torch.randn(mm, mm, device=device, dtype=mm_dtype)
        ms = timer.wall_ms(lambda x=a, y=b: x @ y)  # type: ignore[misc]
        out["matmul_tflops"] = 2 * mm**3 / (ms * 1e-3) / 1e12
        out["matmul"] = f"{str(mm_dtype).removeprefix('torch.')} {mm}x{mm}x{mm}"
        del a, b
    except Exception as e:
        out["matmul_tflops"] = None
        out["matmul_error"] = f"{type(e).__name__}: {e}"
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


# --------------------------------------------------------------------------- environment
VENDOR_DISTRIBUTIONS = ("liger-kernel", "quack-kernels", "flash-attn", "flash-attn-3", "flash-attn-4",
                        "flash_attn_3", "nvidia-cutlass-dsl", "torch-npu", "triton", "transformers", "torch")


def versions(registry: Any = None) -> dict[str, str]:
    """torch, triton, transformers, every veomni distribution, and every vendor library any
    registered kernel requires (from installed metadata)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    names = set(VENDOR_DISTRIBUTIONS)
    for dist in metadata.distributions():
        n = dist.metadata["Name"] or ""
        if n.lower().startswith("veomni"):
            names.add(n)
    if registry is not None:
        for rk in registry:
            names.add(rk.provenance.distribution)
            for r in rk.spec.requires:
                try:
                    names.add(Requirement(r).name)
                except Exception:
                    pass
    out = {}
    for n in sorted(names, key=str.lower):
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return out


ENV_PREFIXES = ("VEOMNI_OPS_", "LIGER_", "TRITON_", "CUTE_", "QUACK_", "FLASH_", "CUDA_VISIBLE_DEVICES",
                "PYTORCH_CUDA_ALLOC_CONF", "TORCHINDUCTOR_")


def environment() -> dict[str, str]:
    """Environment variables that change which kernel runs or how it is tuned (for example
    ``LIGER_FUSED_MOE_AUTOTUNE=0``): recorded with every result, since they change numbers."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def device_slug(name: str, kind: str) -> str:
    """A short file-name-safe device name: ``h100-sxm``, ``h100-pcie``, ``a100-sxm4-80gb``, ``cpu``."""
    if kind == "cpu":
        return "cpu"
    low = name.lower().replace("nvidia", "").replace("geforce", "").strip()
    m = re.search(r"\b([hb]\d{2,3})\b", low)
    if m and "hbm3" in low and "pcie" not in low:
        return f"{m.group(1)}-sxm"
    for form in ("pcie", "nvl", "sxm"):
        if m and form in low:
            return f"{m.group(1)}-{form}"
    slug = re.sub(r"[^a-z0-9]+", "-", low).strip("-")
    return slug or kind


def device_info() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        cap = torch.cuda.get_device_capability()
        return {"type": "cuda", "name": name, "capability": "%d.%d" % cap, "slug": device_slug(name, "cuda"),
                "torch_device": "cuda"}
    import platform

    cpu = platform.processor() or platform.machine()
    return {"type": "cpu", "name": f"cpu {cpu} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)",
            "capability": None, "slug": "cpu", "torch_device": "cpu"}


# --------------------------------------------------------------------------- running
def _kernels_for(registry: Any, w: Workload, dev_info: Any, backend: str | None):
    """``[(registered kernel, callable or None, why not)]`` for the workload's op and variant;
    eager always, others filtered by ``backend``."""
    from .resolve import static_problem
    from .testing.runner import backend_matches, resolve_kernel

    out: list[tuple[Any, Callable[..., Any] | None, str]] = []
    for rk in registry.for_op(w.op, w.variant):
        if backend is not None and rk.spec.name != "eager" and not backend_matches(rk, backend):
            continue
        why = static_problem(rk.spec, dev_info, dtype=w.dtype, training=False)
        if why is not None:
            out.append((rk, None, why))
            continue
        try:
            out.append((rk, resolve_kernel(rk, registry, dev_info), ""))
        except Exception as e:  # ResolutionError (e.g. import failed): reported, not fatal
            reasons = getattr(e, "refusals", None)
            out.append((rk, None, "; ".join(r.why for r in reasons) if reasons else f"{type(e).__name__}: {e}"))
    # eager first: the baseline every other row is compared with
    out.sort(key=lambda t: (t[0].spec.name != "eager", -t[0].spec.priority, t[0].spec.name))
    return out


def _closures(fn, inputs, diff, harness, device):
    """``{"fwd": f, "fwd+bwd": g}`` running the kernel per its contract."""
    import torch

    def fwd():
        with torch.no_grad():
            return harness.call(fn, inputs, False)

    leaves_inputs = dict(inputs)
    leaves = []
    for name in diff:
        v = leaves_inputs.get(name)
        if v is None:
            continue
        if isinstance(v, list):
            new = [t.detach().requires_grad_() for t in v]
            leaves_inputs[name] = new
            leaves += new
        else:
            t = v.detach().requires_grad_()
            leaves_inputs[name] = t
            leaves.append(t)
    cots: list[Any] = []

    def fwd_bwd():
        outs = harness.call(fn, leaves_inputs, False)
        if not cots:
            g = torch.Generator(device=device).manual_seed(1234)
            for o in outs:
                if o.numel() == 1:
                    cots.append(torch.ones_like(o))
                else:
                    cots.append(torch.randn(o.shape, generator=g, device=device, dtype=torch.float32).to(o.dtype))
        return torch.autograd.grad(outs, leaves, cots, allow_unused=True)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def _is_oom(e: BaseException) -> bool:
    return "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"


def run_bench(
    *,
    presets: Sequence[str] | None = None,
    op: str | None = None,
    backend: str | None = None,
    passes: Sequence[str] = PASSES,
    registry: Any = None,
    warmup_ms: float = 50.0,
    rep_ms: float = 300.0,
    profile_calls: int = 20,
    progress: bool = True,
    command: str = "",
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the benchmark; returns the result document (see benchmarks/README.md).

    ``checkpoint`` receives the document so far after every workload, so a run cut short
    (a time limit, an out-of-memory kill) still leaves its measurements behind."""
    import torch

    from .device import current_device
    from .discovery import discover
    from .testing.cases import harness

    reg = registry if registry is not None else discover()
    info = device_info()
    device = torch.device(info["torch_device"])
    dev_info = current_device()
    if presets is None:
        presets = CPU_DEFAULT if device.type == "cpu" else GPU_DEFAULT
    wls = workloads(presets, op)
    timer = Timer(device, warmup_ms=warmup_ms, rep_ms=rep_ms)
    started = _dt.datetime.now()
    ceilings = measure_ceilings(device, timer)
    env = environment()
    plan = [(w, _kernels_for(reg, w, dev_info, backend)) for w in wls]
    total = sum(len([k for k in ks if k[1] is not None]) * len(passes) for _, ks in plan)
    bar = _Progress(total, enabled=progress)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []

    def document(partial: bool) -> dict[str, Any]:
        done = [dict(r) for r in rows]
        _add_speedups(done)
        return {
            "device": info["slug"],
            "device_name": info["name"],
            "capability": info["capability"],
            "date": started.strftime("%Y-%m-%d"),
            "started": started.isoformat(timespec="seconds"),
            "command": command,
            "partial": partial,
            "presets": {name: PRESETS[name][0] for name in presets},
            "ceilings": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in ceilings.items()},
            "timing": {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "statistic": "median",
                       "wall": "CUDA events per call, L2 flushed before each" if device.type == "cuda"
                       else "time.perf_counter per call",
                       "kernel": f"torch.profiler device time, mean of {profile_calls} calls" if device.type == "cuda"
                       else None},
            "formulas": {k: v[0] for k, v in FORMULAS.items()},
            "versions": versions(reg),
            "environment": env,
            "rows": done,
            "skipped": list(skipped),
        }

    for w, kernels in plan:
        h = harness(w.op)
        try:
            inputs, diff = build_inputs(w, device)
        except Exception as e:
            for rk, fn, _ in kernels:
                if fn is not None:
                    for p in passes:
                        rows.append(_row(w, rk, p, error=f"building inputs failed: {type(e).__name__}: {e}"))
                        bar.step(f"{w.preset} {w.op}")
            continue
        for rk, fn, why in kernels:
            if fn is None:
                skipped.append({"op": w.op, "variant": w.variant, "kernel": rk.spec.name, "preset": w.preset,
                                "distribution": rk.provenance.distribution, "reason": why})
                continue
            closures = _closures(fn, inputs, diff, h, device)
            for p in passes:
                if p == "fwd+bwd" and not rk.spec.supports_backward:
                    skipped.append({"op": w.op, "variant": w.variant, "kernel": rk.spec.name, "preset": w.preset,
                                    "distribution": rk.provenance.distribution, "reason": "fwd+bwd: no backward"})
                    bar.step(f"{w.preset} {w.op}/{w.variant} {rk.spec.name} {p} (no backward)")
                    continue
                bar.step(f"{w.preset} {w.op}/{w.variant} {rk.spec.name} {p}")
                rows.append(_measure(w, rk, p, closures[p], device, timer, profile_calls))
            del closures
            _free(device)
        del inputs
        _free(device)
        if checkpoint is not None:
            checkpoint(document(partial=True))
    bar.close()
    return document(partial=False)


def _free(device: Any) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


def _row(w: Workload, rk: Any, pass_: str, **kw: Any) -> dict[str, Any]:
    row = {
        "op": w.op, "variant": w.variant, "kernel": rk.spec.name, "distribution": rk.provenance.distribution,
        "version": rk.provenance.version, "preset": w.preset, "shape": dict(w.shape), "dtype": w.dtype,
        "pass": pass_, "wall_ms": None, "kernel_ms": None, "tbps": None, "tflops": None, "peak_gib": None,
        "error": None,
    }
    row.update(kw)
    return row


def _measure(w: Workload, rk: Any, pass_: str, fn: Callable[[], Any], device: Any, timer: Timer,
             profile_calls: int) -> dict[str, Any]:
    row = _row(w, rk, pass_)
    try:
        row["peak_gib"] = _round(peak_gib(fn, device), 4)
        wall = timer.wall_ms(fn)
        row["wall_ms"] = _round(wall, 5)
        try:
            kms = kernel_ms(fn, device, profile_calls)
        except Exception as e:  # the profiler is optional; the wall time stands
            kms, row["error"] = None, f"profiler: {type(e).__name__}: {e}"
        row["kernel_ms"] = _round(kms, 5)
        t = kms if kms else wall
        amount = w.amount(pass_)
        if w.metric == "bytes":
            row["tbps"] = _round(amount / (t * 1e-3) / 1e12, 4)
        else:
            row["tflops"] = _round(amount / (t * 1e-3) / 1e12, 4)
    except Exception as e:
        row["error"] = "out of memory" if _is_oom(e) else f"{type(e).__name__}: {str(e)[:300]}"
        row["wall_ms"] = row["kernel_ms"] = row["tbps"] = row["tflops"] = None
    return row


def _round(x: float | None, digits: int) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"%.{digits}g" % x)


def _add_speedups(rows: list[dict[str, Any]]) -> None:
    """``vs_eager``: eager's time / this kernel's time (kernel time where both have it)."""
    base = {}
    for r in rows:
        if r["kernel"] == "eager":
            base[(r["preset"], r["op"], r["variant"], r["pass"])] = r
    for r in rows:
        b = base.get((r["preset"], r["op"], r["variant"], r["pass"]))
        r["vs_eager"] = None
        if b is None:
            continue
        key = "kernel_ms" if r["kernel_ms"] and b["kernel_ms"] else "wall_ms"
        if r[key] and b[key]:
            r["vs_eager"] = round(b[key] / r[key], 3)


class _Progress:
    """tqdm when installed and stderr is a terminal; otherwise one line per step on stderr."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.n, self.enabled = total, 0, enabled
        self._bar = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True)
            except ImportError:
                pass

    def step(self, what: str) -> None:
        self.n += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_description_str(what[:60])
            self._bar.update(1)
        else:
            width = 24
            filled = int(width * self.n / max(1, self.total))
            sys.stderr.write(f"[{'#' * filled}{'.' * (width - filled)}] {self.n}/{self.total} {what}\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# --------------------------------------------------------------------------- rendering
def _shape_text(shape: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def _fmt(x: Any, spec: str = ".3f") -> str:
    if x is None:
        return "-"
    return format(x, spec)


def _row_ceilings(result: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
    """The ceilings measured in the run that produced ``r`` (a merged result keeps each part's)."""
    parts = result.get("parts")
    if parts and r.get("part") is not None:
        return parts[r["part"]].get("ceilings", {})
    return result.get("ceilings", {})


def _rate(r: dict[str, Any], ceilings: dict[str, Any]) -> tuple[str, str]:
    if r.get("tbps") is not None:
        c = ceilings.get("copy_tbps")
        return f"{r['tbps']:.3g} TB/s", (f"{100 * r['tbps'] / c:.0f}%" if c else "-")
    if r.get("tflops") is not None:
        c = ceilings.get("matmul_tflops")
        return f"{r['tflops']:.3g} TFLOP/s", (f"{100 * r['tflops'] / c:.0f}%" if c else "-")
    return "-", "-"


TABLE_HEAD = ("preset", "op", "variant", "pass", "kernel", "dtype", "wall ms", "kernel ms", "rate", "of ceiling",
              "peak GiB", "vs eager")


def table_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    out: list[tuple[Any, ...]] = []
    for r in result["rows"]:
        rate, frac = _rate(r, _row_ceilings(result, r))
        if r.get("error") and r.get("wall_ms") is None:
            rate, frac = f"error: {r['error']}"[:60], "-"
        vs = r.get("vs_eager")
        out.append((r["preset"], r["op"], r["variant"], r["pass"], r["kernel"], r["dtype"],
                    _fmt(r["wall_ms"]), _fmt(r["kernel_ms"]), rate, frac, _fmt(r["peak_gib"], ".2f"),
                    f"{vs:.2f}x" if vs else "-"))
    return out


def render_text(result: dict[str, Any]) -> str:
    c = result.get("ceilings", {})
    lines = [f"veomni-ops bench on {result['device_name']} ({result['device']}), {result['date']}",
             f"ceilings: copy {_fmt(c.get('copy_tbps'), '.3g')} TB/s, matmul {_fmt(c.get('matmul_tflops'), '.3g')} "
             f"TFLOP/s ({c.get('matmul', '')})"]
    rows = [TABLE_HEAD] + table_rows(result)
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEAD))]
    for i, r in enumerate(rows):
        lines.append("  ".join(x.ljust(wd) for x, wd in zip(r, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * wd for wd in widths))
    for s in result.get("skipped", []):
        lines.append(f"skipped {s['preset']} {s['op']}/{s['variant']} {s['kernel']}: {s['reason']}")
    return "\n".join(lines)


def render_markdown(result: dict[str, Any]) -> str:
    c = result.get("ceilings", {})
    t = result.get("timing", {})
    lines = [
        f"# veomni-ops bench: {result['device_name']} ({result['device']}), {result['date']}",
        "",
        f"Command: `{result.get('command', '')}`",
        "",
        f"Ceilings measured in the same run: device-to-device copy {_fmt(c.get('copy_tbps'), '.3g')} TB/s "
        f"(bytes read + written), matmul {_fmt(c.get('matmul_tflops'), '.3g')} TFLOP/s ({c.get('matmul', '')}).",
        f"Timing: median wall time ({t.get('wall')}; warm-up {t.get('warmup_ms')} ms, repeats {t.get('rep_ms')} ms)"
        + (f"; kernel time: {t['kernel']}" if t.get("kernel") else "; no kernel time off CUDA") + ".",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in result.get("versions", {}).items()),
        "",
    ]
    if result.get("environment"):
        lines += ["Environment: " + ", ".join(f"`{k}={v}`" for k, v in result["environment"].items()), ""]
    if result.get("parts"):
        lines += [f"Merged from {len(result['parts'])} runs on this device (`--from` repeated); each row's "
                  "\"of ceiling\" uses the ceilings measured in its own run:", ""]
        for i, part in enumerate(result["parts"]):
            pc = part.get("ceilings", {})
            lines.append(f"{i + 1}. `{part.get('command', '')}` ({part.get('started', '')}; copy "
                         f"{_fmt(pc.get('copy_tbps'), '.3g')} TB/s, matmul {_fmt(pc.get('matmul_tflops'), '.3g')} "
                         f"TFLOP/s{'; cut short' if part.get('partial') else ''})")
        lines.append("")
    by_preset: dict[str, list[dict[str, Any]]] = {}
    for r in result["rows"]:
        by_preset.setdefault(r["preset"], []).append(r)
    for preset, rows in by_preset.items():
        desc = result.get("presets", {}).get(preset, "")
        lines += [f"## {preset}", "", desc, ""]
        head = ("op", "variant", "shape", "pass", "kernel", "wall ms", "kernel ms", "rate", "of ceiling",
                "peak GiB", "vs eager")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in rows:
            rate, frac = _rate(r, _row_ceilings(result, r))
            if r.get("error") and r.get("wall_ms") is None:
                rate, frac = f"error: {r['error']}", "-"
            vs = r.get("vs_eager")
            cells = (r["op"], r["variant"], f"{_shape_text(r['shape'])} {r['dtype']}", r["pass"],
                     f"{r['kernel']} ({r['distribution']} {r['version']})", _fmt(r["wall_ms"]), _fmt(r["kernel_ms"]),
                     rate, frac, _fmt(r["peak_gib"], ".2f"), f"{vs:.2f}x" if vs else "-")
            lines.append("| " + " | ".join(str(x).replace("|", "/") for x in cells) + " |")
        lines.append("")
    if result.get("skipped"):
        lines += ["## Not run here", ""]
        lines += [f"- {s['preset']} {s['op']}/{s['variant']} `{s['kernel']}` ({s['distribution']}): {s['reason']}"
                  for s in result["skipped"]]
        lines.append("")
    lines += ["## Formulas (minimal bytes or FLOPs per call; s = bytes per element)", ""]
    lines += [f"- {k}: {v}" for k, v in result.get("formulas", {}).items()]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: str) -> None:
    """Speed-up over eager per workload and kernel, one panel per pass (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    passes = [p for p in PASSES if any(r["pass"] == p for r in result["rows"])] or list(PASSES[:1])
    n = max(1, max(sum(1 for r in result["rows"] if r["pass"] == p) for p in passes))
    fig, axes = plt.subplots(1, len(passes), figsize=(7 * len(passes), 1.2 + 0.28 * n), squeeze=False)
    for ax, p in zip(axes[0], passes):
        rows = [r for r in result["rows"] if r["pass"] == p and r.get("vs_eager")]
        labels = [f"{r['preset']} {r['op']}/{r['variant']} {r['kernel']}" for r in rows]
        vals = [r["vs_eager"] for r in rows]
        colors = ["#999999" if r["kernel"] == "eager" else "#3a7bd5" for r in rows]
        ax.barh(range(len(rows)), vals, color=colors)
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:.2f}x", va="center", fontsize=7)
        if vals and max(vals) / min(vals) > 8:
            ax.set_xscale("log", base=2)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("speed-up over eager (kernel time where measured, else wall)")
        ax.set_title(f"{p} on {result['device']} ({result['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI
def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Benchmark every usable kernel of each op against eager at named shapes."
    parser.add_argument("--op", choices=list(OPS), help="only this op")
    parser.add_argument("--preset", action="append", metavar="NAME",
                        help=f"preset (repeatable): {', '.join(PRESETS)}; default: {', '.join(CPU_DEFAULT)} on the "
                             f"CPU, {', '.join(GPU_DEFAULT)} on GPUs")
    parser.add_argument("--backend", help="only this backend's kernels (eager is always run as the baseline)")
    parser.add_argument("--pass", dest="passes", action="append", choices=PASSES, help="only this pass (repeatable)")
    parser.add_argument("--json", nargs="?", const="auto", metavar="FILE",
                        help="write the result as JSON (and FILE.md beside it); without FILE: "
                             "benchmarks/results/<device>-<date>.json")
    parser.add_argument("--plot", metavar="FILE.png", help="write a chart (needs matplotlib)")
    parser.add_argument("--from", dest="from_file", action="append", metavar="FILE.json",
                        help="do not run: render a saved result (table, --plot, .md with --json); repeated: merge "
                             "runs made on one device (a long run split by --preset/--op) into one result")
    parser.add_argument("--warmup-ms", type=float, default=50.0, help="warm-up per measurement (default 50)")
    parser.add_argument("--rep-ms", type=float, default=300.0, help="repeat time per measurement (default 300)")
    parser.add_argument("--list", action="store_true", help="list the presets and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def _check_matplotlib() -> str | None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return ("--plot needs matplotlib, which is not installed: pip install matplotlib "
                "(or leave out --plot; the JSON and .md results do not need it)")
    return None


def default_json_path(result: dict[str, Any]) -> str:
    return os.path.join("benchmarks", "results", f"{result['device']}-{result['date']}.json")


def write_results(result: dict[str, Any], path: str) -> tuple[str, str]:
    """Write ``path`` (JSON) and the Markdown rendering beside it (``.md``)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    md = os.path.splitext(path)[0] + ".md"
    with open(md, "w") as fh:
        fh.write(render_markdown(result))
    return path, md


_ROW_KEY = ("preset", "op", "variant", "kernel", "pass", "dtype")


def merge_results(docs: Sequence[dict[str, Any]], names: Sequence[str] | None = None) -> dict[str, Any]:
    """One result from several runs on one device (a long benchmark split to fit a time limit).

    Refuses (``ValueError`` naming the files) to merge runs from different devices, library
    versions or timing settings, or two runs that measured the same row. Each part's command,
    start and ceilings are kept under ``parts``; every row records its ``part``."""
    if not docs:
        raise ValueError("nothing to merge")
    if len(docs) == 1:
        return docs[0]
    names = list(names) if names else [f"result {i + 1}" for i in range(len(docs))]
    first = docs[0]
    key: Any  # a field name, then a row key
    for name, d in zip(names[1:], docs[1:]):
        for key, what in (("device_name", "device"), ("capability", "compute capability"),
                          ("versions", "library versions"), ("timing", "timing settings"),
                          ("environment", "environment variables")):
            if d.get(key) != first.get(key):
                detail = ""
                if key in ("versions", "environment"):
                    a, b = first.get(key) or {}, d.get(key) or {}
                    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                    detail = ": " + ", ".join(f"{k} {a.get(k)} vs {b.get(k)}" for k in diff)
                else:
                    detail = f": {first.get(key)!r} vs {d.get(key)!r}"
                raise ValueError(f"cannot merge {names[0]} and {name}: they differ in {what}{detail}. "
                                 "Merge only runs from one machine and one installation, made with the same "
                                 "--warmup-ms/--rep-ms")
    rows: list[dict[str, Any]] = []
    seen: dict[tuple, str] = {}
    for i, (name, d) in enumerate(zip(names, docs)):
        for r in d.get("rows", []):
            key = tuple(str(r.get(k)) for k in _ROW_KEY) + (_shape_text(r.get("shape", {})),)
            if key in seen:
                raise ValueError(f"cannot merge: {name} and {seen[key]} both measured "
                                 f"{r['preset']} {r['op']}/{r['variant']} {r['kernel']} {r['pass']}; "
                                 "split the runs by --preset or --op so each row is measured once")
            seen[key] = name
            rows.append({**r, "part": i})
    _add_speedups(rows)
    presets: dict[str, str] = {}
    for d in docs:
        presets.update(d.get("presets", {}))
    return {
        **{k: first.get(k) for k in ("device", "device_name", "capability", "date", "started", "timing",
                                     "formulas", "versions", "environment", "ceilings")},
        "command": " && ".join(d.get("command", "") for d in docs),
        "partial": any(d.get("partial") for d in docs),
        "presets": presets,
        "parts": [{"command": d.get("command", ""), "started": d.get("started"), "partial": bool(d.get("partial")),
                   "ceilings": d.get("ceilings", {})} for d in docs],
        "rows": rows,
        "skipped": [s for d in docs for s in d.get("skipped", [])],
    }


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name, (desc, _) in PRESETS.items():
            print(f"{name:12} {desc}")
        return 0
    if args.plot:
        problem = _check_matplotlib()
        if problem:
            print(f"veomni-ops bench: {problem}", file=sys.stderr)
            return 2
    if args.from_file:
        files = [args.from_file] if isinstance(args.from_file, str) else list(args.from_file)
        docs = []
        for f in files:
            try:
                with open(f) as fh:
                    docs.append(json.load(fh))
            except (OSError, ValueError) as e:
                print(f"veomni-ops bench: cannot read --from {f}: {e}", file=sys.stderr)
                return 2
        try:
            result = merge_results(docs, files)
        except ValueError as e:
            print(f"veomni-ops bench: {e}", file=sys.stderr)
            return 2
    else:
        command = "veomni-ops " + " ".join(shlex.quote(a) for a in (getattr(args, "argv", None) or sys.argv[1:]))
        save = None
        if args.json and args.json != "auto":
            def save(doc: dict[str, Any], path: str = args.json) -> None:
                write_results(doc, path)
        result = run_bench(checkpoint=save, presets=args.preset, op=args.op, backend=args.backend,
                           passes=tuple(args.passes) if args.passes else PASSES,
                           registry=getattr(args, "registry", None), warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                           progress=not args.quiet, command=command)
    print(render_text(result))
    if args.json:
        path = default_json_path(result) if args.json == "auto" else args.json
        jpath, md = write_results(result, path)
        print(f"wrote {jpath} and {md}")
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    errors = [r for r in result["rows"] if r.get("error") and r.get("wall_ms") is None and r["error"] != "out of memory"]
    if errors:
        print(f"veomni-ops bench: {len(errors)} measurement(s) failed (see the error column)", file=sys.stderr)
    return 0
