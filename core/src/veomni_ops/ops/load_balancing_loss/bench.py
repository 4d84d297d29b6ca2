"""``load_balancing_loss`` in ``veomni-ops bench``: its bytes, its workloads and presets, its inputs
(light: torch only when inputs are built). See :mod:`veomni_ops.bench.workloads`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import OpWorkload

if TYPE_CHECKING:
    from ...bench.workloads import Draws, Inputs, Workload


def _bytes(sh: dict[str, int], s: int, bwd: bool) -> float:
    return (3 if bwd else 1) * sh["layers"] * sh["tokens"] * sh["experts"] * s


FORMULAS: dict[str, tuple[str, Any]] = {
    "load_balancing_loss": ("fwd L·T·E·s: read every layer's router logits; fwd+bwd 3·L·T·E·s (read again, "
                            "write the gradient)", _bytes),
}

_LBL_48 = dict(layers=48, tokens=8192, experts=128, top_k=8)

#: This op's workloads in the presets every op contributes to.
IN_PRESETS: dict[str, list[OpWorkload]] = {
    "cpu-small": [OpWorkload("standard", "float32", "bytes", dict(layers=4, tokens=512, experts=16, top_k=2))],
}

#: This op's own presets: name -> (description, workloads).
PRESETS: dict[str, tuple[str, list[OpWorkload]]] = {
    "lbl-48": ("load-balancing loss: 48 layers x 8192 tokens x 128 experts, top-8, fp32 router logits",
               [OpWorkload("standard", "float32", "bytes", _LBL_48)]),
    "lbl-48-masked": ("load-balancing loss as lbl-48 with a padding mask: 48 layers x batch 4 x seq 2048, the last "
                      "eighth of every sequence padded; fp32 router logits",
                      [OpWorkload("standard", "float32", "bytes", dict(_LBL_48, batch=4, masked=1))]),
}

#: Its presets in the default GPU run.
GPU_DEFAULT = ("lbl-48",)


def build_inputs(w: Workload, d: Draws) -> Inputs:
    import torch

    from .cases import router_logits

    sh = w.shape
    if d.device.type == "cpu":
        layers = [router_logits(d.builder, sh["tokens"], sh["experts"]) for _ in range(sh["layers"])]
    else:
        layers = [d.randn(sh["tokens"], sh["experts"]) for _ in range(sh["layers"])]
    mask = None
    if sh.get("masked"):  # [batch, seq] padding mask: the last eighth of every sequence is padding
        bsz = sh["batch"]
        seq = sh["tokens"] // bsz
        mask = torch.ones(bsz, seq, dtype=torch.long, device=d.device)
        mask[:, seq - seq // 8:] = 0
    return {"gate_logits": layers, "num_experts": sh["experts"], "top_k": sh["top_k"],
            "attention_mask": mask}, ("gate_logits",)
