"""Run conformance cases: a kernel against the core's eager reference evaluated in float64.

For one kernel, dtype and :class:`~veomni_ops.testing.cases.Case`:

1. build the case's inputs in the dtype under test on the device the kernel runs on;
2. call the kernel per its op's contract, and the eager reference of the same op and
   variant on the same values cast to float64;
3. compare every output, then — if the spec declares a backward — the gradient of every
   differentiable input, for one random cotangent (the same values on both sides);
4. the case passes when every compared tensor satisfies the spec's tolerance for the dtype
   (:meth:`KernelSpec.tolerance`), and the output dtypes and shapes are the contract's.
5. In a 16-bit dtype (bfloat16, float16: :data:`BASELINE_DTYPES`) a tensor outside the
   tolerance still passes when PyTorch's own computation in the same dtype does no better:
   the core's eager kernel is then run on the same low-precision inputs (same values, same
   cotangent) and compared with float64 the same way; a kernel error of at most
   :data:`BASELINE_FACTOR` times eager's is accepted and reported as such (``eager in
   bfloat16: 1.8``). Rounding intermediates to bf16/fp16 (every kernel must) makes the error of
   a sum over thousands of terms grow with its length, which no fixed tolerance catches
   without also passing real bugs at small shapes. float32 and float64 results must meet the
   spec's tolerance (a float32 kernel keeps float32 intermediates: if it needs more room, its
   spec declares it, with the measurement), and so must the core's eager kernel itself.

The error reported is the worst ratio ``|a - b| / (atol * s + rtol * |b| + ulp(b))`` over all
elements of all compared tensors (a pass is ``<= 1``), where ``a`` is the kernel's value,
``b`` the float64 reference, ``ulp(b)`` the spacing of the kernel's output dtype at ``b``
(no kernel can be closer than rounding to its dtype: it matters where values are subnormal,
e.g. float16 gradients below 6e-5) and ``s`` the tensor's *unit scale*: its RMS rounded to a
power of two (1 for scalars and all-zero tensors). Comparing at unit scale is what running the
backward with a cotangent that makes that gradient unit-sized would give (scaling by a power
of two is exact in floating point); without it a weight gradient summed over thousands of
rows would face the same absolute tolerance as an elementwise output of order one, and a
gradient of order 1e-3 would pass whatever its value.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import OP_TO_FIELD, OpsConfig
from ..device import DeviceError, DeviceInfo, current_device
from ..registry import RegisteredKernel, Registry
from ..resolve import ResolutionError, resolve
from ..spec import KernelSpec, Tolerance, normalize_name
from .cases import SIZES, TORCH_DTYPES, Builder, Case, OpHarness, harness

#: Exceptions a kernel may raise to refuse an *optional* input form (see Case.optional).
REFUSALS = (ValueError, TypeError, NotImplementedError)

PASS, FAIL, ERROR, UNSUPPORTED, SKIP = "pass", "fail", "error", "unsupported", "skip"


def interpreter_active() -> bool:
    """Triton's CPU interpreter is on (``TRITON_INTERPRET=1``): small shapes, CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def execution_device(dev: DeviceInfo) -> torch.device:
    """The torch device on which kernels resolved for ``dev`` run here.

    The detected device runs its own kernels. A device given as an override (``--device`` /
    ``VEOMNI_OPS_DEVICE``) that this machine has is used as well; one it lacks is only
    accepted under the Triton interpreter, which runs GPU Triton kernels on CPU tensors.
    """
    t = dev.torch_device
    if t == "cpu":
        return torch.device("cpu")
    available = {
        "cuda": torch.cuda.is_available(),
        "xpu": hasattr(torch, "xpu") and torch.xpu.is_available(),
        "mps": torch.backends.mps.is_available(),
        "npu": hasattr(torch, "npu") and torch.npu.is_available(),
    }
    if available.get(t):
        return torch.device(t)
    if interpreter_active():
        return torch.device("cpu")
    raise DeviceError(
        f"cannot run kernels for device {dev} here: this machine has no {t} device. Check on a machine that has "
        "one, or set TRITON_INTERPRET=1 to run Triton kernels on the CPU interpreter"
    )


