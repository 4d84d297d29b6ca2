"""``attention`` in ``veomni-ops bench``: its FLOPs, its workloads and presets, its inputs (light:
torch only when inputs are built). See :mod:`veomni_ops.bench.workloads`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import OpWorkload

if TYPE_CHECKING:
    from ...bench.workloads import Draws, Inputs, Workload


def _flops(sh: dict[str, int], s: int, bwd: bool) -> float:
    f = 4.0 * sh["batch"] * sh["q_heads"] * sh["seq"] * sh["seq"] * sh["head_dim"]
    if sh.get("causal", 1):
        f /= 2
    return f * (3.5 if bwd else 1.0)


FORMULAS: dict[str, tuple[str, Any]] = {
    "attention": ("FLOPs: fwd 4·B·Hq·S²·D (halved when causal); fwd+bwd 3.5x fwd (backward = 2.5 forwards)",
                  _flops),
}

#: This op's workloads in the presets every op contributes to.
IN_PRESETS: dict[str, list[OpWorkload]] = {
    "cpu-small": [OpWorkload("standard", "float32", "flops", dict(batch=1, q_heads=4, kv_heads=2, seq=256,
                                                                  head_dim=64, causal=1))],
}

#: This op's own presets: name -> (description, workloads).
PRESETS: dict[str, tuple[str, list[OpWorkload]]] = {
    f"attn{suffix}": (f"attention{what}: batch 4, seq 4096, 32 q / {kv} kv heads, head dim 128, causal, model "
                      "layout; bf16",
                      [OpWorkload("standard", "bfloat16", "flops", dict(batch=4, q_heads=32, kv_heads=kv, seq=4096,
                                                                        head_dim=128, causal=1))])
    for suffix, what, kv in (("", "", 8), ("-30b-a3b", " with Qwen3-30B-A3B's heads", 4))
}

#: Its presets in the default GPU run.
GPU_DEFAULT = ("attn", "attn-30b-a3b")


def build_inputs(w: Workload, d: Draws) -> Inputs:
    from .cases import AttentionModule

    sh = w.shape
    bsz, s, dim = sh["batch"], sh["seq"], sh["head_dim"]
    q = d.randn(bsz, s, sh["q_heads"], dim).transpose(1, 2)
    k = d.randn(bsz, s, sh["kv_heads"], dim).transpose(1, 2)
    v = d.randn(bsz, s, sh["kv_heads"], dim).transpose(1, 2)
    mod = AttentionModule(dim, bool(sh.get("causal", 1)))
    return {"module": mod, "query": q, "key": k, "value": v, "attention_mask": None, "scaling": dim**-0.5}, \
        ("query", "key", "value")
