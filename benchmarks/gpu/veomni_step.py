"""The training step of a VeOmni-built model beside VeOmni's own kernel selection (issue 25).

Same model (Qwen3-MoE, a size preset of ``veomni_ops.train.job.SIZES``), same synthetic data
(``veomni_ops.train.model.synthetic_batches``), same steps, AdamW, every model cast to one dtype
(bf16 by default, as ``veomni-ops train`` casts), sdpa attention in every run. Runs, each in a
process of its own (building a VeOmni model patches transformers for the whole process):

  a  VeOmni's builder with VeOmni's own kernel selection: ``fused_triton`` experts, Liger loss
     (fused linear + cross-entropy), RMSNorm, rotary and SwiGLU, ``triton`` load-balancing loss
     (the defaults of VeOmni's ``OpsImplementationConfig``). Needs CUDA, liger-kernel and triton.
  e  VeOmni's builder with every VeOmni op ``eager``: the reference of (b)'s loss check.
  b  the model of (e), bound by ``veomni_ops.apply(model, OPS)`` (OPS: sdpa attention, the rest auto).
  c  plain transformers (the same config, sdpa attention).
  d  the model of (c), bound by ``veomni_ops.apply(model, OPS)``.

Loss checks (``veomni_ops.train.report.check_run``, the tolerance ``veomni-ops train --compare``
uses: 2e-2 relative for bf16/fp16, 1e-3 for fp32): b against e (required: a VeOmni user gets our
kernels with the losses of VeOmni's eager path), a against e and d against c (for information).

    python benchmarks/gpu/veomni_step.py --device cuda --size small --steps 30 --out gpu-results/veomni-step

Prints one JSON line per run and one for the checks, then a markdown table; with --out, also
writes runs.jsonl, table.md and each run's log there. A run that cannot run here (run a without
a GPU) is reported as skipped, saying why; the other runs go on. Needs ``veomni`` (0.1.12,
installed --no-deps) for a, b and e; benchmarks/gpu/veomni_step.sh installs it on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

RUNS = {
    "a": "VeOmni builder, VeOmni's kernels (fused_triton experts, Liger CE/RMSNorm/rotary/SwiGLU, triton aux loss)",
    "e": "VeOmni builder, VeOmni's eager selection (reference of b)",
    "b": "VeOmni builder, eager selection, bound by veomni_ops.apply",
    "c": "plain transformers",
    "d": "transformers, bound by veomni_ops.apply",
}
VEOMNI_RUNS = ("a", "e", "b")
#: VeOmni's own selection (the defaults of its OpsImplementationConfig, written out), sdpa attention.
VEOMNI_KERNELS = dict(attn_implementation="sdpa", moe_implementation="fused_triton",
                      cross_entropy_loss_implementation="liger_kernel", rms_norm_implementation="liger_kernel",
                      swiglu_mlp_implementation="liger_kernel", rotary_pos_emb_implementation="liger_kernel",
                      load_balancing_loss_implementation="triton")
VEOMNI_EAGER = {k: ("sdpa" if k == "attn_implementation" else "eager") for k in VEOMNI_KERNELS}
#: What (b) and (d) ask veomni-ops for: every op auto, attention sdpa as in the other runs.
OPS = {"attn_implementation": "sdpa"}
#: Loss checks: (run, reference, required).
CHECKS = (("b", "e", True), ("a", "e", False), ("d", "c", False))


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--size", default="small", choices=("tiny", "small"))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--warmup", type=int, default=1, help="steps left out of the median (default 1)")
    p.add_argument("--runs", default="a,e,b,c,d", help="comma-separated, of: " + ", ".join(RUNS))
    p.add_argument("--timeout", type=int, default=300, help="seconds per run (default 300)")
    p.add_argument("--out", help="folder for runs.jsonl, table.md and the runs' logs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    runs = [r.strip() for r in a.runs.split(",") if r.strip()]
    bad = [r for r in runs if r not in RUNS]
    if bad:
        p.error(f"--runs: unknown {', '.join(bad)}; choose from {', '.join(RUNS)}")
    if a.device.split(":")[0] not in ("cpu", "cuda"):
        p.error(f"--device {a.device!r}: write cuda or cpu")
    if a.steps <= a.warmup:
        p.error(f"--steps {a.steps} must exceed --warmup {a.warmup} (the median is over the steps after it)")
    a.runs = runs
    return a


# ---- one run (a child process) -------------------------------------------------------------------


def _why_not(run: str, device: str) -> str | None:
    """Why ``run`` cannot run on ``device`` here (None: it can)."""
    import importlib.util

    if run in VEOMNI_RUNS and importlib.util.find_spec("veomni") is None:
        return ("veomni is not installed: install veomni==0.1.12 with --no-deps (and psutil), as "
                "benchmarks/gpu/veomni_step.sh does")
    if run == "a":
        if not device.startswith("cuda"):
            return ("VeOmni's own kernel selection is GPU-only (Liger and Triton kernels: fused_triton experts, "
                    "liger_kernel loss/RMSNorm/rotary/SwiGLU, triton aux loss); it cannot run on the CPU. "
                    "Run it with --device cuda on a GPU machine")
        missing = [m for m in ("liger_kernel", "triton") if importlib.util.find_spec(m) is None]
        if missing:
            return f"VeOmni's kernels need {' and '.join(missing)}: install them (veomni_step.sh carries liger-kernel)"
    return None


def _config(a: argparse.Namespace):
    from veomni_ops.train.model import build_config

    job = {"architecture": "qwen3_moe", "size": a.size, "config_file": None, "overrides": {}}
    cfg = build_config(job, attn_implementation="sdpa")
    cfg.architectures = ["Qwen3MoeForCausalLM"]  # VeOmni's builder picks its class by this
    return cfg


def _veomni_model(a: argparse.Namespace, device: str, ops: dict[str, str]):
    import torch
    from veomni.arguments.arguments_types import OpsImplementationConfig
    from veomni.models import build_foundation_model

    torch.manual_seed(a.seed)
    model = build_foundation_model(_config(a), torch_dtype="float32", init_device=device.split(":")[0],
                                   ops_implementation=OpsImplementationConfig(**ops))
    if not type(model).__module__.startswith("veomni.models.transformers."):
        raise RuntimeError(f"VeOmni's builder gave {type(model).__module__}.{type(model).__name__}, not one of "
                           "its generated classes: is MODELING_BACKEND set to something other than veomni?")
    from veomni.ops.dispatch import OpsConfigSlot, OpSlot

    mod = sys.modules[type(model).__module__]
    slots: dict[str, str] = {}  # what VeOmni bound in its generated module: op/variant -> kernel
    for name in dir(mod):
        obj = getattr(mod, name, None)
        if isinstance(obj, OpSlot):
            slots[f"{obj.op_name}/{obj.variant}"] = obj._impl_name
        elif isinstance(obj, OpsConfigSlot):
            slots[obj.field_name] = obj.value
    return model, {"veomni_ops_config": ops, "veomni_slots": slots, "model_class": type(model).__module__}


def _bind(model, device: str) -> dict[str, Any]:
    import veomni_ops
    from veomni_ops.train.job import plan_device

    binding = veomni_ops.apply(model, OPS, device=plan_device(device))
    print(binding.plan.table(), file=sys.stderr)
    kernels: dict[str, list[str]] = {}
    for _, op, _, kernel in binding.bound:
        kernels.setdefault(op, [])
        if kernel not in kernels[op]:
            kernels[op].append(kernel)
    return {"ops": OPS, "bound": binding.summary(), "kernels": kernels, "places_left": len(binding.skipped)}


def _build(run: str, a: argparse.Namespace, device: str):
    import torch

    facts: dict[str, Any] = {}
    if run in VEOMNI_RUNS:
        model, facts = _veomni_model(a, device, VEOMNI_KERNELS if run == "a" else VEOMNI_EAGER)
    else:
        import transformers

        torch.manual_seed(a.seed)
        with torch.device(device):
            model = transformers.Qwen3MoeForCausalLM(_config(a))
        facts["model_class"] = type(model).__module__
    model = model.to(device=device, dtype=getattr(torch, a.dtype))
    if run in ("b", "d"):
        facts.update(_bind(model, device))
    return model, facts


def child(run: str, a: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers
    from veomni_ops.train.loop import rate_stats
    from veomni_ops.train.model import peak_bytes, synthetic_batches

    device = a.device
    why = _why_not(run, device)
    if why:
        return {"run": run, "skipped": why}
    model, facts = _build(run, a, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    losses: list[float] = []
    rates: list[float] = []
    tokens = a.batch_size * a.seq_len
    for i, ids in enumerate(synthetic_batches(model.config.vocab_size, a.batch_size, a.seq_len, a.steps, a.seed,
                                              device)):
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))  # the one host sync per step
        rates.append(tokens / (time.perf_counter() - t0))
        print(f"[{run}] step {i + 1}/{a.steps} loss {losses[-1]:.4f} {rates[-1]:.0f} tok/s", file=sys.stderr)
    peak, what = peak_bytes(device)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    if run in VEOMNI_RUNS:
        from importlib.metadata import version

        versions["veomni"] = version("veomni")
        if run == "a":
            versions["liger_kernel"] = version("liger-kernel")
    return {"run": run, "about": RUNS[run], **facts, "device": device, "dtype": a.dtype, "size": a.size,
            "batch_size": a.batch_size, "seq_len": a.seq_len, "steps": a.steps, "seed": a.seed,
            **rate_stats(rates, a.warmup), "step_tokens_per_s": rates, "losses": losses,
            "peak_gib": peak / 2**30, "peak_kind": what, "versions": versions,
            "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None}


# ---- the parent: every run in its own process, then the checks and the table --------------------


def _run(run: str, a: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    log = os.path.join(a.out, f"{run}.log") if a.out else None
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--child", run]
    print(f"run {run}: {RUNS[run]}", file=sys.stderr, flush=True)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        res: dict[str, Any] = {"run": run, "error": f"timed out after {a.timeout} s (--timeout)"}
    else:
        err = p.stderr
        lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
        if p.returncode == 0 and lines:
            res = json.loads(lines[-1])
        else:
            tail = "\n".join(err.strip().splitlines()[-8:])
            res = {"run": run, "error": f"exit {p.returncode}: {tail}"}
    if log:
        with open(log, "w") as f:
            f.write(err)
    res["wall_s"] = round(time.time() - t0, 1)
    if "skipped" in res:
        print(f"run {run}: SKIPPED: {res['skipped']}", file=sys.stderr, flush=True)
    elif "error" in res:
        print(f"run {run}: FAILED: {res['error']}", file=sys.stderr, flush=True)
    return res


def checks(results: dict[str, dict[str, Any]], dtype: str) -> list[dict[str, Any]]:
    from veomni_ops.train.report import check_run, default_loss_tol

    tol = default_loss_tol([{"dtype": dtype}])
    out = []
    for run, ref, required in CHECKS:
        r, f = results.get(run), results.get(ref)
        if not r or not f:
            continue
        if "losses" not in r or "losses" not in f:
            out.append({"run": run, "reference": ref, "required": required, "passed": None,
                        "why": f"{run if 'losses' not in r else ref} did not run"})  # skipped or failed
            continue
        c = check_run(f, r, tol)
        out.append({**c, "required": required, "loss_tol": tol,
                    "rule": f"|loss - loss of {ref}| <= {tol:g} x max(|loss of {ref}|, 1) at every step"})
    return out


def table(results: dict[str, dict[str, Any]], cks: list[dict[str, Any]]) -> str:
    done = [r for r in results.values() if "tokens_per_s" in r]
    base = results.get("c", {}).get("tokens_per_s")
    first = next(iter(done), {})
    lines = [f"Qwen3-MoE {first.get('size', '?')}, {first.get('dtype', '?')}, batch {first.get('batch_size', '?')} x "
             f"{first.get('seq_len', '?')}, {first.get('steps', '?')} steps, sdpa attention, device "
             f"{first.get('gpu') or first.get('device', '?')}; tokens/s: median after {first.get('warmup_steps', '?')} "
             "warm-up step(s)", "",
             "| run | what | tokens/s | vs plain transformers | peak GiB | final loss |", "|---|---|---|---|---|---|"]
    for run, r in results.items():
        if "tokens_per_s" in r:
            speed = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
            lines.append(f"| {run} | {RUNS[run]} | {r['tokens_per_s']:.0f} | {speed} | {r['peak_gib']:.2f} "
                         f"({r['peak_kind']}) | {r['losses'][-1]:.4f} |")
        else:
            lines.append(f"| {run} | {RUNS[run]} | {'skipped' if 'skipped' in r else 'FAILED'}: "
                         f"{(r.get('skipped') or r.get('error', '')).replace(chr(10), ' ')[:400]} | | | |")
    lines += ["", "| loss check | result | worst step: diff / allowed |", "|---|---|---|"]
    for c in cks:
        res = {True: "passed", False: "FAILED", None: f"not checked ({c.get('why')})"}[c["passed"]]
        worst = (f"step {c['worst_step']}: {c['worst_diff']:.2e} / {c['worst_allowed']:.2e}"
                 if c.get("worst_step") else "-")
        lines.append(f"| {c['run']} vs {c['reference']}{' (required)' if c['required'] else ''} | {res} | {worst} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = _args(argv)
    if a.child:
        print(json.dumps(child(a.child, a)))
        return 0
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    results = {run: _run(run, a, argv) for run in a.runs}
    cks = checks(results, a.dtype)
    text = table(results, cks)
    for r in results.values():
        print(json.dumps(r))
    print(json.dumps({"checks": cks}))
    print(text)
    if a.out:
        with open(os.path.join(a.out, "runs.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in [*results.values(), {"checks": cks}])
        with open(os.path.join(a.out, "table.md"), "w") as f:
            f.write(text + "\n")
    failed = [r["run"] for r in results.values() if "error" in r]
    bad = [c for c in cks if c["required"] and c["passed"] is False]
    if failed or bad:
        print(f"failed runs: {failed or 'none'}; required loss checks failed: {len(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
