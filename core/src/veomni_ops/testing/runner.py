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

The kit's modules: :mod:`~veomni_ops.testing.cases` (inputs per op, as data, from the op
folders), :mod:`~veomni_ops.testing.execution` (where cases run), :mod:`~veomni_ops.testing.compare`
(the rule above), :mod:`~veomni_ops.testing.case_check` (one case),
:mod:`~veomni_ops.testing.prepare` (one registered kernel resolved for checking, for test
frameworks too), :mod:`~veomni_ops.testing.compiles` (the compile check),
:mod:`~veomni_ops.testing.results` (reports), and this module: one kernel, many kernels
(``run_checks``). Their names stay importable from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..device import DeviceInfo, current_device
from ..registry import RegisteredKernel, Registry
from ..spec import KernelSpec, normalize_name
from .case_check import case_cotangents, check_case, grad_leaves, run_backward
from .cases import SIZES, TORCH_DTYPES, Builder, Case, OpHarness, harness
from .compare import BASELINE_DTYPES, BASELINE_FACTOR, ZERO_RMS, Comparison, compare, ulp, unit_scale
from .execution import (
    ERROR,
    FAIL,
    PASS,
    REFUSALS,
    SKIP,
    UNSUPPORTED,
    cpu_threads_for,
    default_size,
    execution_device,
    interpreter_active,
)
from .prepare import Unusable, case_seed, kernel_dtypes, prepare, refusal_reason, resolve_kernel
from .results import CaseResult, CheckReport, KernelReport

#: What callers (the kit's test bases, ``veomni-ops check`` and ``bench``, backends' own tests)
#: import from here; the comparison, one case and the reports live in their own modules.
__all__ = [
    "BASELINE_DTYPES", "BASELINE_FACTOR", "ERROR", "FAIL", "PASS", "REFUSALS", "SIZES", "SKIP", "TORCH_DTYPES",
    "UNSUPPORTED", "ZERO_RMS", "Builder", "Case", "CaseResult", "CheckReport", "Comparison", "KernelReport",
    "OpHarness", "Unusable", "backend_matches", "case_cotangents", "case_seed", "check_case", "check_kernel",
    "compare", "cpu_threads_for", "default_size", "determinism_problem", "execution_device", "grad_leaves", "harness",
    "interpreter_active", "kernel_dtypes", "prepare", "refusal_reason", "resolve_kernel", "run_backward",
    "run_checks", "selected_kernels", "ulp", "unit_scale",
]

# --------------------------------------------------------------------------- one kernel


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


# --------------------------------------------------------------------------- many kernels


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
    cases: Iterable[str] | None = None,
    compile: bool = False,
    deterministic: bool = False,
) -> CheckReport:
    """Check every kernel of ``registry`` (default: the installed plugins) that matches
    ``backend`` and ``op``; kernels that cannot run here are reported as skipped, with why.

    ``cases``: only the cases of these names. ``compile``: also run each checked kernel under
    ``torch.compile(fullgraph=True)`` against its uncompiled result
    (:func:`veomni_ops.testing.conformance.check_compiles`); a kernel that declares
    ``supports_compile=True`` and fails it fails."""
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
        kr.results = check_kernel(fn, s, device=target_dev, size=size, dtypes=todo, seed=seed, progress=progress,
                                  cases=cases)
        kr.status = PASS if all(r.ok for r in kr.results) else FAIL
        if compile:
            kr.compile = _compile_verdict(reg, rk, dev)
            if kr.compile.startswith("FAIL"):
                kr.status = FAIL
        if deterministic:
            problem = determinism_problem(fn, s, device=target_dev, size=size, dtypes=todo, seed=seed, cases=cases)
            kr.deterministic = "pass" if problem is None else f"FAIL: {problem}"
            if problem is not None:
                kr.status = FAIL
    report.seconds = time.perf_counter() - t0
    return report


def determinism_problem(fn: Callable[..., Any], spec: KernelSpec, *, device: torch.device | str, size: str,
                        dtypes: Iterable[str] | None = None, seed: int = 0,
                        cases: Iterable[str] | None = None) -> str | None:
    """Run every case twice on the same inputs, forward and (if declared) backward with the same
    cotangents: ``None`` when every output and gradient is bitwise the same, else what differed.
    A case the kernel refuses or fails is left to the conformance check."""
    h = harness(spec.op)
    wanted = set(cases) if cases is not None else None
    with cpu_threads_for(device, size):
        for dtype in kernel_dtypes(spec, dtypes):
            for i, case in enumerate(h.cases(spec.variant, size)):
                if wanted is not None and case.name not in wanted:
                    continue
                runs = []
                try:
                    for _ in range(2):
                        inputs = case.build(Builder(case_seed(seed, i), TORCH_DTYPES[dtype], device))
                        leaves = grad_leaves(inputs, case.diff) if spec.supports_backward else []
                        outs = h.call(fn, inputs, False)
                        grads = []
                        if leaves:
                            cots = case_cotangents([o.detach() for o in outs], [None] * len(outs), case_seed(seed, i))
                            got, _ = run_backward(outs, leaves, cots)
                            grads = list(got or [])
                        runs.append([o.detach() for o in outs] + [g for g in grads if g is not None])
                except Exception:
                    continue
                for j, (a, b) in enumerate(zip(*runs)):
                    if not torch.equal(a, b):
                        what = "output" if j < len(h.out_names) else "gradient"
                        return f"{dtype} {case.name}: the {what} #{j} differs between two runs on the same inputs"
    return None


def _compile_verdict(reg: Registry, rk: RegisteredKernel, dev: DeviceInfo) -> str:
    from .compiles import ConformanceFailure, check_compiles

    try:
        why = check_compiles(reg, rk.spec.op, rk.spec.variant, reg.name_of(rk), device=dev)
    except ConformanceFailure as e:
        return f"FAIL: {e}"
    return "pass" if why is None else f"skip: {why}"


# --------------------------------------------------------------------------- for test frameworks


