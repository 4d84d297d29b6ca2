"""The run loop of ``veomni-ops bench``: for each workload, every registered kernel of its op
and variant (eager first, the baseline), each pass timed; the result document."""

from __future__ import annotations

import datetime as _dt
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .environment import device_info, environment, versions
from .peers import peers_for
from .timing import GIB, WALL_FLUSHED, WALL_WARM, Timer, kernel_ms, measure_ceilings, peak_gib
from .workloads import CPU_DEFAULT, FORMULAS, GPU_DEFAULT, PASSES, PRESETS, Workload, build_inputs, workloads


@dataclass(frozen=True)
class Candidate:
    """One row source of a workload: a registered kernel, or a peer (``bench/peers.py``)."""

    name: str
    distribution: str
    version: str
    supports_backward: bool
    fn: Any  #: the callable, or None when it cannot run here
    why: str = ""  #: why not, when ``fn`` is None
    peer: bool = False
    about: str = ""  #: a peer's: how it is called, and what its row's numbers include


def _kernels_for(registry: Any, w: Workload, dev_info: Any, backend: str | None) -> list[Candidate]:
    """The registered kernels of the workload's op and variant (eager always, others filtered by
    ``backend``), eager first: the baseline every other row is compared with; then, without a
    ``backend`` filter, the installed peers."""
    from ..resolve import static_problem
    from ..testing.runner import backend_matches, resolve_kernel

    found = []
    for rk in registry.for_op(w.op, w.variant):
        if backend is not None and rk.spec.name != "eager" and not backend_matches(rk, backend):
            continue
        why = static_problem(rk.spec, dev_info, dtype=w.dtype, training=False)
        fn = None
        if why is None:
            try:
                fn = resolve_kernel(rk, registry, dev_info)
            except Exception as e:  # ResolutionError (e.g. import failed): reported, not fatal
                reasons = getattr(e, "refusals", None)
                why = "; ".join(r.why for r in reasons) if reasons else f"{type(e).__name__}: {e}"
        found.append((rk, Candidate(rk.spec.name, rk.provenance.distribution, rk.provenance.version,
                                    rk.spec.supports_backward, fn, why or "")))
    found.sort(key=lambda t: (t[0].spec.name != "eager", -t[0].spec.priority, t[0].spec.name))
    out = [c for _, c in found]
    if backend is None:
        out += [_peer(p, dev_info) for p in peers_for(w.op, w.variant)]
    return out


def _peer(p: Any, dev_info: Any) -> Candidate:
    def candidate(fn: Any, why: str = "") -> Candidate:
        return Candidate(p.name, p.distribution, p.version() or "?", True, fn, why, peer=True, about=p.about)

    if dev_info.type not in p.device_types:
        return candidate(None, f"peer, runs on {'/'.join(p.device_types)} only")
    try:
        return candidate(p.load())
    except Exception as e:  # installed but broken: a skipped row that says why
        return candidate(None, f"peer failed to import: {type(e).__name__}: {e}")


