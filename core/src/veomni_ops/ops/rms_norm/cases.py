"""The rms_norm harness and cases."""

from __future__ import annotations

import torch

from ...testing.cases.base import Builder, Case, OpHarness, pick, same_dtype


def _rms_call(fn, inp, reference):
    return (fn(inp["hidden_states"], inp["weight"], inp["eps"]),)


def _rms_cases(variant: str, size: str) -> list[Case]:
    # standard weights sit around 1 (w * x̂); offset weights around 0 (x̂ * (1 + w)).
    shift = 1.0 if variant == "standard" else 0.0

    def case(name, about, make_x, h, eps=1e-6, fp32_weight=False):
        def build(b: Builder):
            x = make_x(b)
            # Mixed precision: a float32 weight with 16-bit activations (the contract keeps the
            # activations' dtype for the output); in float32/float64 runs the weight has the dtype.
            wdt = torch.float32 if fp32_weight and b.dtype in (torch.bfloat16, torch.float16) else None
            return {"hidden_states": x, "weight": b.randn(h, scale=0.1, shift=shift, dtype=wdt), "eps": eps}

        return Case(name, build, ("hidden_states", "weight"), about)

    small = [
        case("rows-3x17", "odd hidden size", lambda b: b.randn(3, 17), 17),
        case("3d-2x5x64", "leading batch and sequence dims", lambda b: b.randn(2, 5, 64), 64),
        case("strided-rows-7x48", "rows with a stride (slice of a wider buffer)", lambda b: b.strided(7, 48, pad=16), 48),
        case("wide-range-4x64", "|x| ~ 100: x² overflows float16 unless the statistics are float32",
             lambda b: b.randn(4, 64, scale=100.0), 64),
        case("one-row-1x256", "a single row", lambda b: b.randn(1, 256), 256, eps=1e-5),
        case("fp32-weight-6x40", "float32 weight with bfloat16/float16 activations: output in the activations' dtype",
             lambda b: b.randn(6, 40), 40, fp32_weight=True),
    ]
    full = [
        case("rows-1031x2560", "odd row count at a real hidden size", lambda b: b.randn(1031, 2560), 2560),
        case("3d-2x256x4096", "leading dims, hidden 4096", lambda b: b.randn(2, 256, 4096), 4096),
        case("seed-4x2048x2560", "the seed benchmark's shape (batch 4, sequence 2048, hidden 2560)",
             lambda b: b.randn(4, 2048, 2560), 2560),
        case("strided-rows-777x2048", "rows with a stride", lambda b: b.strided(777, 2048, pad=64), 2048),
        case("wide-range-64x8192", "|x| ~ 100 at hidden 8192", lambda b: b.randn(64, 8192, scale=100.0), 8192),
        case("odd-hidden-300x5121", "odd hidden size past a power of two", lambda b: b.randn(300, 5121), 5121),
        case("fp32-weight-512x4096", "float32 weight, 16-bit activations (mixed precision)",
             lambda b: b.randn(512, 4096), 4096, fp32_weight=True),
    ]
    return pick(size, small, full)


#: The ``rms_norm`` harness: how the conformance kit and the bench call its kernels, and its cases.
HARNESS = OpHarness(
    op="rms_norm",
    out_names=("out",),
    reference={"standard": "veomni_ops.ops.rms_norm.kernel:rms_norm_standard",
               "offset": "veomni_ops.ops.rms_norm.kernel:rms_norm_offset"},
    call=_rms_call,
    out_dtypes=lambda dt: [same_dtype(dt)],
    cases=_rms_cases,
)
