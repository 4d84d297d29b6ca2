"""``rotary`` in ``veomni-ops bench``: its bytes, its workloads and presets, its inputs (light:
torch only when inputs are built). See :mod:`veomni_ops.bench.workloads`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import OpWorkload

if TYPE_CHECKING:
    from ...bench.workloads import Draws, Inputs, Workload


def _bytes(sh: dict[str, int], s: int, bwd: bool) -> float:
    b, hq, hk, seq, d, r = sh["batch"], sh["q_heads"], sh["kv_heads"], sh["seq"], sh["head_dim"], sh["rotary_dim"]
    qk = b * (hq + hk) * seq * d
    cs = b * seq * r
    return ((4 if bwd else 2) * qk + (4 if bwd else 2) * cs) * s


FORMULAS: dict[str, tuple[str, Any]] = {
    "rotary": ("fwd 2·(Q+K)·s + 2·C·s: read q, k, cos, sin, write q', k'; fwd+bwd twice that (backward reads "
               "dq', dk', cos, sin, writes dq, dk); Q = B·Hq·S·D, K = B·Hk·S·D, C = B·S·R", _bytes),
}

_SEED = dict(batch=4, q_heads=32, kv_heads=8, seq=2048, head_dim=128)
_SMALL = dict(batch=1, q_heads=4, kv_heads=2, seq=128, head_dim=64)

#: This op's workloads in the presets every op contributes to.
IN_PRESETS: dict[str, list[OpWorkload]] = {
    "seed": [OpWorkload("full", "bfloat16", "bytes", dict(_SEED, rotary_dim=128)),
             OpWorkload("partial", "bfloat16", "bytes", dict(_SEED, rotary_dim=64))],
    "cpu-small": [OpWorkload("full", "float32", "bytes", dict(_SMALL, rotary_dim=64)),
                  OpWorkload("partial", "float32", "bytes", dict(_SMALL, rotary_dim=16))],
    "host": [OpWorkload("full", "bfloat16", "bytes",
                        dict(batch=1, q_heads=4, kv_heads=2, seq=16, head_dim=64, rotary_dim=64))],
}

#: This op's own presets: name -> (description, workloads).
PRESETS: dict[str, tuple[str, list[OpWorkload]]] = {
    "rope-qwen35": ("partial rotary as Qwen3.5 has it: batch 2, seq 2048, 16 q / 2 kv heads, head dim 256, 64 rotary "
                    "channels, model layout; bf16",
                    [OpWorkload("partial", "bfloat16", "bytes", dict(batch=2, q_heads=16, kv_heads=2, seq=2048,
                                                                     head_dim=256, rotary_dim=64))]),
}


def build_inputs(w: Workload, d: Draws) -> Inputs:
    from .cases import cos_sin

    sh = w.shape
    bsz, s, dim = sh["batch"], sh["seq"], sh["head_dim"]
    # the model layout: [B, S, H, D] projections viewed as [B, H, S, D]
    q = d.randn(bsz, s, sh["q_heads"], dim).transpose(1, 2)
    k = d.randn(bsz, s, sh["kv_heads"], dim).transpose(1, 2)
    cos, sin = cos_sin(d.builder, bsz, s, sh["rotary_dim"])
    return {"q": q, "k": k, "cos": cos, "sin": sin}, ("q", "k")
