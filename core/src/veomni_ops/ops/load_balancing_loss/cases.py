"""The load_balancing_loss harness and cases, and tie-free router logits."""

from __future__ import annotations

import torch

from ...testing.cases.base import Builder, Case, OpHarness, loss_dtypes, pick


def router_logits(b: Builder, t: int, e: int) -> torch.Tensor:
    """Router logits without ties in any dtype: per token a permutation of evenly spaced
    values, jittered by less than a quarter of the spacing. (With ties, which expert is in
    the top-k is up to the implementation, and the loss legitimately differs.)"""
    span = 4.0
    base = torch.linspace(-span, span, e, dtype=torch.float64)
    spacing = 2 * span / max(1, e - 1)
    rows = base[b.perms(t, e)]
    jitter = (torch.rand(t, e, generator=b.gen, dtype=torch.float64) - 0.5) * (spacing / 2)
    return (rows + jitter).to(b.dtype).to(b.device)


def _lbl_call(fn, inp, reference):
    return (fn(list(inp["gate_logits"]), inp["num_experts"], inp["top_k"], inp["attention_mask"]),)


def _lbl_cases(variant: str, size: str) -> list[Case]:
    def case(name, about, layers, bsz, seq, e, k, mask=None):
        def build(b: Builder):
            t = bsz * seq
            am = None
            if mask == "padding":  # right padding on even rows, left padding on odd rows
                lens = torch.randint(1, seq + 1, (bsz,), generator=b.gen)
                am = torch.zeros(bsz, seq, dtype=torch.long)
                for r in range(bsz):
                    if r % 2 == 0:
                        am[r, : lens[r]] = 1
                    else:
                        am[r, seq - lens[r]:] = 1
                am = am.to(b.device)
            return {"gate_logits": [router_logits(b, t, e) for _ in range(layers)], "num_experts": e,
                    "top_k": k, "attention_mask": am}

        return Case(name, build, ("gate_logits",), about)

    small = [
        case("3layers-2x7-e8-k2", "three layers, no mask", 3, 2, 7, 8, 2),
        case("padding-mask-3x9-e6-k2", "padding mask (left and right padding)", 2, 3, 9, 6, 2, mask="padding"),
        case("one-layer-1x5-e4-k1", "one layer, top-1", 1, 1, 5, 4, 1),
        case("topk-all-2x3-e4-k4", "top-k = every expert", 2, 2, 3, 4, 4),
    ]
    full = [
        case("8layers-4x512-e128-k8", "128 experts, top-8", 8, 4, 512, 128, 8),
        case("padding-mask-4x1024-e64-k4", "padding mask", 4, 4, 1024, 64, 4, mask="padding"),
        case("48layers-1x256-e128-k8", "48 layers", 48, 1, 256, 128, 8),
    ]
    return pick(size, small, full)


#: The ``load_balancing_loss`` harness: how the conformance kit and the bench call its kernels, and its cases.
HARNESS = OpHarness(
    op="load_balancing_loss",
    out_names=("loss",),
    reference={"standard": "veomni_ops.ops.load_balancing_loss.kernel:load_balancing_loss"},
    call=_lbl_call,
    out_dtypes=lambda dt: [loss_dtypes(dt)],
    cases=_lbl_cases,
)
