"""The run loop of ``veomni-ops bench``: for each workload, every registered kernel of its op
and variant (eager first, the baseline), each pass timed; the result document."""

from __future__ import annotations

import datetime as _dt
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .environment import device_info, environment, versions
from .timing import Timer, kernel_ms, measure_ceilings, peak_gib
from .workloads import CPU_DEFAULT, FORMULAS, GPU_DEFAULT, PASSES, PRESETS, Workload, build_inputs, workloads


def _kernels_for(registry: Any, w: Workload, dev_info: Any, backend: str | None):
    """``[(registered kernel, callable or None, why not)]`` for the workload's op and variant;
    eager always, others filtered by ``backend``."""
    from ..resolve import static_problem
    from ..testing.runner import backend_matches, resolve_kernel

    out = []
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

    from ..device import current_device
    from ..discovery import discover
    from ..testing.cases import harness

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
        add_speedups(done)
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
        row["peak_gib"] = round_to(peak_gib(fn, device), 4)
        wall = timer.wall_ms(fn)
        row["wall_ms"] = round_to(wall, 5)
        try:
            kms = kernel_ms(fn, device, profile_calls)
        except Exception as e:  # the profiler is optional; the wall time stands
            kms, row["error"] = None, f"profiler: {type(e).__name__}: {e}"
        row["kernel_ms"] = round_to(kms, 5)
        t = kms if kms else wall
        amount = w.amount(pass_)
        if w.metric == "bytes":
            row["tbps"] = round_to(amount / (t * 1e-3) / 1e12, 4)
        else:
            row["tflops"] = round_to(amount / (t * 1e-3) / 1e12, 4)
    except Exception as e:
        row["error"] = "out of memory" if _is_oom(e) else f"{type(e).__name__}: {str(e)[:300]}"
        row["wall_ms"] = row["kernel_ms"] = row["tbps"] = row["tflops"] = None
    return row


def round_to(x: float | None, digits: int) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"%.{digits}g" % x)


def add_speedups(rows: list[dict[str, Any]]) -> None:
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

