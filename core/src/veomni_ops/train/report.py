"""Comparing runs: the loss check (every run against the first, a stated tolerance), speed
and memory ratios, the printed report and the chart."""

from __future__ import annotations

import math
from typing import Any

#: Default relative loss tolerances (see ``default_loss_tol``).
LOSS_TOL_FP32 = 1e-3
LOSS_TOL_LOW_PRECISION = 2e-2
LOW_PRECISION_DTYPES = ("bfloat16", "float16", "half")




def default_loss_tol(runs: list[dict[str, Any]]) -> float:
    """1e-3 when every run is float32/float64, 2e-2 when any is bfloat16/float16.

    Runs of the same math from the same seed and data differ only by rounding, which AdamW
    does not amplify much over tens of steps. In float32 on a CPU the demo's kernels stay
    within 1-2 float32 ulps of the loss (about 1e-7 relative, 60 steps, dense and MoE); on a
    GPU, Triton's ``tl.dot`` rounds float32 inputs to TF32 (about 5e-4 per product) unless a
    kernel asks otherwise, so 1e-3 is the tightest bound that such kernels still pass, and it
    still fails a kernel that changes the math (a wrong norm offset, rotary layout or lr moves
    the loss by far more). It cannot see changes below 0.1% of the loss (a dropped
    load-balancing term with coefficient 1e-3, say): pass a smaller ``--loss-tol`` for that.
    bfloat16 keeps 8 bits (2**-8 = 4e-3 relative per value); 30 bf16 steps on an H100 differed
    by up to 3.1e-3 relative (Liger vs eager; 1.4e-3 FA4 vs SDPA, 7.7e-4 Triton MoE vs eager,
    benchmarks/results/h100-2026-11-21/), so 2e-2 leaves about 6x headroom.
    """
    low = any(str(r.get("dtype")) in LOW_PRECISION_DTYPES for r in runs)
    return LOSS_TOL_LOW_PRECISION if low else LOSS_TOL_FP32


def tolerance_rule(ref: str, tol: float, source: str) -> str:
    return f"every loss finite, and |loss - loss of {ref}| <= {tol:g} x max(|loss of {ref}|, 1) at every step ({source})"


