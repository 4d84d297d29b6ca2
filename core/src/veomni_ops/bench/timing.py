"""Timing one call: median wall time (CUDA events with an L2 flush, or ``perf_counter``),
device kernel time from ``torch.profiler``, peak memory, and the device's copy and matmul
ceilings measured in the same run."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

GIB = 2**30

#: How a run's wall times were taken (the result's ``timing.wall``): on CUDA with L2 flushed
#: before each call, so that a call reads its inputs from memory, as the copy ceiling does.
WALL_FLUSHED = "CUDA events per call, L2 flushed before each"
WALL_WARM = "time.perf_counter per call"
#: Why a run timed warm gives no share of its ceilings ("of ceiling": "-").
NO_SHARE = ("not given off CUDA: each call is timed warm, its inputs left in the caches by the call before (CUDA's "
            "timing flushes L2 first), while the copy ceiling is a 64 MiB copy through memory, so a workload that "
            "fits in cache reads faster than the ceiling and its share would say more than 100%")

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
        ms = timer.wall_ms(functools.partial(dst.copy_, src))
        out["copy_tbps"] = 2 * n_bytes / (ms * 1e-3) / 1e12
        out["copy_bytes"] = n_bytes
        del src, dst
    except Exception as e:  # a ceiling that cannot be measured is reported, not fatal
        out["copy_tbps"] = None
        out["copy_error"] = f"{type(e).__name__}: {e}"
    try:
        a = torch.randn(mm, mm, device=device, dtype=mm_dtype)
        b = torch.randn(mm, mm, device=device, dtype=mm_dtype)
        ms = timer.wall_ms(functools.partial(torch.matmul, a, b))
        out["matmul_tflops"] = 2 * mm**3 / (ms * 1e-3) / 1e12
        out["matmul"] = f"{str(mm_dtype).removeprefix('torch.')} {mm}x{mm}x{mm}"
        del a, b
    except Exception as e:
        out["matmul_tflops"] = None
        out["matmul_error"] = f"{type(e).__name__}: {e}"
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out