def default_size(device: torch.device) -> str:
    return "small" if device.type == "cpu" or interpreter_active() else "full"


# --------------------------------------------------------------------------- comparison
#: A kernel error up to this many times that of the core's eager kernel run in the same dtype
#: passes (step 5 of the module docstring) -- in the dtypes of :data:`BASELINE_DTYPES` only.
BASELINE_FACTOR = 2.0
#: The dtypes whose results may lean on eager's own error (step 5); float32/float64 may not.
BASELINE_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Comparison:
    """One compared tensor: ``ratio`` is the worst error in tolerance units (pass <= 1);
    ``baseline`` the same measure for the core's eager kernel in the same dtype, when it was
    needed (``ratio > 1``)."""

    name: str
    ratio: float
    max_abs: float
    scale: float
    baseline: float | None = None

    @property
    def ok(self) -> bool:
        if self.ratio <= 1.0:
            return True
        return self.baseline is not None and self.ratio <= BASELINE_FACTOR * self.baseline


#: A float64 reference whose RMS is below this is zero up to rounding (e.g. a gradient that
#: cancels exactly): it is compared at scale 1, not blown up to unit size.
ZERO_RMS = 2.0**-40


def unit_scale(ref: torch.Tensor) -> float:
    """The RMS of ``ref`` rounded to a power of two; 1 for scalars and (numerically) zero tensors."""
    if ref.numel() <= 1:
        return 1.0
    finite = ref[torch.isfinite(ref)]
    if finite.numel() == 0:
        return 1.0
    rms = float(finite.pow(2).mean().sqrt())
    if rms < ZERO_RMS or not math.isfinite(rms):
        return 1.0
    return 2.0 ** round(math.log2(rms))


