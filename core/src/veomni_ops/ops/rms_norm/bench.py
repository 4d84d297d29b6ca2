"""``rms_norm`` in ``veomni-ops bench``: its bytes, its workloads, its inputs (light: torch only
when inputs are built). See :mod:`veomni_ops.bench.workloads`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import OpWorkload

if TYPE_CHECKING:
    from ...bench.workloads import Draws, Inputs, Workload


def _bytes(sh: dict[str, int], s: int, bwd: bool) -> float:
    n, h = sh["tokens"], sh["hidden"]
    return (5 * n * h + 3 * h) * s if bwd else (2 * n * h + h) * s


FORMULAS: dict[str, tuple[str, Any]] = {
    "rms_norm": ("fwd (2·N·H + H)·s: read x, w, write y; fwd+bwd (5·N·H + 3·H)·s: backward reads x, w, dy, "
                 "writes dx, dw", _bytes),
}

#: This op's workloads in the presets every op contributes to.
IN_PRESETS: dict[str, list[OpWorkload]] = {
    "seed": [OpWorkload(v, "bfloat16", "bytes", dict(tokens=8192, hidden=2560)) for v in ("standard", "offset")],
    "cpu-small": [OpWorkload(v, "float32", "bytes", dict(tokens=256, hidden=512)) for v in ("standard", "offset")],
    "host": [OpWorkload("standard", "bfloat16", "bytes", dict(tokens=16, hidden=256))],
}


def build_inputs(w: Workload, d: Draws) -> Inputs:
    sh = w.shape
    shift = 1.0 if w.variant == "standard" else 0.0
    return {"hidden_states": d.randn(sh["tokens"], sh["hidden"]),
            "weight": d.randn(sh["hidden"], scale=0.1) + shift, "eps": 1e-6}, ("hidden_states", "weight")
