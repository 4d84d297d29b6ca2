"""The core's flex_attention forward on the CPU at the conformance kit's full attention shapes,
against the float64 eager reference, beside eager and sdpa in the same dtype: the worst
max |a-b| / (atol + rtol*|b|) with the _MATMUL tolerances flex_attention declares (reference.py).

    python benchmarks/flex_forward_error.py > benchmarks/results/cpu-2026-11-26-flex-forward.json

FlexAttention has no backward on the CPU; the backward is checked by the CUDA-only tests of
core/tests/test_kernels_attention.py (benchmarks/gpu/flex_attention.sh runs them with the kit).
"""

from __future__ import annotations

import json
import sys

import torch
from veomni_ops.backends.reference import _MATMUL
from veomni_ops.kernels.attention import eager_attention, flex_attention_kernel, sdpa_attention
from veomni_ops.testing.cases.attention import AttentionModule

SHAPES = [(2, 16, 4, 1024, 128, True), (1, 8, 8, 2048, 64, True), (2, 8, 2, 777, 128, False)]
KERNELS = {"eager": eager_attention, "sdpa": sdpa_attention, "flex_attention": flex_attention_kernel}


def main() -> None:
    worst = {}
    for b, hq, hk, s, d, causal in SHAPES:
        g = torch.Generator().manual_seed(20261126)
        q, k, v = (torch.randn(b, h, s, d, generator=g) for h in (hq, hk, hk))
        mod = AttentionModule(d, causal)
        ref = eager_attention(mod, q.double(), k.double(), v.double(), None, scaling=d**-0.5)[0]
        for dt in ("float32", "bfloat16", "float16"):
            tol = _MATMUL[dt]
            row = {}
            for name, fn in KERNELS.items():
                got = fn(mod, *(t.to(getattr(torch, dt)) for t in (q, k, v)), None, scaling=d**-0.5)[0].double()
                err = (got - ref).abs()
                row[name] = {"max_abs": err.max().item(),
                             "ratio": (err / (tol.atol + tol.rtol * ref.abs())).max().item()}
            key = f"{b}x{hq}x{hk}x{s}x{d}{'' if causal else '-bidirectional'} {dt}"
            worst[key] = row
            print(key, {n: round(r["ratio"], 4) for n, r in row.items()}, file=sys.stderr, flush=True)
    print(json.dumps({"tolerances": {k: [t.atol, t.rtol] for k, t in _MATMUL.items()}, "worst": worst}, indent=1))


if __name__ == "__main__":
    main()
