"""``moe_router`` in ``veomni-ops bench``: its bytes, its workloads and presets, its inputs (light:
torch only when inputs are built). See :mod:`veomni_ops.bench.workloads`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import OpWorkload

if TYPE_CHECKING:
    from ...bench.workloads import Draws, Inputs, Workload


def _bytes(sh: dict[str, int], s: int, bwd: bool) -> float:
    t, e, k = sh["tokens"], sh["experts"], sh["top_k"]
    fwd = t * e * s + t * k * (s + 8)  # read the logits, write weights and int64 indices
    return fwd + (2 * t * e * s + t * k * (s + 8) if bwd else 0)  # read logits, dweights, indices; write dlogits


FORMULAS: dict[str, tuple[str, Any]] = {
    "moe_router": ("fwd T·E·s + T·k·(s+8): read the logits, write the weights and int64 indices; bwd adds "
                   "2·T·E·s + T·k·(s+8) (read logits, weight grads and indices, write the logits' gradient)", _bytes),
}

#: This op's workloads in the presets every op contributes to.
IN_PRESETS: dict[str, list[OpWorkload]] = {
    "cpu-small": [OpWorkload("standard", "float32", "bytes", dict(tokens=512, experts=16, top_k=2, normalize=1))],
}

#: This op's own presets: name -> (description, workloads).
PRESETS: dict[str, tuple[str, list[OpWorkload]]] = {
    "router-30b-a3b": ("Qwen3-30B-A3B's router: 8192 tokens x 128 experts, top-8, normalised; bf16 logits",
                       [OpWorkload("standard", "bfloat16", "bytes", dict(tokens=8192, experts=128, top_k=8,
                                                                         normalize=1))]),
}

#: Its presets in the default GPU run: none until the kernel has been measured in a step on a GPU.
GPU_DEFAULT: tuple[str, ...] = ()


def build_inputs(w: Workload, d: Draws) -> Inputs:
    sh = w.shape
    return {"logits": d.randn(sh["tokens"], sh["experts"]), "top_k": sh["top_k"],
            "normalize": bool(sh["normalize"])}, ("logits",)