def check_run(ref: dict[str, Any], run: dict[str, Any], tol: float) -> dict[str, Any]:
    """Is every loss of ``run`` finite, and within ``tol`` (relative, floor 1) of ``ref`` at every step?"""
    nonfinite = [[i + 1, repr(x)] for i, x in enumerate(run["losses"]) if not math.isfinite(x)]
    n = min(len(ref["losses"]), len(run["losses"]))
    max_diff = max_step = worst = None
    for i in range(n):
        a, b = ref["losses"][i], run["losses"][i]
        if not (math.isfinite(a) and math.isfinite(b)):
            continue
        d, allowed = abs(b - a), tol * max(abs(a), 1.0)
        if max_diff is None or d > max_diff:
            max_diff, max_step = d, i + 1
        if worst is None or d / allowed > worst[2] / worst[3]:
            worst = (i + 1, a, d, allowed)
    same = run is ref
    within = worst is None or worst[2] <= worst[3]
    res: dict[str, Any] = {
        "run": run["run"], "reference": ref["run"], "passed": not nonfinite and (same or within),
        "nonfinite_steps": nonfinite, "steps_compared": n,
        "max_loss_diff": None if same else max_diff, "max_loss_diff_step": None if same else max_step,
        "worst_step": None if same or worst is None else worst[0],
        "worst_diff": None if same or worst is None else worst[2],
        "worst_allowed": None if same or worst is None else worst[3],
    }
    if nonfinite:
        shown = ", ".join(f"step {s}: {v}" for s, v in nonfinite[:3]) + (", ..." if len(nonfinite) > 3 else "")
        res["message"] = f"{len(nonfinite)} loss(es) not finite ({shown})"
    elif same:
        res["message"] = "every loss finite (the reference)"
    elif worst is None:
        res["message"] = "no step to compare"
    else:
        verb = "within" if within else "OVER"
        res["message"] = (f"largest |loss diff| {max_diff:.3g} (step {max_step}); at step {worst[0]} "
                          f"{worst[2]:.3g} is {verb} the {worst[3]:.3g} allowed ({worst[2] / worst[3]:.2g} of it)")
    if len(ref["losses"]) != len(run["losses"]) and not same:
        res["message"] += f"; only the first {n} steps compared ({len(ref['losses'])} vs {len(run['losses'])} steps)"
    return res


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The two-run summary ``--compare`` has always given (kept in --json as "compare")."""
    n = min(len(a["losses"]), len(b["losses"]))
    diffs = [abs(x - y) for x, y in zip(a["losses"][:n], b["losses"][:n])]
    finite = [d for d in diffs if math.isfinite(d)]
    return {
        "max_loss_diff": max(finite) if finite else None,
        "max_loss_diff_step": (diffs.index(max(finite)) + 1) if finite else None,
        "speed_ratio": a["tokens_per_s"] / b["tokens_per_s"],
        "peak_memory_ratio": a["peak_gib"] / b["peak_gib"] if b["peak_gib"] else None,
    }


def _ratio(x: float) -> str:
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def _iqrs_overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["tokens_per_s_p25"] <= b["tokens_per_s_p75"] and b["tokens_per_s_p25"] <= a["tokens_per_s_p75"]


def report(runs: list[dict[str, Any]], refs: list[int], loss_tol: float | None) -> dict[str, Any]:
    """Checks and ratios of ``runs`` (the first is the loss reference; ``refs`` index the speed references)."""
    tol = default_loss_tol(runs) if loss_tol is None else loss_tol
    source = "--loss-tol" if loss_tol is not None else (
        "default for bfloat16/float16 runs" if tol == LOSS_TOL_LOW_PRECISION else "default for float32 runs")
    checks = [check_run(runs[0], r, tol) for r in runs]
    ratios = {
        runs[j]["run"]: [r["tokens_per_s"] / runs[j]["tokens_per_s"] if runs[j]["tokens_per_s"] else None for r in runs]
        for j in refs
    }
    return {
        "reference": runs[0]["run"], "loss_tol": tol, "loss_tol_source": source,
        "rule": tolerance_rule(runs[0]["run"], tol, source), "checks": checks,
        "passed": all(c["passed"] for c in checks),
        "speed_ratio_vs": ratios, "cpu_timing": any(r["device"].startswith("cpu") for r in runs),
        "peak_memory_ratio_vs": {
            runs[j]["run"]: [r["peak_gib"] / runs[j]["peak_gib"] if runs[j]["peak_gib"] else None for r in runs]
            for j in refs
        },
    }


def print_report(runs: list[dict[str, Any]], rep: dict[str, Any], out) -> None:
    refs = list(rep["speed_ratio_vs"])
    noisy = " (CPU timing: noisy)" if rep["cpu_timing"] else ""
    print(f"\n== comparison (same seed, data and steps); tok/s: median [p25..p75] over steady steps{noisy}", file=out)
    name_w = max(len("run"), *(len(r["run"]) for r in runs)) + 2
    head = (f"  {'run':<{name_w}}{'tok/s':>10} {'[p25..p75]':<20}{'warm-up':>8}{'peak GiB':>10}{'final loss':>12}"
            f"{'max |dloss|':>13}")
    head += "".join(f"{'vs ' + r:>{max(10, len(r) + 5)}}" for r in refs)
    print(head, file=out)
    packed = {r["run"]: r["data"] for r in runs if r.get("data")}
    for name, d in packed.items():  # packed documents: the losses are per token of them
        print(f"  ({name}: packed documents, {d['documents_per_row']:.1f} per row, mean length "
              f"{d['mean_doc_len']:.1f} tokens)", file=out)
    checkpointed = [r["run"] for r in runs if r.get("gradient_checkpointing")]
    if checkpointed:  # the baselines take the job's train.gradient_checkpointing; a --compare job its own
        which = ("every run" if len(checkpointed) == len(runs) else
                 f"{', '.join(checkpointed)} only: the others keep their activations, not like for like")
        print(f"  gradient checkpointing (decoder layers recomputed in the backward): {which}", file=out)
    checks = {c["run"]: c for c in rep["checks"]}
    for i, r in enumerate(runs):
        spread = f"[{r['tokens_per_s_p25']:.0f}..{r['tokens_per_s_p75']:.0f}]"
        diff = checks[r["run"]]["max_loss_diff"]
        line = (f"  {r['run']:<{name_w}}{r['tokens_per_s']:>10.0f} {spread:<20}{r['warmup_steps']:>8}"
                f"{r['peak_gib']:>10.2f}{r['final_loss']:>12.4f}{'-' if diff is None else f'{diff:.3g}':>13}")
        for ref in refs:
            ratio = rep["speed_ratio_vs"][ref][i]
            line += f"{'-' if ratio is None else _ratio(ratio):>{max(10, len(ref) + 5)}}"
        print(line, file=out)
    first = runs[0]
    for ref in refs:
        j = next(k for k, r in enumerate(runs) if r["run"] == ref)
        ratio = rep["speed_ratio_vs"][ref][0]
        if ratio is None or j == 0:
            continue
        notes = ["of medians"] + (["CPU timing: noisy"] if rep["cpu_timing"] else [])
        if _iqrs_overlap(first, runs[j]):
            notes.append("their p25..p75 ranges overlap: no clear difference")
        print(f"  speed ratio {first['run']} / {ref}: {_ratio(ratio)} ({'; '.join(notes)})", file=out)
        mem = rep["peak_memory_ratio_vs"][ref][0]
        if mem is not None:
            print(f"  peak memory ratio {first['run']} / {ref}: {mem:.2f}x ({first['peak_kind']})", file=out)
    print(f"  loss check: {rep['rule']}", file=out)
    for c in rep["checks"]:
        print(f"  {'PASS' if c['passed'] else 'FAIL'} {c['run']}: {c['message']}", file=out)
    print(("PASS" if rep["passed"] else "FAIL") + f": {sum(c['passed'] for c in rep['checks'])}/{len(rep['checks'])} "
          "runs pass the loss check", file=out)


def plot(runs: list[dict[str, Any]], rep: dict[str, Any], path: str) -> None:
    """Loss curves of every run, each run's loss difference from the first, and each run's tokens/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_diff, ax_rate) = plt.subplots(1, 3, figsize=(17, 4.8))
    styles = ["-", "--", ":", "-."]
    ref = runs[0]["losses"]
    for k, r in enumerate(runs):
        losses = [x if math.isfinite(x) else float("nan") for x in r["losses"]]
        steps = range(1, len(losses) + 1)
        ax_loss.plot(steps, losses, styles[k % 4], label=r["run"], linewidth=1.4)
        if k:
            diff = [abs(x - y) if math.isfinite(x - y) and x != y else float("nan") for x, y in zip(losses, ref)]
            ax_diff.plot(range(1, len(diff) + 1), diff, styles[k % 4], color=f"C{k}", label=r["run"], marker=".")
    ax_loss.set(xlabel="step", ylabel="loss", title="loss (same seed and data)")
    ax_loss.legend(fontsize=8)
    allowed = [rep["loss_tol"] * max(abs(x), 1.0) if math.isfinite(x) else float("nan") for x in ref]
    ax_diff.plot(range(1, len(allowed) + 1), allowed, color="red", linewidth=1, label=f"allowed ({rep['loss_tol']:g} rel.)")
    ax_diff.set_yscale("log")
    ax_diff.set(xlabel="step", ylabel=f"|loss - loss of {runs[0]['run']}|", title="loss difference from the first run")
    ax_diff.legend(fontsize=8)
    xs = list(range(len(runs)))
    med = [r["tokens_per_s"] for r in runs]
    err = [[m - r["tokens_per_s_p25"] for m, r in zip(med, runs)], [r["tokens_per_s_p75"] - m for m, r in zip(med, runs)]]
    ax_rate.bar(xs, med, yerr=err, capsize=5, color=[f"C{k}" for k in xs], alpha=0.8)
    ax_rate.set_xticks(xs)
    ax_rate.set_xticklabels([r["run"] for r in runs], rotation=20, ha="right", fontsize=8)
    ax_rate.set_ylabel("tokens/s (median; whiskers p25..p75)")
    warm = "/".join(map(str, sorted({r["warmup_steps"] for r in runs})))
    ax_rate.set_title(f"tokens/s, {warm} warm-up step(s) excluded" + ("\n(CPU timing: noisy)" if rep["cpu_timing"] else ""))
    r0 = runs[0]
    fig.suptitle(f"{r0['architecture']}  {r0['dtype']}  batch {r0['batch_size']} x seq {r0['seq_len']}  "
                 f"{r0['steps']} steps on {r0['device']}  loss check: {'PASS' if rep['passed'] else 'FAIL'}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def finite_json(obj: Any) -> Any:
    """``obj`` with NaN and infinities as null, so that --json prints strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj
