"""One conformance case: a kernel and the float64 reference on the same inputs, outputs and
gradients compared (see :mod:`veomni_ops.testing.runner` for the rule)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..spec import KernelSpec
from .cases import TORCH_DTYPES, Builder, Case, OpHarness
from .compare import BASELINE_DTYPES, BASELINE_FACTOR, Comparison, compare
from .execution import ERROR, FAIL, PASS, REFUSALS, UNSUPPORTED
from .results import CaseResult, fmt_ratio, short_error, where_raised


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


def grad_leaves(inputs: dict[str, Any], names: Sequence[str]) -> list[tuple[str, torch.Tensor]]:
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
        res.status, res.message = ERROR, f"building the inputs failed: {short_error(e)}{where_raised(e)}"
        return _done(res, t0)
    masks = h.out_masks(inputs) if h.out_masks else [None] * len(h.out_names)
    # Snapshot (leaves below share storage with these tensors) to notice writes into inputs.
    before = {name: t.detach().clone() for name, t in _tensors(inputs)}
    leaves = grad_leaves(inputs, case.diff) if want_grad else []
    ref_leaves = grad_leaves(ref_inputs, case.diff) if want_grad else []

    try:
        with torch.set_grad_enabled(want_grad):
            outs = h.call(fn, inputs, False)
    except REFUSALS as e:
        if case.optional:
            res.status, res.message = UNSUPPORTED, f"kernel refuses this input form: {short_error(e, 200)}"
        else:
            res.status, res.message = ERROR, f"kernel raised {short_error(e)}{where_raised(e)}"
        return _done(res, t0)
    except Exception as e:
        res.status, res.message = ERROR, f"kernel raised {short_error(e)}{where_raised(e)}"
        return _done(res, t0)
    try:
        with torch.set_grad_enabled(want_grad):
            ref_outs = h.call(h.reference_fn(variant), ref_inputs, True)
    except Exception as e:
        res.status, res.message = ERROR, f"the float64 eager reference raised {short_error(e)}{where_raised(e)} (a kit problem)"
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
            res.notes.append(f"eager in {dtype} could not be run for comparison: {short_error(e, 200)}")
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
                + ", ".join(f"{c.name} {fmt_ratio(c.ratio)} (eager {fmt_ratio(c.baseline)})" for c in eased))
    return _done(res, t0)


def _bad_text(c: Comparison, dtype: str) -> str:
    if c.baseline is None:
        return c.name
    return f"{c.name} ({fmt_ratio(c.ratio)}; eager in {dtype}: {fmt_ratio(c.baseline)})"


def _baseline_ratios(h, reference, case, tdtype, device, seed, ref_outs, masks, ref_grads, tol, want_grad):
    """Errors of the core's eager kernel run in the case's dtype (same inputs, rebuilt from the
    seed, same cotangent), in the same units as the kernel's: ``{tensor name: ratio}``."""
    inputs = case.build(Builder(seed, tdtype, device))
    leaves = grad_leaves(inputs, case.diff) if want_grad else []
    with torch.set_grad_enabled(want_grad):
        outs = h.call(reference, inputs, True)
    out = {}
    for name, o, r, m in zip(h.out_names, outs, ref_outs, masks):
        out[name] = compare(name, o, r, tol, m).ratio
    if want_grad and leaves and ref_grads:
        got, _ = run_backward(outs, leaves, case_cotangents(ref_outs, masks, seed))
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


def case_cotangents(ref_outs, masks, seed):
    return _cotangents(ref_outs, masks, seed + COTANGENT_SEED_OFFSET)


def run_backward(outs, leaves, cots):
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
        got, kcots = run_backward(outs, leaves, case_cotangents(ref_outs, masks, seed))
    except Exception as e:
        res.status, res.message = ERROR, f"backward raised {short_error(e)}{where_raised(e)}"
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
