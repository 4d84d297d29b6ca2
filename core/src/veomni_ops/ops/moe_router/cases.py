"""The moe_router harness and cases, and tie-free router logits.

The indices are compared exactly, as a rank map: ``[T, E]`` int64, ``r + 1`` where expert e is
the token's r-th route, 0 where it is not routed (one wrong or reordered expert is an error of
at least 1 where the reference has 0, far outside any tolerance). Where the reference's top-k is
a near-tie -- two of its ``top_k + 1`` largest probabilities within :data:`NEAR_TIE` of each other
(relative), which float32 rounding may order either way, or exactly equal, which the contract
leaves to the kernel -- that token's ranks are not compared (:func:`decided`): the weights are
(the sorted top-k values do not depend on which of two tied experts comes first), and so are the
gradients, so the cases draw logits whose top-k has no near-tie except where a case says so.
"""

from __future__ import annotations

import math

import torch

from ...testing.cases.base import Builder, Case, OpHarness, pick, same_dtype

#: Two probabilities closer than this (relative to the larger) are a near-tie: float32 rounds
#: a softmax probability to ~6e-8 relative, so anything farther apart keeps its order.
NEAR_TIE = 1e-5


def tie_free_logits(b: Builder, t: int, e: int, pad: int = 0) -> torch.Tensor:
    """``[T, E]`` logits with no two equal values in a row, in every dtype: per token a random
    permutation of ``(j - E/2) * step``, ``step`` a power of two near ``8 / E`` (a span of about
    ±4, like a trained router's). Every value is ``step`` times an integer of at most 256 in
    magnitude (E <= 512), so bfloat16 holds it exactly. ``pad``: rows that many elements longer
    (a strided view)."""
    step = 2.0 ** -round(math.log2(max(e, 1) / 8))
    base = (torch.arange(e, dtype=torch.float64) - e // 2) * step
    rows = base[b.perms(t, e)] if e else torch.zeros(t, 0, dtype=torch.float64)
    if pad:
        rows = torch.cat([rows, torch.zeros(t, pad, dtype=torch.float64)], dim=1)
    out = rows.to(b.dtype).to(b.device)
    return out[:, :e] if pad else out


def decided(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """``[T, 1]`` bool: tokens whose top-k (and the next one) has no near-tie (:data:`NEAR_TIE`)."""
    p = torch.softmax(logits.detach().to(torch.float64), dim=-1)
    n = min(top_k + 1, p.shape[-1])
    top = torch.topk(p, n, dim=-1).values
    gaps = top[:, :-1] - top[:, 1:]
    return (gaps > NEAR_TIE * top[:, :-1]).all(dim=-1, keepdim=True)


def rank_map(indices: torch.Tensor, e: int) -> torch.Tensor:
    """``[T, E]`` int64: ``r + 1`` where expert e is route r, else 0 (``indices`` must be int64 ``[T, k]``)."""
    ranks = torch.arange(1, indices.shape[-1] + 1, device=indices.device).expand_as(indices)
    return torch.zeros(indices.shape[0], e, dtype=torch.int64, device=indices.device).scatter(1, indices, ranks)


def _router_call(fn, inp, reference):
    logits, k = inp["logits"], inp["top_k"]
    weights, indices = fn(logits, k, inp["normalize"])
    want = (logits.shape[0], k)
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int64 or tuple(indices.shape) != want:
        raise TypeError(f"moe_router: indices must be an int64 tensor of shape {want}, got "
                        f"{getattr(indices, 'dtype', type(indices).__name__)} {tuple(getattr(indices, 'shape', ()))}")
    return weights, rank_map(indices, logits.shape[-1])


def _router_masks(inp):
    return [None, decided(inp["logits"], inp["top_k"])]


def _router_cases(variant: str, size: str) -> list[Case]:
    def case(name, about, t, e, k, normalize=True, peaked=0, pad=0):
        def build(b: Builder):
            logits = tie_free_logits(b, t, e, pad)
            if peaked:  # every `peaked`-th token: one expert at +1e4, another at -1e4 (exp underflows to 0)
                rows = torch.arange(0, t, peaked, device=logits.device)
                cols = b.perms(len(rows), e)[:, :2].to(logits.device)
                logits[rows, cols[:, 0]] = 1e4
                if e > 1:
                    logits[rows, cols[:, 1]] = -1e4
            return {"logits": logits, "top_k": k, "normalize": normalize}

        return Case(name, build, ("logits",), about)

    small = [
        case("13tok-e8-k2-norm", "odd token count, normalised top-2", 13, 8, 2),
        case("11tok-e60-k4-raw", "E not a power of two, not normalised", 11, 60, 4, normalize=False),
        case("9tok-e16-k1-norm", "top-1 normalised: weights 1, zero gradient", 9, 16, 1),
        case("9tok-e16-k1-raw", "top-1, not normalised", 9, 16, 1, normalize=False),
        case("7tok-e6-k6-norm", "top-k = every expert, normalised", 7, 6, 6),
        case("7tok-e6-k6-raw", "top-k = every expert, not normalised", 7, 6, 6, normalize=False),
        case("0tok-e8-k2", "no token: empty outputs, zero gradient", 0, 8, 2),
        case("peaked-12tok-e8-k3", "every 3rd token: one expert at +1e4 (its top-k after the first is a tie of "
             "zeros: ranks not compared there), one at -1e4", 12, 8, 3, peaked=3),
        case("peaked-k=E-6tok-e5-k5-raw", "±1e4 logits with top-k = every expert", 6, 5, 5, normalize=False,
             peaked=2),
        case("strided-10tok-e12-k3", "logits rows with a stride (a slice of a wider buffer)", 10, 12, 3, pad=5),
    ]
    full = [
        case("4096tok-e128-k8-norm", "Qwen3-30B-A3B's router: 128 experts, top-8, normalised", 4096, 128, 8),
        case("2047tok-e60-k4-raw", "Qwen1.5-MoE's 60 experts, top-4, not normalised", 2047, 60, 4, normalize=False),
        case("1024tok-e512-k10-norm", "512 experts, top-10 (Qwen3-Next)", 1024, 512, 10),
        case("0tok-e128-k8", "no token", 0, 128, 8),
        case("peaked-1024tok-e64-k8", "every 4th token with ±1e4 logits", 1024, 64, 8, peaked=4),
        case("strided-1000tok-e128-k8", "strided rows", 1000, 128, 8, pad=64),
    ]
    return pick(size, small, full)


#: The ``moe_router`` harness: how the conformance kit and the bench call its kernels, and its cases.
HARNESS = OpHarness(
    op="moe_router",
    out_names=("weights", "indices"),
    reference={"standard": "veomni_ops.ops.moe_router.kernel:moe_router"},
    call=_router_call,
    out_dtypes=lambda dt: [same_dtype(dt), (torch.int64,)],
    cases=_router_cases,
    out_masks=_router_masks,
)
