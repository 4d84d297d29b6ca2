"""``swiglu`` in ``veomni-ops bench``: its bytes, its workloads, its inputs (light: torch only
when inputs are built). See :mod:`veomni_ops.bench.workloads`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import OpWorkload

if TYPE_CHECKING:
    from ...bench.workloads import Draws, Inputs, Workload


def _bytes(sh: dict[str, int], s: int, bwd: bool) -> float:
    n, i = sh["tokens"], sh["intermediate"]
    return (8 if bwd else 3) * n * i * s


FORMULAS: dict[str, tuple[str, Any]] = {
    "swiglu": ("fwd 3·N·I·s: read gate, up, write out; fwd+bwd 8·N·I·s: backward reads gate, up, dout, "
               "writes dgate, dup", _bytes),
}

#: This op's workloads in the presets every op contributes to.
IN_PRESETS: dict[str, list[OpWorkload]] = {
    "seed": [OpWorkload("standard", "bfloat16", "bytes", dict(tokens=8192, intermediate=6912))],
    "cpu-small": [OpWorkload("standard", "float32", "bytes", dict(tokens=256, intermediate=1024))],
    "host": [OpWorkload("standard", "bfloat16", "bytes", dict(tokens=16, intermediate=256))],
}


def build_inputs(w: Workload, d: Draws) -> Inputs:
    n, i = w.shape["tokens"], w.shape["intermediate"]
    return {"gate": d.randn(n, i), "up": d.randn(n, i)}, ("gate", "up")