def _peer_notes(plan: Sequence[tuple[Workload, list[Candidate]]]) -> list[dict[str, str]]:
    """One entry per peer of the run (op, variant, name): how it is called, what its numbers include."""
    out: dict[tuple[str, str, str], dict[str, str]] = {}
    for w, cands in plan:
        for c in cands:
            if c.peer:
                out.setdefault((w.op, w.variant, c.name), {"op": w.op, "variant": w.variant, "kernel": c.name,
                                                           "distribution": c.distribution, "version": c.version,
                                                           "about": c.about})
    return list(out.values())


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
                    # laid out as the output (empty_like keeps its strides), as the next layer's backward
                    # hands it over: a kernel whose output is a [B, S, H, D] buffer viewed as [B, H, S, D]
                    # gets its gradient that way too, as in the model
                    r = torch.randn(o.shape, generator=g, device=device, dtype=torch.float32)
                    cots.append(torch.empty_like(o).copy_(r))
        # only the outputs with a gradient (an op may also return indices: the router's)
        pairs = [(o, c) for o, c in zip(outs, cots) if o.requires_grad]
        return torch.autograd.grad([o for o, _ in pairs], leaves, [c for _, c in pairs], allow_unused=True)

    grad_bytes = sum(t.numel() * t.element_size() for t in leaves)
    return {"fwd": (fwd, 0), "fwd+bwd": (fwd_bwd, grad_bytes)}


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
    peers = _peer_notes(plan)
    total = sum(len([k for k in ks if k.fn is not None]) * len(passes) for _, ks in plan)
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
                       "wall": WALL_FLUSHED if device.type == "cuda" else WALL_WARM,
                       "kernel": f"torch.profiler device time, mean of {profile_calls} calls" if device.type == "cuda"
                       else None},
            "formulas": {k: v[0] for k, v in FORMULAS.items()},
            "versions": versions(reg),
            "environment": env,
            "rows": done,
            "skipped": list(skipped),
            "peers": peers,
        }

    for w, kernels in plan:
        h = harness(w.op)
        try:
            inputs, diff = build_inputs(w, device)
        except Exception as e:
            for c in kernels:
                if c.fn is not None:
                    for p in passes:
                        rows.append(_row(w, c, p, error=f"building inputs failed: {type(e).__name__}: {e}"))
                        bar.step(f"{w.preset} {w.op}")
            continue
        for c in kernels:
            if c.fn is None:
                skipped.append({"op": w.op, "variant": w.variant, "kernel": c.name, "preset": w.preset,
                                "distribution": c.distribution, "reason": c.why, "peer": c.peer})
                continue
            closures = _closures(c.fn, inputs, diff, h, device)
            for p in passes:
                if p == "fwd+bwd" and not c.supports_backward:
                    skipped.append({"op": w.op, "variant": w.variant, "kernel": c.name, "preset": w.preset,
                                    "distribution": c.distribution, "reason": "fwd+bwd: no backward",
                                    "peer": c.peer})
                    bar.step(f"{w.preset} {w.op}/{w.variant} {c.name} {p} (no backward)")
                    continue
                bar.step(f"{w.preset} {w.op}/{w.variant} {c.name} {p}")
                fn, grad_bytes = closures[p]
                rows.append(_measure(w, c, p, fn, grad_bytes, device, timer, profile_calls))
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


def _row(w: Workload, c: Candidate, pass_: str, **kw: Any) -> dict[str, Any]:
    row = {
        "op": w.op, "variant": w.variant, "kernel": c.name, "distribution": c.distribution,
        "version": c.version, "peer": c.peer, "preset": w.preset, "shape": dict(w.shape), "dtype": w.dtype,
        "logits": (w.logits or "peaked") if w.op == "cross_entropy" else None,
        "pass": pass_, "wall_ms": None, "kernel_ms": None, "tbps": None, "tflops": None, "peak_gib": None,
        "extra_gib": None, "error": None,
    }
    row.update(kw)
    return row


def _measure(w: Workload, c: Candidate, pass_: str, fn: Callable[[], Any], grad_bytes: int, device: Any,
             timer: Timer, profile_calls: int) -> dict[str, Any]:
    row = _row(w, c, pass_)
    try:
        before = _allocated(device)
        peak = peak_gib(fn, device)
        row["peak_gib"] = round_to(peak, 4)
        if peak is not None and before is not None:
            # beyond the inputs (resident before the call) and the gradients the call returns
            row["extra_gib"] = round_to(max(0.0, peak - (before + grad_bytes) / GIB), 4)
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


def _allocated(device: Any) -> float | None:
    """Bytes allocated on a CUDA device now (after a synchronisation); None elsewhere."""
    if device.type != "cuda":
        return None
    import torch

    torch.cuda.synchronize()
    return float(torch.cuda.memory_allocated(device))


def round_to(x: float | None, digits: int) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"%.{digits}g" % x)


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """``vs_eager``: eager's time / this kernel's time (kernel time where both have it, else wall);
    ``vs_eager_on`` says which (``"kernel_ms"`` or ``"wall_ms"``)."""
    base = {}
    for r in rows:
        if r["kernel"] == "eager":
            base[(r["preset"], r["op"], r["variant"], r["pass"])] = r
    for r in rows:
        b = base.get((r["preset"], r["op"], r["variant"], r["pass"]))
        r["vs_eager"] = r["vs_eager_on"] = None
        if b is None:
            continue
        key = "kernel_ms" if r["kernel_ms"] and b["kernel_ms"] else "wall_ms"
        if r[key] and b[key]:
            r["vs_eager"] = round(b[key] / r[key], 3)
            r["vs_eager_on"] = key


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

