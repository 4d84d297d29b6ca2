"""The chart of a result: speed-up over eager per workload and kernel (needs matplotlib)."""

from __future__ import annotations

from typing import Any

from .render import kernel_cell
from .workloads import PASSES


def matplotlib_problem() -> str | None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return ("--plot needs matplotlib, which is not installed: pip install matplotlib "
                "(or leave out --plot; the JSON and .md results do not need it)")
    return None


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
        labels = [f"{r['preset']} {r['op']}/{r['variant']} {kernel_cell(r)}" for r in rows]
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
