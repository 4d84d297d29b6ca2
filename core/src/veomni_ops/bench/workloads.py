"""What ``veomni-ops bench`` measures: the presets (named shapes per op), the minimal bytes or
FLOPs of each op (:data:`FORMULAS`), and the inputs of one workload in the form the
conformance harness (:mod:`veomni_ops.testing.cases`) calls kernels with.

A new preset is one entry in :data:`PRESETS`. Every kernel registered for a workload's op
and variant is measured beside ``eager`` (see :mod:`veomni_ops.bench.loop`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

PASSES = ("fwd", "fwd+bwd")


@dataclass(frozen=True)
class Workload:
    """One op at one shape and dtype. ``build(device)`` returns the harness inputs (see
    :mod:`veomni_ops.testing.cases`); ``diff`` the differentiable ones; ``metric`` is
    ``"bytes"`` or ``"flops"`` and ``amount(pass)`` its minimal amount for that pass.
    ``logits`` (cross-entropy only): how the logits are distributed, ``"peaked"`` or ``"dense"``
    (see :data:`LOGITS`)."""

    preset: str
    op: str
    variant: str
    dtype: str
    shape: dict[str, int]
    metric: str
    formula: str  # the op's formula key in FORMULAS
    logits: str = ""  # cross_entropy: a key of LOGITS ("" is "peaked")

    def amount(self, pass_: str) -> float:
        return FORMULAS[self.formula][1](self.shape, itemsize(self.dtype), pass_ == "fwd+bwd")


def itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}[dtype]


def _rms_bytes(sh, s, bwd):
    n, h = sh["tokens"], sh["hidden"]
    return (5 * n * h + 3 * h) * s if bwd else (2 * n * h + h) * s


def _swiglu_bytes(sh, s, bwd):
    n, i = sh["tokens"], sh["intermediate"]
    return (8 if bwd else 3) * n * i * s


def _rotary_bytes(sh, s, bwd):
    b, hq, hk, seq, d, r = sh["batch"], sh["q_heads"], sh["kv_heads"], sh["seq"], sh["head_dim"], sh["rotary_dim"]
    qk = b * (hq + hk) * seq * d
    cs = b * seq * r
    return ((4 if bwd else 2) * qk + (4 if bwd else 2) * cs) * s


def _ce_bytes(sh, s, bwd):
    n, v = sh["tokens"], sh["vocab"]
    return (2 if bwd else 1) * n * v * s + n * 8


def _flce_flops(sh, s, bwd):
    return (6 if bwd else 2) * sh["tokens"] * sh["hidden"] * sh["vocab"]


def _moe_flops(sh, s, bwd):
    return (18 if bwd else 6) * sh["tokens"] * sh["top_k"] * sh["hidden"] * sh["intermediate"]


def _lbl_bytes(sh, s, bwd):
    return (3 if bwd else 1) * sh["layers"] * sh["tokens"] * sh["experts"] * s


def _attn_flops(sh, s, bwd):
    f = 4 * sh["batch"] * sh["q_heads"] * sh["seq"] * sh["seq"] * sh["head_dim"]
    if sh.get("causal", 1):
        f /= 2
    return f * (3.5 if bwd else 1.0)


#: op formula -> (text, function(shape, itemsize, backward) -> bytes or FLOPs). s = bytes per element.
FORMULAS: dict[str, tuple[str, Callable[[dict, int, bool], float]]] = {
    "rms_norm": ("fwd (2·N·H + H)·s: read x, w, write y; fwd+bwd (5·N·H + 3·H)·s: backward reads x, w, dy, "
                 "writes dx, dw", _rms_bytes),
    "swiglu": ("fwd 3·N·I·s: read gate, up, write out; fwd+bwd 8·N·I·s: backward reads gate, up, dout, "
               "writes dgate, dup", _swiglu_bytes),
    "rotary": ("fwd 2·(Q+K)·s + 2·C·s: read q, k, cos, sin, write q', k'; fwd+bwd twice that (backward reads "
               "dq', dk', cos, sin, writes dq, dk); Q = B·Hq·S·D, K = B·Hk·S·D, C = B·S·R", _rotary_bytes),
    "cross_entropy/logits": ("fwd N·V·s: read the logits once; fwd+bwd 2·N·V·s: read logits, write their "
                             "gradient (+ 8·N for the labels)", _ce_bytes),
    "cross_entropy/fused_linear": ("FLOPs: fwd 2·N·H·V (logits GEMM); fwd+bwd 6·N·H·V (plus the two gradient "
                                   "GEMMs)", _flce_flops),
    "moe_experts": ("FLOPs: fwd 6·T·K·H·I (gate_up 4·H·I and down 2·H·I per route); fwd+bwd 3x", _moe_flops),
    "load_balancing_loss": ("fwd L·T·E·s: read every layer's router logits; fwd+bwd 3·L·T·E·s (read again, "
                            "write the gradient)", _lbl_bytes),
    "attention": ("FLOPs: fwd 4·B·Hq·S²·D (halved when causal); fwd+bwd 3.5x fwd (backward = 2.5 forwards)",
                  _attn_flops),
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


def _w(preset, op, variant, dtype, metric, formula=None, logits="", **shape) -> Workload:
    return Workload(preset, op, variant, dtype, dict(shape), metric, formula or op, logits)


def _seed(p: str) -> list[Workload]:
    bf = "bfloat16"
    rope = dict(batch=4, q_heads=32, kv_heads=8, seq=2048, head_dim=128)
    return [
        _w(p, "rms_norm", "standard", bf, "bytes", tokens=8192, hidden=2560),
        _w(p, "rms_norm", "offset", bf, "bytes", tokens=8192, hidden=2560),
        _w(p, "swiglu", "standard", bf, "bytes", tokens=8192, intermediate=6912),
        _w(p, "rotary", "full", bf, "bytes", rotary_dim=128, **rope),
        _w(p, "rotary", "partial", bf, "bytes", rotary_dim=64, **rope),
    ]


def _flce(p: str, tokens: int, logits: str = "peaked") -> list[Workload]:
    bf = "bfloat16"
    return [
        _w(p, "cross_entropy", "fused_linear", bf, "flops", "cross_entropy/fused_linear", logits,
           tokens=tokens, hidden=2560, vocab=151936),
        _w(p, "cross_entropy", "logits", bf, "bytes", "cross_entropy/logits", logits, tokens=tokens, vocab=151936),
    ]


def _flce_preset(tokens: int, logits: str) -> tuple[str, Callable[[str], list[Workload]]]:
    what = "peaked" if logits == "peaked" else "dense (stress: not what training sees)"
    return (f"cross-entropy, {tokens} tokens, hidden 2560, vocabulary 151936 (Qwen); fused linear and from logits; "
            f"bf16; every 7th label ignored; {what}: {LOGITS[logits]}",
            lambda p: _flce(p, tokens, logits))


def _cpu_small(p: str) -> list[Workload]:
    f32, bf = "float32", "bfloat16"
    return [
        _w(p, "rms_norm", "standard", f32, "bytes", tokens=256, hidden=512),
        _w(p, "rms_norm", "offset", f32, "bytes", tokens=256, hidden=512),
        _w(p, "swiglu", "standard", f32, "bytes", tokens=256, intermediate=1024),
        _w(p, "rotary", "full", f32, "bytes", batch=1, q_heads=4, kv_heads=2, seq=128, head_dim=64, rotary_dim=64),
        _w(p, "rotary", "partial", f32, "bytes", batch=1, q_heads=4, kv_heads=2, seq=128, head_dim=64,
           rotary_dim=16),
        _w(p, "cross_entropy", "logits", f32, "bytes", "cross_entropy/logits", "peaked", tokens=256, vocab=4096),
        _w(p, "cross_entropy", "fused_linear", f32, "flops", "cross_entropy/fused_linear", "peaked",
           tokens=256, hidden=256, vocab=4096),
        # bfloat16: the dtype MoE kernels train in (grouped_mm takes only bfloat16)
        _w(p, "moe_experts", "standard", bf, "flops", tokens=128, experts=8, top_k=2, hidden=256, intermediate=128),
        _w(p, "load_balancing_loss", "standard", f32, "bytes", layers=4, tokens=512, experts=16, top_k=2),
        _w(p, "attention", "standard", f32, "flops", batch=1, q_heads=4, kv_heads=2, seq=256, head_dim=64, causal=1),
    ]


def _host(p: str) -> list[Workload]:
    bf = "bfloat16"
    return [
        _w(p, "rms_norm", "standard", bf, "bytes", tokens=16, hidden=256),
        _w(p, "rotary", "full", bf, "bytes", batch=1, q_heads=4, kv_heads=2, seq=16, head_dim=64, rotary_dim=64),
        _w(p, "swiglu", "standard", bf, "bytes", tokens=16, intermediate=256),
    ]


#: preset name -> (description, workloads)
PRESETS: dict[str, tuple[str, Callable[[str], list[Workload]]]] = {
    "seed": ("the seed benchmark: batch 4 x seq 2048 tokens, hidden 2560, intermediate 6912; RoPE 32 q / 8 kv "
             "heads, head dim 128 (partial: 64 rotary channels); bf16", _seed),
    "moe-30b-a3b": ("Qwen3-30B-A3B-like experts: 128 experts, top-8, hidden 2048, expert intermediate 768, 8192 "
                    "tokens; bf16",
                    lambda p: [_w(p, "moe_experts", "standard", "bfloat16", "flops", tokens=8192, experts=128,
                                  top_k=8, hidden=2048, intermediate=768)]),
    "flce-8k": _flce_preset(8192, "peaked"),
    "flce-16k": _flce_preset(16384, "peaked"),
    "flce-32k": _flce_preset(32768, "peaked"),
    "flce-8k-dense": _flce_preset(8192, "dense"),
    "flce-16k-dense": _flce_preset(16384, "dense"),
    "flce-32k-dense": _flce_preset(32768, "dense"),
    "lbl-48": ("load-balancing loss: 48 layers x 8192 tokens x 128 experts, top-8, fp32 router logits",
               lambda p: [_w(p, "load_balancing_loss", "standard", "float32", "bytes", layers=48, tokens=8192,
                             experts=128, top_k=8)]),
    "attn": ("attention: batch 4, seq 4096, 32 q / 8 kv heads, head dim 128, causal, model layout; bf16",
             lambda p: [_w(p, "attention", "standard", "bfloat16", "flops", batch=4, q_heads=32, kv_heads=8,
                           seq=4096, head_dim=128, causal=1)]),
    "attn-30b-a3b": ("attention with Qwen3-30B-A3B's heads: batch 4, seq 4096, 32 q / 4 kv heads, head dim 128, "
                     "causal, model layout; bf16",
                     lambda p: [_w(p, "attention", "standard", "bfloat16", "flops", batch=4, q_heads=32, kv_heads=4,
                                   seq=4096, head_dim=128, causal=1)]),
    "lbl-48-masked": ("load-balancing loss as lbl-48 with a padding mask: 48 layers x batch 4 x seq 2048, the last "
                      "eighth of every sequence padded; fp32 router logits",
                      lambda p: [_w(p, "load_balancing_loss", "standard", "float32", "bytes", layers=48, tokens=8192,
                                    experts=128, top_k=8, batch=4, masked=1)]),
    "rope-qwen35": ("partial rotary as Qwen3.5 has it: batch 2, seq 2048, 16 q / 2 kv heads, head dim 256, 64 rotary "
                    "channels, model layout; bf16",
                    lambda p: [_w(p, "rotary", "partial", "bfloat16", "bytes", batch=2, q_heads=16, kv_heads=2,
                                  seq=2048, head_dim=256, rotary_dim=64)]),
    "host": ("rms_norm, rotary and swiglu at tiny shapes: each kernel takes microseconds, so wall time is the host's "
             "per call (checks, dispatch, autograd, launch); bf16", _host),
    "cpu-small": ("every op at small shapes (runs anywhere; the default on the CPU); cross-entropy on peaked logits",
                  _cpu_small),
}
GPU_DEFAULT = ("seed", "moe-30b-a3b", "flce-8k", "flce-16k", "flce-32k", "lbl-48", "attn", "attn-30b-a3b")
CPU_DEFAULT = ("cpu-small",)


def workloads(presets: Sequence[str], op: str | None = None) -> list[Workload]:
    out = []
    for name in presets:
        if name not in PRESETS:
            raise SystemExit(f"veomni-ops bench: unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        out += [w for w in PRESETS[name][1](name) if op is None or w.op == op]
    return out


#: A workload's inputs by name, and the names of the differentiable ones.
Inputs = tuple[dict[str, Any], tuple[str, ...]]


def _cross_entropy_inputs(w: Workload, b: Any, g: Any, randn: Callable[..., Any]) -> Inputs:
    """A cross-entropy workload's inputs, its logits as :data:`LOGITS` says (``b``: the
    :class:`~veomni_ops.testing.cases.Builder`, ``g`` the device generator, ``randn`` the dense draws)."""
    import torch

    from ..ops.cross_entropy.cases import peaked_linear, peaked_logits

    sh = w.shape
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
        z = peaked_logits(gauss, n, v).to(b.dtype) if peaked else randn(n, v, scale=2.0)
        return {"logits": z, "labels": labels, "ignore_index": -100}, ("logits",)
    h = sh["hidden"]
    if peaked:
        hidden, weight = (t.to(b.dtype) for t in peaked_linear(gauss, n, h, v))
    else:
        hidden, weight = randn(n, h), randn(v, h, scale=2.0 / math.sqrt(h))
    return {"hidden": hidden, "weight": weight, "labels": labels, "ignore_index": -100, "bias": None}, \
        ("hidden", "weight")


def build_inputs(w: Workload, device: Any, seed: int = 0) -> Inputs:
    """Inputs for ``w`` in the form the conformance harness calls kernels with."""
    import torch

    from ..testing.cases import TORCH_DTYPES, AttentionModule, Builder, cos_sin, router_logits

    b = Builder(seed, TORCH_DTYPES[w.dtype], device)
    sh = w.shape
    dev = torch.device(device)

    g = torch.Generator(device=dev).manual_seed(seed)

    def randn(*shape, scale=1.0, dtype=None):
        # Generated on the device: float64 on the CPU (as the conformance kit does) is far too slow here.
        return (torch.randn(shape, generator=g, device=dev, dtype=torch.float32) * scale).to(dtype or b.dtype)

    if w.op == "rms_norm":
        shift = 1.0 if w.variant == "standard" else 0.0
        return {"hidden_states": randn(sh["tokens"], sh["hidden"]),
                "weight": randn(sh["hidden"], scale=0.1) + shift, "eps": 1e-6}, ("hidden_states", "weight")
    if w.op == "swiglu":
        return {"gate": randn(sh["tokens"], sh["intermediate"]), "up": randn(sh["tokens"], sh["intermediate"])}, \
            ("gate", "up")
    if w.op == "rotary":
        bsz, s, d = sh["batch"], sh["seq"], sh["head_dim"]
        # the model layout: [B, S, H, D] projections viewed as [B, H, S, D]
        q = randn(bsz, s, sh["q_heads"], d).transpose(1, 2)
        k = randn(bsz, s, sh["kv_heads"], d).transpose(1, 2)
        cos, sin = cos_sin(b, bsz, s, sh["rotary_dim"])
        return {"q": q, "k": k, "cos": cos, "sin": sin}, ("q", "k")
    if w.op == "cross_entropy":
        return _cross_entropy_inputs(w, b, g, randn)
    if w.op == "moe_experts":
        t, e, k, h, i = sh["tokens"], sh["experts"], sh["top_k"], sh["hidden"], sh["intermediate"]
        logits = torch.randn(t, e, generator=g, device=dev)
        top_w, top_i = torch.topk(logits.softmax(-1), k, dim=-1)
        top_w = (top_w / top_w.sum(-1, keepdim=True)).to(b.dtype)
        return {"hidden_states": randn(t, h), "top_k_index": top_i, "top_k_weights": top_w,
                "gate_up_proj": randn(e, 2 * i, h, scale=1 / math.sqrt(h)),
                "down_proj": randn(e, h, i, scale=1 / math.sqrt(i))}, \
            ("hidden_states", "top_k_weights", "gate_up_proj", "down_proj")
    if w.op == "load_balancing_loss":
        if dev.type == "cpu":
            layers = [router_logits(b, sh["tokens"], sh["experts"]) for _ in range(sh["layers"])]
        else:
            layers = [randn(sh["tokens"], sh["experts"]) for _ in range(sh["layers"])]
        mask = None
        if sh.get("masked"):  # [batch, seq] padding mask: the last eighth of every sequence is padding
            bsz = sh["batch"]
            seq = sh["tokens"] // bsz
            mask = torch.ones(bsz, seq, dtype=torch.long, device=dev)
            mask[:, seq - seq // 8:] = 0
        return {"gate_logits": layers, "num_experts": sh["experts"], "top_k": sh["top_k"],
                "attention_mask": mask}, ("gate_logits",)
    if w.op == "attention":
        bsz, s, d = sh["batch"], sh["seq"], sh["head_dim"]
        q = randn(bsz, s, sh["q_heads"], d).transpose(1, 2)
        k = randn(bsz, s, sh["kv_heads"], d).transpose(1, 2)
        v = randn(bsz, s, sh["kv_heads"], d).transpose(1, 2)
        mod = AttentionModule(d, bool(sh.get("causal", 1)))
        return {"module": mod, "query": q, "key": k, "value": v, "attention_mask": None, "scaling": d**-0.5}, \
            ("query", "key", "value")
    raise ValueError(f"no workload builder for op {w.op!r}")

