"""``cross_entropy`` in ``veomni-ops bench``: bytes (from logits) and FLOPs (fused linear), how the
logits are drawn (:data:`LOGITS`), its workloads and presets, its inputs (light: torch only when
inputs are built). See :mod:`veomni_ops.bench.workloads`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..base import OpWorkload

if TYPE_CHECKING:
    from ...bench.workloads import Draws, Inputs, Workload


def _ce_bytes(sh: dict[str, int], s: int, bwd: bool) -> float:
    n, v = sh["tokens"], sh["vocab"]
    return (2 if bwd else 1) * n * v * s + n * 8


def _flce_flops(sh: dict[str, int], s: int, bwd: bool) -> float:
    return (6 if bwd else 2) * sh["tokens"] * sh["hidden"] * sh["vocab"]


FORMULAS: dict[str, tuple[str, Any]] = {
    "cross_entropy/logits": ("fwd N·V·s: read the logits once; fwd+bwd 2·N·V·s: read logits, write their "
                             "gradient (+ 8·N for the labels)", _ce_bytes),
    "cross_entropy/fused_linear": ("FLOPs: fwd 2·N·H·V (logits GEMM); fwd+bwd 6·N·H·V (plus the two gradient "
                                   "GEMMs)", _flce_flops),
}


#: How a cross-entropy workload's logits are distributed (its rows' softmax decides how much a
#: kernel that skips gradient tiles below 2^-12, as Cut Cross-Entropy does, can skip).
LOGITS: dict[str, str] = {
    "peaked": "peaked logits, as a trained model's rows are: the logit of vocabulary id v is -ln(v + 1) + N(0, 1) "
              "noise (Zipf exponent 1); fused: a constant hidden feature whose weight column is -ln(v + 1), the rest "
              "random (at V 151936 the top 1% of ids hold ~2/3 of a row's mass and ~85% of 128 x 128 gradient tiles "
              "lie wholly below 2^-12)",
    "dense": "dense random logits, a stress case no model produces: randn of scale 2 from logits; fused: randn hidden "
             "states and a randn weight of scale 2/sqrt(H) (flat rows, largest probability ~0.008, and an entry above "
             "2^-12 in every 128 x 128 gradient tile)",
}


def _flce(tokens: int, logits: str) -> list[OpWorkload]:
    return [
        OpWorkload("fused_linear", "bfloat16", "flops", dict(tokens=tokens, hidden=2560, vocab=151936),
                   "cross_entropy/fused_linear", logits),
        OpWorkload("logits", "bfloat16", "bytes", dict(tokens=tokens, vocab=151936), "cross_entropy/logits", logits),
    ]


def _flce_preset(tokens: int, logits: str) -> tuple[str, list[OpWorkload]]:
    what = "peaked" if logits == "peaked" else "dense (stress: not what training sees)"
    return (f"cross-entropy, {tokens} tokens, hidden 2560, vocabulary 151936 (Qwen); fused linear and from logits; "
            f"bf16; every 7th label ignored; {what}: {LOGITS[logits]}", _flce(tokens, logits))


#: This op's workloads in the presets every op contributes to.
IN_PRESETS: dict[str, list[OpWorkload]] = {
    "cpu-small": [
        OpWorkload("logits", "float32", "bytes", dict(tokens=256, vocab=4096), "cross_entropy/logits", "peaked"),
        OpWorkload("fused_linear", "float32", "flops", dict(tokens=256, hidden=256, vocab=4096),
                   "cross_entropy/fused_linear", "peaked"),
    ],
}

#: This op's own presets: name -> (description, workloads).
PRESETS: dict[str, tuple[str, list[OpWorkload]]] = {
    f"flce-{tokens // 1024}k{suffix}": _flce_preset(tokens, logits)
    for suffix, logits in (("", "peaked"), ("-dense", "dense")) for tokens in (8192, 16384, 32768)
}

#: Its presets in the default GPU run.
GPU_DEFAULT = ("flce-8k", "flce-16k", "flce-32k")


def build_inputs(w: Workload, d: Draws) -> Inputs:
    """A cross-entropy workload's inputs, its logits as :data:`LOGITS` says."""
    import torch

    from .cases import peaked_linear, peaked_logits

    sh, b, g = w.shape, d.builder, d.generator
    n, v = sh["tokens"], sh["vocab"]
    labels = torch.randint(0, v, (n,), generator=g, device=b.device)
    labels[::7] = -100  # some tokens do not count, as with padding / prompts
    kind = w.logits or "peaked"  # the default: what training sees
    if kind not in LOGITS:
        raise ValueError(f"cross_entropy workload {w.preset!r}: logits must be one of {', '.join(LOGITS)}, "
                         f"got {w.logits!r}")
    peaked = kind == "peaked"

    def gauss(*shape):  # float32 standard normal on the device, cast after the construction
        return torch.randn(shape, generator=g, device=b.device, dtype=torch.float32)

    if w.variant == "logits":
        z = peaked_logits(gauss, n, v).to(b.dtype) if peaked else d.randn(n, v, scale=2.0)
        return {"logits": z, "labels": labels, "ignore_index": -100}, ("logits",)
    h = sh["hidden"]
    if peaked:
        hidden, weight = (t.to(b.dtype) for t in peaked_linear(gauss, n, h, v))
    else:
        hidden, weight = d.randn(n, h), d.randn(v, h, scale=2.0 / math.sqrt(h))
    return {"hidden": hidden, "weight": weight, "labels": labels, "ignore_index": -100, "bias": None}, \
        ("hidden", "weight")
