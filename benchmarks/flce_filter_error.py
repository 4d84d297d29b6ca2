"""What Cut Cross-Entropy's gradient filter costs in the weight gradient, against float64, beside
eager's bf16 error, as the token count grows (issue 33: "a loss that skips the gradient blocks whose
softmax is negligible ... exact at bf16 precision").

    python benchmarks/flce_filter_error.py > benchmarks/results/cpu-2026-12-07-flce-filter-error.json

Inputs: the bench's peaked logits (``peaked_linear``: -ln(v + 1) + N(0, 1), Qwen's vocabulary of
151,936; a hidden size of 32 keeps it quick: the error is a sum over tokens, not over features), bf16
hidden states and weight, labels drawn from each row's own softmax, as a trained model's targets are.
Per row of tokens and slice of the vocabulary, the filter keeps the slice where any probability is at
least ``eps`` or the row's label lies in it, and drops the rest from dW (a coarser filter than CCE's
128 x 128 tiles, so it drops less than CCE does). dH is not filtered here.

``eager``: the logits' gradient rounded to bf16 once, float32 products, dW rounded to bf16 once
(what autograd does on a GPU). ``filtered``: the same, with the dropped entries left out. Errors:
``norm`` = |dW - ref| / |ref| (Frobenius), ``max`` = max |dW - ref| / max |ref|. The dropped
probabilities are each below eps, but dW sums them over every token: with a hidden feature shared by
all rows (a constant one here, a mean in a real model's states) they add up coherently, so the
filter's error grows with the tokens while eager's does not.
"""

from __future__ import annotations

import json
import math

import torch
from veomni_ops.testing.cases.cross_entropy import peaked_linear

V, H = 151936, 32
SLICE = 4096
EPS = (2.0**-12, 2.0**-16)
TOKENS = (512, 1024, 2048, 4096)


def errors(n: int) -> dict:
    g = torch.Generator().manual_seed(20261207 + n)
    x, w = peaked_linear(lambda *s: torch.randn(*s, generator=g, dtype=torch.float64), n, H, V)
    xb, wb = x.bfloat16(), w.bfloat16()
    z = xb.double() @ wb.double().T
    p = z.softmax(-1)
    del z
    y = torch.multinomial(p.float(), 1, generator=g).squeeze(1)
    grad = p.clone()
    grad[torch.arange(n), y] -= 1.0
    ref = grad.T @ xb.double()
    gb = grad.bfloat16()
    del grad

    def err(dw: torch.Tensor) -> dict:
        d = dw - ref
        return {"norm": float(d.norm() / ref.norm()), "max": float(d.abs().max() / ref.abs().max())}

    row: dict = {"tokens": n, "eager": err((gb.float().T @ xb.float()).bfloat16().double())}
    for eps in EPS:
        dw = torch.zeros_like(ref)
        kept = 0
        slices = math.ceil(V / SLICE)
        for b in range(slices):
            v0, v1 = b * SLICE, min(V, (b + 1) * SLICE)
            rows = (p[:, v0:v1].amax(1) >= eps) | ((y >= v0) & (y < v1))
            kept += int(rows.sum())
            dw[v0:v1] = (gb[rows, v0:v1].float().T @ xb[rows].float()).bfloat16().double()
        row[f"filtered eps=2^{math.log2(eps):.0f}"] = {**err(dw), "kept": kept / (n * slices)}
    return row


def main() -> None:
    rows = [errors(n) for n in TOKENS]
    print(json.dumps({"torch": torch.__version__, "vocab": V, "hidden": H, "slice": SLICE, "dtype": "bfloat16",
                      "logits": "peaked (labels from each row's softmax)", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
