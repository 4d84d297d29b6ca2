"""``residual_rms_norm`` in ``veomni-ops bench``: its bytes, its workloads, its inputs (light: torch
only when inputs are built). See :mod:`veomni_ops.bench.workloads`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import OpWorkload

if TYPE_CHECKING:
    from ...bench.workloads import Draws, Inputs, Workload


def _bytes(sh: dict[str, int], s: int, bwd: bool) -> float:
    n, h = sh["tokens"], sh["hidden"]
    return (9 * n * h + 3 * h) * s if bwd else (4 * n * h + h) * s


FORMULAS: dict[str, tuple[str, Any]] = {
    "residual_rms_norm": ("fwd (4·N·H + H)·s: read x, residual, w, write normed, summed; fwd+bwd (9·N·H + 3·H)·s: "
                          "backward reads summed, w, dnormed, dsummed, writes dx (= dresidual), dw", _bytes),
}

#: This op's workloads in the presets every op contributes to.
IN_PRESETS: dict[str, list[OpWorkload]] = {
    "seed": [OpWorkload("standard", "bfloat16", "bytes", dict(tokens=8192, hidden=2560))],
    "cpu-small": [OpWorkload("standard", "float32", "bytes", dict(tokens=256, hidden=512))],
}


def build_inputs(w: Workload, d: Draws) -> Inputs:
    sh = w.shape
    return {"x": d.randn(sh["tokens"], sh["hidden"]), "residual": d.randn(sh["tokens"], sh["hidden"]),
            "weight": d.randn(sh["hidden"], scale=0.1) + 1.0, "eps": 1e-6}, ("x", "residual", "weight")
