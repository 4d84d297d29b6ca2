"""``moe_experts`` in ``veomni-ops bench``: its FLOPs, its workloads and presets, its inputs (light:
torch only when inputs are built). See :mod:`veomni_ops.bench.workloads`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..base import OpWorkload

if TYPE_CHECKING:
    from ...bench.workloads import Draws, Inputs, Workload


def _flops(sh: dict[str, int], s: int, bwd: bool) -> float:
    return (18 if bwd else 6) * sh["tokens"] * sh["top_k"] * sh["hidden"] * sh["intermediate"]


FORMULAS: dict[str, tuple[str, Any]] = {
    "moe_experts": ("FLOPs: fwd 6·T·K·H·I (gate_up 4·H·I and down 2·H·I per route); fwd+bwd 3x", _flops),
}

#: This op's workloads in the presets every op contributes to.
IN_PRESETS: dict[str, list[OpWorkload]] = {
    # bfloat16: the dtype MoE kernels train in (grouped_mm takes only bfloat16)
    "cpu-small": [OpWorkload("standard", "bfloat16", "flops", dict(tokens=128, experts=8, top_k=2, hidden=256,
                                                                   intermediate=128))],
}

#: This op's own presets: name -> (description, workloads).
PRESETS: dict[str, tuple[str, list[OpWorkload]]] = {
    "moe-30b-a3b": ("Qwen3-30B-A3B-like experts: 128 experts, top-8, hidden 2048, expert intermediate 768, 8192 "
                    "tokens; bf16",
                    [OpWorkload("standard", "bfloat16", "flops", dict(tokens=8192, experts=128, top_k=8, hidden=2048,
                                                                      intermediate=768))]),
}

#: Its presets in the default GPU run.
GPU_DEFAULT = ("moe-30b-a3b",)


def build_inputs(w: Workload, d: Draws) -> Inputs:
    import torch

    t, e, k, h, i = (w.shape[x] for x in ("tokens", "experts", "top_k", "hidden", "intermediate"))
    logits = torch.randn(t, e, generator=d.generator, device=d.device)
    top_w, top_i = torch.topk(logits.softmax(-1), k, dim=-1)
    top_w = (top_w / top_w.sum(-1, keepdim=True)).to(d.builder.dtype)
    return {"hidden_states": d.randn(t, h), "top_k_index": top_i, "top_k_weights": top_w,
            "gate_up_proj": d.randn(e, 2 * i, h, scale=1 / math.sqrt(h)),
            "down_proj": d.randn(e, h, i, scale=1 / math.sqrt(i))}, \
        ("hidden_states", "top_k_weights", "gate_up_proj", "down_proj")
