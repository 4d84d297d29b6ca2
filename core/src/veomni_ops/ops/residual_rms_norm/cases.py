"""The residual_rms_norm harness and cases."""

from __future__ import annotations

import torch

from ...testing.cases.base import Builder, Case, OpHarness, pick, same_dtype


def _call(fn, inp, reference):
    normed, summed = fn(inp["x"], inp["residual"], inp["weight"], inp["eps"])
    return normed, summed


def _cases(variant: str, size: str) -> list[Case]:
    def case(name, about, shape, scale=1.0, eps=1e-6, strided=False, fp32_weight=False):
        *lead, h = shape

        def build(b: Builder):
            def act():
                return b.strided(*shape, pad=16, scale=scale) if strided else b.randn(*shape, scale=scale)

            wdt = torch.float32 if fp32_weight and b.dtype in (torch.bfloat16, torch.float16) else None
            return {"x": act(), "residual": act(), "weight": b.randn(h, scale=0.1, shift=1.0, dtype=wdt), "eps": eps}

        return Case(name, build, ("x", "residual", "weight"), about)

    small = [
        case("rows-3x64", "plain rows", (3, 64)),
        case("odd-hidden-5x100", "hidden size not a power of two", (5, 100)),
        case("3d-2x5x48", "leading batch and sequence dims", (2, 5, 48)),
        case("zero-rows-0x64", "no rows: empty outputs and a zero weight gradient", (0, 64)),
        case("strided-rows-7x40", "rows with a stride (slices of a wider buffer)", (7, 40), strided=True),
        case("large-4x64", "|x| ~ 1000: x² overflows float16 unless the statistics are float32", (4, 64), scale=1e3),
        case("tiny-4x64", "|x| ~ 1e-3: mean(x²) ~ 2e-6, the same order as eps", (4, 64), scale=1e-3),
        case("fp32-weight-6x40", "float32 weight with bfloat16/float16 activations", (6, 40), fp32_weight=True),
    ]
    full = [
        case("rows-1031x2560", "odd row count at a real hidden size", (1031, 2560)),
        case("3d-4x2048x2560", "batch 4, sequence 2048, hidden 2560", (4, 2048, 2560)),
        case("odd-hidden-300x5121", "odd hidden size past a power of two", (300, 5121)),
        case("large-64x4096", "|x| ~ 1000 at hidden 4096", (64, 4096), scale=1e3),
        case("tiny-64x4096", "|x| ~ 1e-3 at hidden 4096", (64, 4096), scale=1e-3),
    ]
    return pick(size, small, full)


#: The ``residual_rms_norm`` harness: how the conformance kit and the bench call its kernels, and its cases.
HARNESS = OpHarness(
    op="residual_rms_norm",
    out_names=("normed", "summed"),
    reference={"standard": "veomni_ops.ops.residual_rms_norm.kernel:residual_rms_norm"},
    call=_call,
    out_dtypes=lambda dt: [same_dtype(dt), same_dtype(dt)],
    cases=_cases,
)
