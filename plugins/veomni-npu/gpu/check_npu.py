#!/usr/bin/env python
"""Check every kernel veomni-npu registers on a REAL Ascend NPU (nothing else has run one).

Runs the core's conformance kit (``veomni_ops.testing``: float64 eager reference, forward and
backward, every declared dtype, odd sizes, strided inputs, idle / hot experts, duplicate
routes) for the ``npu`` kernels at ``--size small`` and ``full``, on the NPU, then (unless
``--no-compile``) probes whether ``torch.compile(fullgraph=True)`` traces each kernel and
matches its eager result (the specs claim ``supports_compile=False`` until this says so).
Prints a table and writes everything as JSON (``--json PATH``). Every case is caught and
reported on its own: the script runs once, blind.

Usage (from the repository root, or anywhere: the script finds core/ and the plugin)::

    python plugins/veomni-npu/gpu/check_npu.py --json npu_check.json

Needs: an Ascend NPU (Atlas A2/A3 for bf16, npu_swiglu and the MoE permutation), the CANN
toolkit sourced, torch and the matching torch-npu (>= 2.7.1 for the MoE kernel); veomni-ops
and veomni-npu installed or in this checkout. Exit status 1 if any case fails or errors.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[3]
for p in (REPO / "core" / "src", HERE.parents[1] / "src"):
    if p.is_dir() and str(p) not in sys.path:
        sys.path.insert(0, str(p))


def environment() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import torch_npu

        info["torch_npu"] = getattr(torch_npu, "__version__", "?")
        info["torch_npu_path"] = getattr(torch_npu, "__file__", "?")
        info["stand_in"] = bool(getattr(torch_npu, "IS_STAND_IN", False))
        info["npu_available"] = bool(hasattr(torch, "npu") and torch.npu.is_available())
        if info["npu_available"]:
            info["npu_name"] = torch.npu.get_device_name(0)
    except Exception as e:  # report, then stop in main()
        info["torch_npu_error"] = f"{type(e).__name__}: {e}"
    return info


def registry():
    from importlib import metadata

    import veomni_npu.specs as specs
    from veomni_ops import build_registry, discover
    from veomni_ops.hookspecs import ENTRY_POINT_GROUP

    installed = any(ep.value == "veomni_npu.specs" for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))
    return discover() if installed else build_registry([("veomni-npu", specs)])


def _to(x, device, dtype=None):
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().to(device=device, dtype=dtype if (dtype and x.is_floating_point()) else x.dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device, dtype) for v in x)
    return x


def _grad_leaves(case, dev_inputs: dict, ref_inputs: dict) -> tuple[list, list]:
    """Make the case's differentiable inputs require grad, on the device and in the reference:
    ``([(name, device tensor)], [reference tensor])``."""
    import torch

    leaves, ref_leaves = [], []
    for name in case.diff:
        if isinstance(dev_inputs.get(name), torch.Tensor):
            dev_inputs[name] = dev_inputs[name].requires_grad_()
            ref_inputs[name] = ref_inputs[name].requires_grad_()
            leaves.append((name, dev_inputs[name]))
            ref_leaves.append(ref_inputs[name])
    return leaves, ref_leaves


def _call_kernel(h, fn, inputs: dict, case, row: dict):
    """The kernel's outputs; ``None`` (and the row marked ``unsupported``) where it refuses an
    optional input form (e.g. an additive attention mask), which the kit does not count as a failure."""
    from veomni_ops.testing.runner import REFUSALS

    try:
        return h.call(fn, inputs, False)
    except REFUSALS as e:
        if not case.optional:
            raise
        row["status"], row["refused"] = "unsupported", f"{type(e).__name__}: {str(e)[:300]}"
        return None


def check_case(fn, spec, h, case, dtype: str, device, seed: int) -> dict:
    """One case: the kernel on ``device``, the float64 eager reference on the CPU.

    (The kit's own runner builds inputs and runs the float64 reference on the device under
    test; Ascend NPUs have little float64 support, so here both stay on the CPU and only the
    kernel's inputs, outputs and gradients cross over. Strided inputs arrive contiguous.)
    """
    import torch
    from veomni_ops.testing.cases import TORCH_DTYPES, Builder
    from veomni_ops.testing.runner import compare

    tol = spec.tolerance(dtype)
    row = {"case": case.name, "dtype": dtype, "status": "pass", "tensors": {}}
    try:
        cpu_inputs = case.build(Builder(seed, TORCH_DTYPES[dtype], "cpu"))
        ref_inputs = {k: _to(v, "cpu", torch.float64) for k, v in cpu_inputs.items()}
        dev_inputs = {k: _to(v, device) for k, v in cpu_inputs.items()}
        leaves, ref_leaves = _grad_leaves(case, dev_inputs, ref_inputs)
        outs = _call_kernel(h, fn, dev_inputs, case, row)
        if outs is None:
            return row
        ref_outs = h.call(h.reference_fn(spec.variant), ref_inputs, True)
        masks = h.out_masks(cpu_inputs) if h.out_masks else [None] * len(ref_outs)
        allowed = h.out_dtypes(TORCH_DTYPES[dtype])
        for name, out, ref, m, ok_dtypes in zip(h.out_names, outs, ref_outs, masks, allowed):
            if tuple(out.shape) != tuple(ref.shape) or out.dtype not in ok_dtypes:
                raise AssertionError(f"{name}: shape {tuple(out.shape)} dtype {out.dtype}, expected "
                                     f"{tuple(ref.shape)} in {ok_dtypes}")
            c = compare(name, out.detach().cpu(), ref.detach(), tol, None if m is None else m.cpu())
            row["tensors"][name] = c.ratio
        gen = torch.Generator().manual_seed(seed + 7919)
        cots = []
        for ref, m in zip(ref_outs, masks):
            c = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
            cots.append(c if m is None else c * m.cpu().to(torch.float64))
        pairs = [(o, r, c) for o, r, c in zip(outs, ref_outs, cots) if o.requires_grad]
        if leaves and pairs:
            kc = [c.to(o.dtype) for o, _, c in pairs]  # rounded to the output dtype; the reference gets the same
            got = torch.autograd.grad([o for o, _, _ in pairs], [t for _, t in leaves],
                                      [k.to(device) for k in kc], allow_unused=True)
            want = torch.autograd.grad([r for _, r, _ in pairs], ref_leaves, [k.double() for k in kc],
                                       allow_unused=True)
            for (name, leaf), g, w in zip(leaves, got, want):
                w = torch.zeros(leaf.shape, dtype=torch.float64) if w is None else w
                if g is None:
                    row["tensors"][f"grad {name}"] = float("inf") if bool((w != 0).any()) else 0.0
                    continue
                row["tensors"][f"grad {name}"] = compare(f"grad {name}", g.detach().cpu(), w, tol).ratio
        elif leaves:
            raise AssertionError("no output requires grad: the kernel is not differentiable")
        worst = max(row["tensors"].values()) if row["tensors"] else 0.0
        row["worst"] = worst
        if not worst <= 1.0:
            row["status"] = "fail"
    except Exception as e:
        row["status"] = "error"
        row["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        row["traceback"] = traceback.format_exc()[-2000:]
    return row


def conformance(reg, size: str, seed: int, device: str, dtypes: list[str] | None = None) -> dict:
    from veomni_ops import parse_device
    from veomni_ops.testing.cases import harness
    from veomni_ops.testing.runner import case_seed, resolve_kernel

    t0 = time.perf_counter()
    kernels = []
    for rk in sorted((k for k in reg if k.spec.name == "npu"), key=lambda k: k.spec.key):
        s = rk.spec
        entry = {"op": s.op, "variant": s.variant, "cases": []}
        try:
            fn = resolve_kernel(rk, reg, parse_device("npu"))
        except Exception as e:
            entry["error"] = f"cannot resolve: {type(e).__name__}: {e}"
            kernels.append(entry)
            print(f"{s.op}/{s.variant}: {entry['error']}")
            continue
        h = harness(s.op)
        for dtype in [d for d in s.dtypes if dtypes is None or d in dtypes]:
            for i, case in enumerate(h.cases(s.variant, size)):
                row = check_case(fn, s, h, case, dtype, device, case_seed(seed, i))
                entry["cases"].append(row)
                status = row["status"] if row["status"] != "pass" else f"pass (worst {row['worst']:.3g})"
                status += f" ({row['refused'][:120]})" if "refused" in row else ""
                print(f"{size} {s.op}/{s.variant} {dtype} {case.name}: {status} {row.get('error', '')[:200]}")
        entry["ok"] = all(r["status"] in ("pass", "unsupported") for r in entry["cases"])
        kernels.append(entry)
    return {"ok": all(k.get("ok", False) for k in kernels), "kernels": kernels,
            "seconds": round(time.perf_counter() - t0, 2)}


def compile_probe(reg, seed: int, device: str) -> list[dict]:
    import torch
    from veomni_ops import parse_device
    from veomni_ops.testing.cases import TORCH_DTYPES, Builder, harness
    from veomni_ops.testing.runner import grad_leaves, resolve_kernel

    results = []
    for rk in [k for k in reg if k.spec.name == "npu"]:
        s = rk.spec
        row = {"op": s.op, "variant": s.variant}
        try:
            fn = resolve_kernel(rk, reg, parse_device("npu"))
            h = harness(s.op)
            case = h.cases(s.variant, "small")[0]
            inputs = {k: _to(v, device) for k, v in case.build(Builder(seed, TORCH_DTYPES["bfloat16"], "cpu")).items()}
            leaves = [t for _, t in grad_leaves(inputs, case.diff)]
            eager = h.call(fn, inputs, False)
            torch._dynamo.reset()
            compiled = torch.compile(fn, fullgraph=True)
            got = h.call(compiled, inputs, False)
            row["traces"] = True
            row["max_abs_diff_vs_eager"] = max(float((a.detach().float() - b.detach().float()).abs().max())
                                               for a, b in zip(got, eager))
            loss = sum(o.float().sum() for o in got)
            if leaves:
                torch.autograd.grad(loss, leaves)
                row["backward"] = True
        except Exception as e:
            row["traces"] = row.get("traces", False)
            row["error"] = f"{type(e).__name__}: {str(e)[:500]}"
            row["traceback"] = traceback.format_exc()[-2000:]
        print(f"compile {s.op}/{s.variant}: " + ("ok" if "error" not in row else row["error"][:200]))
        results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the full report here")
    ap.add_argument("--sizes", default="small,full", help="comma-separated conformance sizes (small, full)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dtypes", help="comma-separated dtypes (default: every dtype each kernel declares)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile probe")
    ap.add_argument("--smoke", action="store_true",
                    help="exercise this script on the CPU with the test suite's stand-in torch_npu (no NPU; "
                         "checks the script, not the kernels)")
    args = ap.parse_args(argv)
    if args.smoke:
        sys.path.insert(0, str(HERE.parents[1] / "tests" / "standins"))

    report: dict = {"environment": environment(), "conformance": {}, "compile": None}
    env = report["environment"]
    print(json.dumps(env, indent=2))
    ok = True
    device = "cpu" if args.smoke else "npu"
    if args.smoke and not env.get("stand_in"):
        report["error"] = "--smoke needs the stand-in torch_npu (a real one is imported)"
        print("check_npu: " + report["error"], file=sys.stderr)
        ok = False
    elif not args.smoke and (env.get("stand_in") or not env.get("npu_available")):
        report["error"] = "no real Ascend NPU here (torch_npu missing, the test stand-in, or no device)"
        print("check_npu: " + report["error"], file=sys.stderr)
        ok = False
    else:
        reg = registry()
        for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
            try:
                report["conformance"][size] = r = conformance(reg, size, args.seed, device, args.dtypes.split(",") if args.dtypes else None)
                ok &= r["ok"]
            except Exception as e:
                report["conformance"][size] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                               "traceback": traceback.format_exc()[-2000:]}
                ok = False
        if not args.no_compile:
            report["compile"] = compile_probe(reg, args.seed, device)
    report["ok"] = ok
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
