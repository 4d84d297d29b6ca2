"""The swiglu harness and cases."""

from __future__ import annotations

from ...testing.cases.base import Builder, Case, OpHarness, pick, same_dtype


def _swiglu_call(fn, inp, reference):
    return (fn(inp["gate"], inp["up"]),)


def _swiglu_cases(variant: str, size: str) -> list[Case]:
    def plain(name, about, *shape, scale=1.0):
        return Case(name, lambda b: {"gate": b.randn(*shape, scale=scale), "up": b.randn(*shape)},
                    ("gate", "up"), about)

    def halves(name, about, n, i):
        def build(b: Builder):
            gu = b.randn(n, 2 * i)  # one gate_up projection, split: two non-contiguous views
            return {"gate": gu[:, :i], "up": gu[:, i:]}

        return Case(name, build, ("gate", "up"), about)

    small = [
        plain("2d-3x17", "odd size", 3, 17),
        plain("3d-2x5x129", "leading dims, odd intermediate size", 2, 5, 129),
        halves("gate-up-halves-6x40", "gate and up as halves of one projection (strided views)", 6, 40),
        plain("wide-range-4x64", "|gate| ~ 20: sigmoid saturates at both ends", 4, 64, scale=20.0),
    ]
    full = [
        plain("2d-2048x6912", "a real intermediate size", 2048, 6912),
        plain("3d-3x1023x2731", "odd sizes", 3, 1023, 2731),
        halves("gate-up-halves-1024x6912", "halves of one projection", 1024, 6912),
        plain("wide-range-512x8192", "|gate| ~ 20", 512, 8192, scale=20.0),
    ]
    return pick(size, small, full)


#: The ``swiglu`` harness: how the conformance kit and the bench call its kernels, and its cases.
HARNESS = OpHarness(
    op="swiglu",
    out_names=("out",),
    reference={"standard": "veomni_ops.ops.swiglu.kernel:silu_mul"},
    call=_swiglu_call,
    out_dtypes=lambda dt: [same_dtype(dt)],
    cases=_swiglu_cases,
)
