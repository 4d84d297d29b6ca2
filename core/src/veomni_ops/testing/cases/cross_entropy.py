"""The cross_entropy harness and cases (from logits, and fused with the linear head)."""

from __future__ import annotations

import math

import torch

from .base import Builder, Case, OpHarness, loss_dtypes, pick


def _labels(b: Builder, n: int, v: int, ignore_index: int, frac_ignored: float) -> torch.Tensor:
    labels = b.randint(0, v, n)
    drop = torch.rand(n, generator=b.gen) < frac_ignored
    return torch.where(drop.to(labels.device), torch.full_like(labels, ignore_index), labels)


def _ce_call(fn, inp, reference):
    if "logits" in inp:
        out = fn(inp["logits"], inp["labels"], ignore_index=inp["ignore_index"])
    else:
        kw = {"ignore_index": inp["ignore_index"]}
        if inp.get("bias") is not None:
            kw["bias"] = inp["bias"]
        out = fn(inp["hidden"], inp["weight"], inp["labels"], **kw)
    return (out,)


def _ce_logits_cases(size: str) -> list[Case]:
    def case(name, about, n, v, *, scale=3.0, ignore_index=-100, frac=0.25, pad=0):
        def build(b: Builder):
            logits = b.strided(n, v, pad=pad, scale=scale) if pad else b.randn(n, v, scale=scale)
            return {"logits": logits, "labels": _labels(b, n, v, ignore_index, frac), "ignore_index": ignore_index}

        return Case(name, build, ("logits",), about)

    small = [
        case("mixed-13x37", "a quarter of the labels ignored", 13, 37),
        case("all-ignored-5x16", "every label is ignore_index: loss 0, gradients 0", 5, 16, frac=1.0),
        case("ignore-index-3-9x20", "ignore_index=3, a real class id (not the default -100)", 9, 20,
             ignore_index=3, frac=0.4),
        case("strided-rows-11x50", "rows with a stride", 11, 50, pad=14),
        case("large-logits-6x33", "|logits| ~ 40: log-sum-exp must be stable", 6, 33, scale=40.0, frac=0.0),
    ]
    full = [
        case("mixed-2048x32768", "vocabulary 32k", 2048, 32768),
        case("odd-vocab-1023x50257", "odd vocabulary (GPT-2)", 1023, 50257),
        case("all-ignored-256x32000", "every label ignored", 256, 32000, frac=1.0),
        case("strided-rows-512x32000", "rows with a stride", 512, 32000, pad=64),
        case("large-logits-128x151936", "|logits| ~ 40, Qwen vocabulary", 128, 151936, scale=40.0, frac=0.0),
    ]
    return pick(size, small, full)


def _ce_linear_cases(size: str) -> list[Case]:
    def case(name, about, n, h, v, *, bias=False, ignore_index=-100, frac=0.25, pad=0, logit_scale=2.0):
        def build(b: Builder):
            hidden = b.strided(n, h, pad=pad) if pad else b.randn(n, h)
            # weights ~ N(0, logit_scale² / H): logits of order logit_scale
            weight = b.randn(v, h, scale=logit_scale / math.sqrt(h))
            out = {"hidden": hidden, "weight": weight, "labels": _labels(b, n, v, ignore_index, frac),
                   "ignore_index": ignore_index, "bias": b.randn(v, scale=0.5) if bias else None}
            return out

        diff = ("hidden", "weight", "bias") if bias else ("hidden", "weight")
        return Case(name, build, diff, about)

    small = [
        case("mixed-37x24x53", "a quarter of the labels ignored", 37, 24, 53),
        case("bias-19x16x40", "with an lm_head bias", 19, 16, 40, bias=True),
        case("all-ignored-8x16x32", "every label ignored: loss 0, gradients 0", 8, 16, 32, frac=1.0),
        case("many-tokens-300x32x64", "enough tokens for several chunks", 300, 32, 64),
        case("strided-hidden-21x24x30", "hidden rows with a stride", 21, 24, 30, pad=16),
        case("ignore-index-0-17x16x24", "ignore_index=0, a real class id", 17, 16, 24, ignore_index=0, frac=0.3),
    ]
    full = [
        case("mixed-4096x2560x32000", "hidden 2560, vocabulary 32k", 4096, 2560, 32000),
        case("odd-1031x2048x50257", "odd sizes", 1031, 2048, 50257),
        case("qwen-vocab-512x1024x151936", "Qwen vocabulary", 512, 1024, 151936),
        case("bias-777x1024x32000", "with a bias", 777, 1024, 32000, bias=True),
        case("all-ignored-256x1024x32000", "every label ignored", 256, 1024, 32000, frac=1.0),
        case("strided-hidden-600x2048x16384", "hidden rows with a stride", 600, 2048, 16384, pad=128),
    ]
    return pick(size, small, full)


CROSS_ENTROPY = OpHarness(
    op="cross_entropy",
    out_names=("loss",),
    reference={"logits": "veomni_ops.kernels.cross_entropy:cross_entropy_sum",
               "fused_linear": "veomni_ops.kernels.cross_entropy:fused_linear_cross_entropy_sum"},
    call=_ce_call,
    out_dtypes=lambda dt: [loss_dtypes(dt)],
    cases=lambda variant, size: _ce_logits_cases(size) if variant == "logits" else _ce_linear_cases(size),
)