def ulp(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s representable numbers at ``|b|`` (float64 tensor): ``eps * |b|``
    for normal numbers, the subnormal spacing below them."""
    if not dtype.is_floating_point or dtype == torch.float64:
        return torch.zeros_like(b)
    fi = torch.finfo(dtype)
    return torch.clamp(b.abs(), min=fi.smallest_normal) * fi.eps


def compare(name: str, got: torch.Tensor, ref: torch.Tensor, tol: Tolerance,
            mask: torch.Tensor | None = None) -> Comparison:
    """Worst ``|a - b| / (atol * s + rtol * |b|)`` of ``got`` against the float64 ``ref``."""
    a = got.detach().to(device=ref.device, dtype=torch.float64)
    b = ref.detach().to(torch.float64)
    if mask is not None:
        m = mask.to(b.device).expand_as(b)
        a, b = a[m], b[m]
    if b.numel() == 0:
        return Comparison(name, 0.0, 0.0, 1.0)
    s = unit_scale(b)
    diff = (a - b).abs()
    denom = tol.atol * s + tol.rtol * b.abs() + ulp(b, got.dtype)
    ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / denom)
    # Non-finite values: equal infinities / both NaN agree, anything else is an infinite error.
    fin_a, fin_b = torch.isfinite(a), torch.isfinite(b)
    both_nan = torch.isnan(a) & torch.isnan(b)
    same_inf = torch.isinf(a) & torch.isinf(b) & (a == b)
    nonfinite_ok = both_nan | same_inf
    ratio = torch.where(fin_a & fin_b, ratio, torch.where(nonfinite_ok, torch.zeros_like(ratio),
                                                          torch.full_like(ratio, math.inf)))
    max_abs = torch.where(fin_a & fin_b, diff, torch.where(nonfinite_ok, torch.zeros_like(diff),
                                                            torch.full_like(diff, math.inf)))
    return Comparison(name, float(ratio.max()), float(max_abs.max()), s)


# --------------------------------------------------------------------------- results
@dataclass
class CaseResult:
    case: str
    dtype: str
    status: str  # pass | fail | error | unsupported
    worst: float | None = None  # worst error ratio over all compared tensors
    worst_in: str = ""  # which tensor
    max_abs: float | None = None
    message: str = ""
    about: str = ""
    seconds: float = 0.0
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    baseline: float | None = None  # eager-in-dtype error of the worst tensor, when it was needed

    @property
    def ok(self) -> bool:
        return self.status in (PASS, UNSUPPORTED)

    def describe(self) -> str:
        head = f"{self.case} [{self.dtype}]: {self.status}"
        if self.worst is not None:
            head += f", worst error {_fmt_ratio(self.worst)} in {self.worst_in} (max |a-b| {self.max_abs:.3g})"
            if self.baseline is not None:
                head += f", eager in {self.dtype}: {_fmt_ratio(self.baseline)}"
        if self.message:
            head += f" - {self.message}"
        if self.notes:
            head += " (note: " + "; ".join(self.notes) + ")"
        return head

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "dtype": self.dtype,
            "status": self.status,
            "worst": _json_float(self.worst),
            "worst_in": self.worst_in,
            "eager_in_dtype": _json_float(self.baseline),
            "max_abs": _json_float(self.max_abs),
            "message": self.message,
            "notes": self.notes,
            "seconds": round(self.seconds, 4),
            "tensors": {c.name: {"ratio": _json_float(c.ratio), "max_abs": _json_float(c.max_abs), "scale": c.scale,
                                 **({"eager_in_dtype": _json_float(c.baseline)} if c.baseline is not None else {})}
                        for c in self.comparisons},
        }


def _json_float(x: float | None) -> float | str | None:
    if x is None:
        return None
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return float("%.4g" % x)


def _fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return "%.3g" % x


def _short(e: BaseException, limit: int = 400) -> str:
    msg = f"{type(e).__name__}: {e}".strip()
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return ""
    f = tb[-1]
    return f" (at {os.path.basename(f.filename)}:{f.lineno} in {f.name})"


# --------------------------------------------------------------------------- one case
def _float64(x: Any) -> Any:
    # A copy even for float64: the reference must not see what a kernel writes into its inputs.
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().to(torch.float64, copy=True)
    if isinstance(x, (list, tuple)):
        return type(x)(_float64(v) for v in x)
    return x


def _tensors(inputs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    out = []
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            out.append((name, v))
        elif isinstance(v, (list, tuple)):
            out += [(f"{name}[{i}]", t) for i, t in enumerate(v) if isinstance(t, torch.Tensor)]
    return out


def _written(inputs: dict[str, Any], before: dict[str, torch.Tensor]) -> list[str]:
    """Inputs whose values differ from the snapshot: the kernel wrote into them."""
    return [name for name, t in _tensors(inputs) if name in before and not torch.equal(t.detach(), before[name])]


def _leaves(inputs: dict[str, Any], names: Sequence[str]) -> list[tuple[str, torch.Tensor]]:
    """Make the differentiable inputs leaves that require grad (in place in ``inputs``)."""
    out = []
    for name in names:
        v = inputs.get(name)
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            new = [t.detach().requires_grad_() for t in v]
            inputs[name] = new
            out += [(f"{name}[{i}]", t) for i, t in enumerate(new)]
        else:
            t = v.detach().requires_grad_()  # keeps the (possibly non-contiguous) strides
            inputs[name] = t
            out.append((name, t))
    return out


def _cotangents(outputs: Sequence[torch.Tensor], masks: Sequence[torch.Tensor | None], seed: int) -> list[torch.Tensor]:
    """Random float64 cotangents, drawn on the outputs' device from a seeded generator."""
    gens: dict[torch.device, torch.Generator] = {}
    cots = []
    for out, m in zip(outputs, masks):
        gen = gens.get(out.device)
        if gen is None:
            gen = gens[out.device] = torch.Generator(device=out.device).manual_seed(seed)
        if out.numel() == 1:
            c = torch.rand((), generator=gen, dtype=torch.float64, device=out.device) + 0.5  # a loss: [0.5, 1.5)
            c = c.expand(out.shape)
        else:
            c = torch.randn(tuple(out.shape), generator=gen, dtype=torch.float64, device=out.device)
        if m is not None:
            c = c * m.to(c.device).expand_as(c)
        cots.append(c)
    return cots


def check_case(
    fn: Callable[..., Any],
    spec: KernelSpec,
    h: OpHarness,
    variant: str,
    case: Case,
    dtype: str,
    device: torch.device | str,
    seed: int = 0,
    backward: bool | None = None,
) -> CaseResult:
    """Check ``fn`` (declared by ``spec``) on one case and dtype against the float64 reference."""
    t0 = time.perf_counter()
    res = CaseResult(case.name, dtype, PASS, about=case.about)
    tol = spec.tolerance(dtype)
    want_grad = spec.supports_backward if backward is None else backward
    tdtype = TORCH_DTYPES[dtype]
    try:
        inputs = case.build(Builder(seed, tdtype, device))
        ref_inputs = {k: _float64(v) for k, v in inputs.items()}
    except Exception as e:  # a bug in the kit, not in the kernel
        res.status, res.message = ERROR, f"building the inputs failed: {_short(e)}{_where(e)}"
        return _done(res, t0)
    masks = h.out_masks(inputs) if h.out_masks else [None] * len(h.out_names)
    # Snapshot (leaves below share storage with these tensors) to notice writes into inputs.
    before = {name: t.detach().clone() for name, t in _tensors(inputs)}
    leaves = _leaves(inputs, case.diff) if want_grad else []
    ref_leaves = _leaves(ref_inputs, case.diff) if want_grad else []

    try:
        with torch.set_grad_enabled(want_grad):
            outs = h.call(fn, inputs, False)
    except REFUSALS as e:
        if case.optional:
            res.status, res.message = UNSUPPORTED, f"kernel refuses this input form: {_short(e, 200)}"
        else:
            res.status, res.message = ERROR, f"kernel raised {_short(e)}{_where(e)}"
        return _done(res, t0)
    except Exception as e:
        res.status, res.message = ERROR, f"kernel raised {_short(e)}{_where(e)}"
        return _done(res, t0)
    try:
        with torch.set_grad_enabled(want_grad):
            ref_outs = h.call(h.reference_fn(variant), ref_inputs, True)
    except Exception as e:
        res.status, res.message = ERROR, f"the float64 eager reference raised {_short(e)}{_where(e)} (a kit problem)"
        return _done(res, t0)

    problems = _check_outputs(h, outs, ref_outs, tdtype)
    if problems:
        res.status, res.message = FAIL, "; ".join(problems)
        return _done(res, t0)
    for name, out, ref, m in zip(h.out_names, outs, ref_outs, masks):
        res.comparisons.append(compare(name, out, ref, tol, m))

    ref_grads: list[torch.Tensor] = []
    if want_grad and leaves:
        grads_ok = _compare_grads(res, outs, ref_outs, masks, leaves, ref_leaves, tol, seed, ref_grads)
        if not grads_ok:
            return _done(res, t0)
    written = _written(inputs, before)
    if written:
        # Not a contract violation by itself (some kernels reuse an input's memory on purpose),
        # but a caller that reads the tensor afterwards gets other values: report it.
        res.notes.append(f"writes into its input(s) {', '.join(written)} (in place)")

    reference = h.reference_fn(variant)
    if any(not c.ok for c in res.comparisons) and tdtype in BASELINE_DTYPES and fn is not reference:
        try:
            base = _baseline_ratios(h, reference, case, tdtype, device, seed, ref_outs, masks, ref_grads, tol,
                                    want_grad and bool(leaves))
        except Exception as e:  # the baseline is context; its failure must not hide the kernel's result
            res.notes.append(f"eager in {dtype} could not be run for comparison: {_short(e, 200)}")
            base = {}
        res.comparisons = [Comparison(c.name, c.ratio, c.max_abs, c.scale, base.get(c.name)) if c.ratio > 1 else c
                           for c in res.comparisons]

    worst = max(res.comparisons, key=lambda c: c.ratio)
    res.worst, res.worst_in, res.max_abs = worst.ratio, worst.name, worst.max_abs
    res.baseline = worst.baseline
    if any(not c.ok for c in res.comparisons):
        bad = [_bad_text(c, dtype) for c in res.comparisons if not c.ok]
        res.status = FAIL
        res.message = (f"outside tolerance (atol={tol.atol:g}, rtol={tol.rtol:g} for {dtype}) in: {', '.join(bad)}"
                       + (f"; {res.message}" if res.message else ""))
    else:
        eased = [c for c in res.comparisons if c.ratio > 1]
        if eased:
            res.notes.append(
                f"outside the {dtype} tolerance but within {BASELINE_FACTOR:g}x the error of eager in {dtype}: "
                + ", ".join(f"{c.name} {_fmt_ratio(c.ratio)} (eager {_fmt_ratio(c.baseline)})" for c in eased))
    return _done(res, t0)


def _bad_text(c: Comparison, dtype: str) -> str:
    if c.baseline is None:
        return c.name
    return f"{c.name} ({_fmt_ratio(c.ratio)}; eager in {dtype}: {_fmt_ratio(c.baseline)})"


def _baseline_ratios(h, reference, case, tdtype, device, seed, ref_outs, masks, ref_grads, tol, want_grad):
    """Errors of the core's eager kernel run in the case's dtype (same inputs, rebuilt from the
    seed, same cotangent), in the same units as the kernel's: ``{tensor name: ratio}``."""
    inputs = case.build(Builder(seed, tdtype, device))
    leaves = _leaves(inputs, case.diff) if want_grad else []
    with torch.set_grad_enabled(want_grad):
        outs = h.call(reference, inputs, True)
    out = {}
    for name, o, r, m in zip(h.out_names, outs, ref_outs, masks):
        out[name] = compare(name, o, r, tol, m).ratio
    if want_grad and leaves and ref_grads:
        got, _ = _backward(outs, leaves, _case_cotangents(ref_outs, masks, seed))
        for (name, leaf), g, w in zip(leaves, got or (), ref_grads):
            g = torch.zeros_like(leaf) if g is None else g
            out[f"grad {name}"] = compare(f"grad {name}", g, w, tol).ratio
    return out


def _done(res: CaseResult, t0: float) -> CaseResult:
    res.seconds = time.perf_counter() - t0
    return res


def _check_outputs(h: OpHarness, outs: Any, ref_outs: Sequence[torch.Tensor], dtype: torch.dtype) -> list[str]:
    problems = []
    if not isinstance(outs, tuple) or len(outs) != len(ref_outs):
        return [f"expected {len(ref_outs)} output(s) ({', '.join(h.out_names)}), got {outs!r:.200}"]
    allowed = h.out_dtypes(dtype)
    for name, out, ref, ok_dtypes in zip(h.out_names, outs, ref_outs, allowed):
        if not isinstance(out, torch.Tensor):
            problems.append(f"{name} is a {type(out).__name__}, not a tensor")
            continue
        if tuple(out.shape) != tuple(ref.shape):
            problems.append(f"{name} has shape {tuple(out.shape)}, the contract gives {tuple(ref.shape)}")
        if out.dtype not in ok_dtypes:
            want = " or ".join(str(d).removeprefix("torch.") for d in ok_dtypes)
            problems.append(f"{name} has dtype {str(out.dtype).removeprefix('torch.')}, the contract says {want}")
    return problems


#: The cotangents of a case are drawn from the case's seed plus this (its inputs use the seed).
COTANGENT_SEED_OFFSET = 7919


def _case_cotangents(ref_outs, masks, seed):
    return _cotangents(ref_outs, masks, seed + COTANGENT_SEED_OFFSET)


def _backward(outs, leaves, cots):
    """Gradients of ``leaves`` for the cotangents ``cots``, each rounded to its output's dtype;
    ``(None, [])`` when no output requires grad. Returns the gradients and the cotangents used."""
    pairs = [(o, c.to(o.dtype)) for o, c in zip(outs, cots) if o.requires_grad]
    if not pairs:
        return None, []
    kcots = [c for _, c in pairs]
    return torch.autograd.grad([o for o, _ in pairs], [t for _, t in leaves], kcots, allow_unused=True), kcots


def _compare_grads(res, outs, ref_outs, masks, leaves, ref_leaves, tol, seed, ref_grads=None) -> bool:
    # The kernel's cotangent is rounded to its output dtype; the reference gets those same values.
    try:
        got, kcots = _backward(outs, leaves, _case_cotangents(ref_outs, masks, seed))
    except Exception as e:
        res.status, res.message = ERROR, f"backward raised {_short(e)}{_where(e)}"
        return False
    if got is None:
        res.status = FAIL
        res.message = "the spec declares a backward, but no output requires grad (the kernel is not differentiable)"
        return False
    ref_pairs = [r for r, o in zip(ref_outs, outs) if o.requires_grad]
    want = torch.autograd.grad(ref_pairs, [t for _, t in ref_leaves],
                               [kc.to(r.dtype) for r, kc in zip(ref_pairs, kcots)], allow_unused=True)
    for (name, leaf), g, w in zip(leaves, got, want):
        w = torch.zeros_like(leaf, dtype=torch.float64) if w is None else w
        if ref_grads is not None:
            ref_grads.append(w)
        if g is None:
            if bool((w != 0).any()):
                res.comparisons.append(Comparison(f"grad {name}", math.inf, math.inf, 1.0))
                res.message = f"backward gave no gradient for {name}"
                continue
            g = torch.zeros_like(w)
        if tuple(g.shape) != tuple(leaf.shape):
            res.status = FAIL
            res.message = f"grad {name} has shape {tuple(g.shape)}, the input has {tuple(leaf.shape)}"
            return False
        res.comparisons.append(compare(f"grad {name}", g, w, tol))
    return True


@contextlib.contextmanager
def cpu_threads_for(device: torch.device | str, size: str):
    """One intra-op thread while checking small shapes on the CPU: tensors of a few dozen
    elements gain nothing from threads, and on a busy machine the thread pool's hand-offs
    cost more than the work (10-50x on a loaded 2-core CI box)."""
    if torch.device(device).type != "cpu" or size != "small":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- one kernel
def kernel_dtypes(spec: KernelSpec, dtypes: Iterable[str] | None = None) -> list[str]:
    if dtypes is None:
        return list(spec.dtypes)
    want = [str(d).removeprefix("torch.") for d in dtypes]
    return [d for d in spec.dtypes if d in want]


def check_kernel(
    fn: Callable[..., Any],
    spec: KernelSpec,
    *,
    device: torch.device | str | None = None,
    size: str | None = None,
    dtypes: Iterable[str] | None = None,
    seed: int = 0,
    cases: Iterable[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[CaseResult]:
    """Every case of ``spec``'s op and variant, in every dtype it declares (or ``dtypes``)."""
    dev = torch.device(device) if device is not None else execution_device(current_device())
    size = size or default_size(dev)
    h = harness(spec.op)
    wanted = set(cases) if cases is not None else None
    out = []
    with cpu_threads_for(dev, size):
        for dtype in kernel_dtypes(spec, dtypes):
            for i, case in enumerate(h.cases(spec.variant, size)):
                if wanted is not None and case.name not in wanted:
                    continue
                if progress:
                    progress(f"{spec.op}/{spec.variant} {spec.name} {dtype} {case.name}")
                out.append(check_case(fn, spec, h, spec.variant, case, dtype, dev, seed=case_seed(seed, i)))
    return out


def case_seed(seed: int, index: int) -> int:
    """The seed of the ``index``-th case of a run seeded with ``seed`` (each case draws anew)."""
    return seed + 1000 * index


# --------------------------------------------------------------------------- many kernels
@dataclass
class KernelReport:
    op: str
    variant: str
    kernel: str
    distribution: str
    version: str
    status: str  # pass | fail | skip
    reason: str = ""  # why skipped
    device: str = ""
    results: list[CaseResult] = field(default_factory=list)

    def by_dtype(self) -> dict[str, list[CaseResult]]:
        out: dict[str, list[CaseResult]] = {}
        for r in self.results:
            out.setdefault(r.dtype, []).append(r)
        return out

    def to_dict(self) -> dict[str, Any]:
        worst = [r.worst for r in self.results if r.worst is not None]
        return {
            "op": self.op,
            "variant": self.variant,
            "kernel": self.kernel,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "reason": self.reason,
            "device": self.device,
            "worst": _json_float(max(worst)) if worst else None,
            "cases": [r.to_dict() for r in self.results],
        }


@dataclass
class CheckReport:
    device: str
    size: str
    seed: int
    kernels: list[KernelReport] = field(default_factory=list)
    load_failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[KernelReport]:
        return [k for k in self.kernels if k.status == FAIL]

    @property
    def checked(self) -> list[KernelReport]:
        return [k for k in self.kernels if k.status != SKIP]

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "size": self.size,
            "seed": self.seed,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "load_failures": self.load_failures,
            "kernels": [k.to_dict() for k in self.kernels],
        }

    def table(self, verbose: bool = False) -> str:
        head = ("op", "variant", "kernel", "from", "dtype", "cases", "worst error", "result")
        rows: list[tuple[str, ...]] = [head]
        notes: list[str] = []
        for k in self.kernels:
            src = f"{k.distribution} {k.version}"
            if k.status == SKIP:
                rows.append((k.op, k.variant, k.kernel, src, "-", "-", "-", f"skip: {k.reason}"))
                continue
            for dtype, results in k.by_dtype().items():
                passed = sum(r.status == PASS for r in results)
                unsup = sum(r.status == UNSUPPORTED for r in results)
                bad = [r for r in results if not r.ok]
                scored = [r for r in results if r.worst is not None]
                worst = max(scored, key=lambda r: r.worst) if scored else None  # type: ignore[arg-type, return-value]
                wtxt = f"{_fmt_ratio(worst.worst)} ({worst.worst_in}, {worst.case})" if worst else "-"
                if worst is not None and worst.baseline is not None:
                    wtxt += f"; eager {_fmt_ratio(worst.baseline)}"
                cases = f"{passed}/{len(results)}" + (f" ({unsup} unsupported)" if unsup else "")
                rows.append((k.op, k.variant, k.kernel, src, dtype, cases, wtxt, "FAIL" if bad else "pass"))
                for r in bad:
                    notes.append(f"  {k.op}/{k.variant} {k.kernel} {r.describe()}")
                kernel_notes = sorted({n for r in results if r.ok for n in r.notes})
                notes += [f"  {k.op}/{k.variant} {k.kernel} [{dtype}] note: {n}" for n in kernel_notes]
                if verbose:
                    notes += [f"  {k.op}/{k.variant} {k.kernel} {r.describe()}" for r in results if r.ok]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
        lines = [f"veomni-ops check on {self.device}, {self.size} shapes, seed {self.seed} "
                 f"(worst error: max |a-b| / (atol*s + rtol*|b| + ulp) against float64 eager; pass <= 1, or in bf16/fp16 "
                 f"<= {BASELINE_FACTOR:g}x eager in the same dtype)"]
        for i, r in enumerate(rows):  # type: ignore[assignment]
            lines.append("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1])  # type: ignore[index]
            if i == 0:
                lines.append("  ".join("-" * w for w in widths) + "  ------")
        for f in self.load_failures:
            lines.append(f"load failure: {f}")
        if notes:
            lines.append("details:")
            lines += notes
        n_fail = len(self.failed)
        lines.append(f"{len(self.checked)} kernel(s) checked, {n_fail} failed, "
                     f"{len(self.kernels) - len(self.checked)} skipped, in {self.seconds:.1f} s")
        return "\n".join(lines)


def backend_matches(rk: RegisteredKernel, backend: str) -> bool:
    """``backend`` names this kernel, its plugin's entry point or its distribution
    (``liger`` matches ``veomni-liger``)."""
    want = normalize_name(backend)
    p = rk.provenance
    names = {rk.spec.name, normalize_name(p.entry_point)}
    try:
        dist = normalize_name(p.distribution)
        names |= {dist, dist.removeprefix("veomni_")}
    except Exception:
        pass
    return want in names


def resolve_kernel(rk: RegisteredKernel, registry: Registry, dev: DeviceInfo) -> Callable[..., Any]:
    """Resolve exactly ``rk`` by name (``load=True``); raises ResolutionError with the reason."""
    spec = rk.spec
    # The name a config writes for exactly this kernel: qualified where two distributions register it.
    fields: dict[str, Any] = {OP_TO_FIELD[spec.op]: registry.name_of(rk)}
    cfg = OpsConfig(**fields)
    plan = resolve(cfg, dev, needs={spec.op: [spec.variant]}, registry=registry, training=False, load=True)
    return plan.kernel(spec.op, spec.variant)


def refusal_reason(e: ResolutionError) -> str:
    return "; ".join(r.why for r in e.refusals) or str(e)


def selected_kernels(registry: Registry, backend: str | None = None, op: str | None = None) -> list[RegisteredKernel]:
    out = []
    for rk in registry:
        if op is not None and rk.spec.op != op:
            continue
        if backend is not None and not backend_matches(rk, backend):
            continue
        out.append(rk)
    return out


def run_checks(
    registry: Registry | None = None,
    *,
    backend: str | None = None,
    op: str | None = None,
    device: str | DeviceInfo | None = None,
    size: str | None = None,
    dtypes: Iterable[str] | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> CheckReport:
    """Check every kernel of ``registry`` (default: the installed plugins) that matches
    ``backend`` and ``op``; kernels that cannot run here are reported as skipped, with why."""
    from ..discovery import discover

    t0 = time.perf_counter()
    reg = registry if registry is not None else discover()
    dev = current_device(device)
    run_on = execution_device(dev)
    size = size or default_size(run_on)
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; use one of {', '.join(SIZES)}")
    where = f"{dev}" + (f" ({dev.name})" if dev.name and dev.name != dev.type else "")
    if run_on.type == "cpu" and dev.type != "cpu":
        where += " via the Triton interpreter on the CPU"
    report = CheckReport(device=where, size=size, seed=seed,
                         load_failures=[f.describe() for f in reg.failures])
    for rk in selected_kernels(reg, backend, op):
        s, p = rk.spec, rk.provenance
        kr = KernelReport(s.op, s.variant, s.name, p.distribution, p.version, SKIP, device=str(run_on))
        report.kernels.append(kr)
        try:
            _, fn, target_dev = prepare(reg, s.op, s.variant, reg.name_of(rk), dev)
        except Unusable as e:
            kr.reason = str(e)
            continue
        kr.device = str(target_dev)
        todo = kernel_dtypes(s, dtypes)
        if not todo:
            kr.reason = f"declares none of the requested dtypes (it supports {', '.join(s.dtypes)})"
            continue
        kr.results = check_kernel(fn, s, device=target_dev, size=size, dtypes=todo, seed=seed, progress=progress)
        kr.status = PASS if all(r.ok for r in kr.results) else FAIL
    report.seconds = time.perf_counter() - t0
    return report


# --------------------------------------------------------------------------- for test frameworks
class Unusable(Exception):
    """The kernel cannot be checked here; the message says why (a skip, not a failure)."""


def prepare(registry: Registry, op: str, variant: str, name: str,
            device: str | DeviceInfo | None = None) -> tuple[RegisteredKernel, Callable[..., Any], torch.device]:
    """Resolve one registered kernel for checking here: ``(registered, kernel, torch device)``.

    Raises :class:`LookupError` if no such kernel is registered (a failure: the backend does
    not provide what it claims), :class:`Unusable` if it cannot run here (a skip).
    """
    rk = registry.get(op, variant, name)
    if rk is None:
        have = ", ".join(f"{k.spec.variant}:{k.spec.name}" for k in registry.for_op(op)) or "none"
        fails = "; ".join(f.describe() for f in registry.failures)
        raise LookupError(f"no kernel {name!r} is registered for {op}/{variant} (registered for {op}: {have})"
                          + (f"; plugins that failed to load: {fails}" if fails else ""))
    dev = current_device(device)
    try:
        run_on = execution_device(dev)
    except DeviceError as e:
        raise Unusable(str(e)) from None
    try:
        fn = resolve_kernel(rk, registry, dev)
    except ResolutionError as e:
        if dev.type != "cpu" and "cpu" in rk.spec.hardware.device_types:
            try:
                return rk, resolve_kernel(rk, registry, DeviceInfo("cpu", None, "cpu")), torch.device("cpu")
            except ResolutionError as e2:
                raise Unusable(refusal_reason(e2)) from None
        raise Unusable(refusal_reason(e)) from None
    return rk, fn, run_on
