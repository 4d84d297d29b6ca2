"""The cross_entropy harness and cases (from logits, and fused with the linear head), and the
``peaked`` logit distribution that ``veomni-ops bench`` and the kit's peaked cases draw.

Peaked logits (issue 24): the logit of vocabulary id ``v`` is ``-s * ln(v + 1) + eps`` with
``eps ~ N(0, 1)`` per element -- a Zipf law of exponent ``s`` over the vocabulary (ids in order of
frequency) plus unit noise. With ``s = 1`` (the bench's inputs) and the Qwen vocabulary (151,936)
a row's most likely token holds about 0.1 of the mass and the top 1% of ids about two thirds: a
few tokens hold the mass, as in a trained model's rows, and about 85% of the 128 x 128 tiles of the
logits' gradient lie wholly below 2^-12, which a kernel with Cut Cross-Entropy's filter skips.
The former bench inputs, ``randn`` logits of scale 2 (kept as the ``flce-*-dense`` stress
presets), give flat rows (largest probability ~0.008) with an entry above 2^-12 in every tile,
so such a kernel skips nothing. (The share of single probabilities below 2^-12 is ~99.8% in both:
it is the tiles, and the mass in the top ids, that tell them apart.)

For the fused loss the logits must come out of ``hidden @ weight.T``: :func:`peaked_linear`
gives the hidden states a constant feature 1 whose weight column carries ``-s * ln(v + 1)``, and
random rest -- each hidden row's other ``H - 1`` features scaled to RMS 1 (as after a final
RMSNorm), the weight's other columns ``N(0, 1 / (H - 1))``. Then a row's noise
``x_i . u_v`` is, given the row, exactly ``N(0, 1)`` and independent over ``v``: each row has the
distribution of the definition (rows share the weight, so they are not independent of each other).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ...losses import normalise
from ...testing.cases.base import Builder, Case, OpHarness, loss_dtypes, pick

#: Cut Cross-Entropy's gradient filter for 16-bit inputs: a tile of the logits' gradient whose
#: every entry is below this in magnitude is skipped (its dH and dW products are not computed).
SKIP_EPS = 2.0**-12
#: Cut Cross-Entropy's default backward tile: 128 tokens x 128 vocabulary ids.
CCE_TILE = (128, 128)

#: ``gauss(*shape)``: a standard normal float32 or float64 tensor of that shape, on the device.
Gauss = Callable[..., torch.Tensor]


def zipf_log_frequency(vocab: int, *, exponent: float = 1.0, like: torch.Tensor) -> torch.Tensor:
    """``[V]``: ``-exponent * ln(v + 1)`` for ``v = 0 .. V-1``, in ``like``'s dtype and device."""
    ids = torch.arange(1, vocab + 1, dtype=torch.float64, device=like.device)
    return (-exponent * torch.log(ids)).to(like.dtype)


def peaked_logits(gauss: Gauss, n: int, vocab: int, *, exponent: float = 1.0) -> torch.Tensor:
    """``[N, V]`` peaked logits: ``-exponent * ln(v + 1) + eps``, ``eps ~ N(0, 1)`` per element."""
    z = gauss(n, vocab)
    return z.add_(zipf_log_frequency(vocab, exponent=exponent, like=z))


def peaked_linear(gauss: Gauss, n: int, hidden: int, vocab: int, *,
                  exponent: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``hidden [N, H]`` and ``weight [V, H]`` whose ``hidden @ weight.T`` are peaked logits (see
    the module docstring): feature 0 is 1 in every hidden row and ``-exponent * ln(v + 1)`` in
    weight row ``v``; the other ``H - 1`` features of a hidden row have RMS 1, the weight's are
    ``N(0, 1 / (H - 1))``, so that a row's noise is ``N(0, 1)``. In ``gauss``'s dtype; ``H >= 2``."""
    if hidden < 2:
        raise ValueError(f"peaked_linear needs hidden >= 2 (a constant feature and the noise), got {hidden}")
    rest = hidden - 1
    w = gauss(vocab, hidden)
    w[:, 1:].mul_(1.0 / math.sqrt(rest))
    w[:, 0] = zipf_log_frequency(vocab, exponent=exponent, like=w)
    x = gauss(n, hidden)
    norms = x[:, 1:].norm(dim=1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    x[:, 1:].mul_(math.sqrt(rest) / norms)
    x[:, 0] = 1.0
    return x, w


def row_statistics(logits: torch.Tensor, *, eps: float = SKIP_EPS) -> dict[str, float]:
    """Means over the rows of ``logits [N, V]`` (softmax in float64): ``top1`` the largest
    probability, ``top_1pct`` the mass of the row's most likely 1% of ids, ``below_eps`` the share
    of probabilities below ``eps``, ``entropy`` in nats."""
    p = logits.detach().double().softmax(-1)
    k = max(1, p.shape[-1] // 100)
    logp = p.clamp_min(torch.finfo(torch.float64).tiny).log()
    return {
        "top1": float(p.amax(-1).mean()),
        "top_1pct": float(p.topk(k, dim=-1).values.sum(-1).mean()),
        "below_eps": float((p < eps).double().mean()),
        "entropy": float(-(p * logp).sum(-1).mean()),
    }


def skippable_tiles(logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = -100,
                    tile: tuple[int, int] = CCE_TILE, eps: float = SKIP_EPS) -> float:
    """The share of ``tile``-sized blocks (edge blocks included) of the loss's logit gradient
    ``softmax(z) - onehot(label)`` (zero rows for ignored labels) whose every entry is below
    ``eps`` in magnitude: the blocks a kernel with Cut Cross-Entropy's filter skips."""
    g = logits.detach().double().softmax(-1)
    keep = labels != ignore_index
    g[~keep] = 0.0
    rows = torch.nonzero(keep).squeeze(1)
    g[rows, labels[keep]] -= 1.0
    n, v = g.shape
    tb, tv = tile
    big = torch.nn.functional.pad(g.abs(), (0, -v % tv, 0, -n % tb))
    blocks = big.reshape(big.shape[0] // tb, tb, big.shape[1] // tv, tv).amax(dim=(1, 3))
    return float((blocks < eps).double().mean())


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
    if inp.get("normalised"):
        # The loss the model returns: the core's division of the kernel's sum (veomni_ops.losses),
        # by num_items_in_batch where the case gives one, else by the counted tokens.
        out = normalise(out, inp["labels"], inp["ignore_index"], inp.get("num_items_in_batch"))
    return (out,)


def _normalised(build: Callable[[Builder], dict], divide: str | None) -> Callable[[Builder], dict]:
    """``build`` whose case is the model's loss, not the kernel's sum: divided by the counted
    tokens (``divide="count"``, transformers' mean) or by ``num_items_in_batch = 0``
    (``divide="num_items_0"``: gradient accumulation over micro-batches that count nothing)."""
    if divide is None:
        return build
    if divide not in ("count", "num_items_0"):
        raise ValueError(f"divide must be None, 'count' or 'num_items_0', got {divide!r}")

    def normalised(b: Builder) -> dict:
        out = {**build(b), "normalised": True}
        if divide == "num_items_0":
            out["num_items_in_batch"] = torch.zeros((), dtype=torch.long, device=b.device)
        return out

    return normalised


#: Every label ignored, the sum divided as the model divides it: the kernel gets the gradient 1/0 = inf.
_DIVIDED = {"count": ("every label ignored, divided by the counted tokens as the model's loss is (transformers' "
                      "mean): loss nan (0/0), every gradient zero as transformers' (a kernel that scales stored "
                      "gradients by the incoming inf would give nan)"),
            "num_items_0": ("every label ignored, divided by num_items_in_batch = 0 (gradient accumulation over "
                            "prompt-only micro-batches): loss nan, every gradient zero as transformers'")}


def _gauss(b: Builder) -> Gauss:
    """The case's standard normal draws, in float64 on its device (cast to the case dtype after)."""
    return lambda *shape: b.randn(*shape, dtype=torch.float64)


# The peaked cases (module docstring): the rows a sparsity-skipping kernel meets in training.
_PEAKED_SMALL = ("peaked rows, Zipf exponent 2 + N(0, 1) noise (sharper than the bench's, so that at this "
                 "vocabulary most 16 x 64 tiles of the gradient are below 2^-12: a kernel that skips such tiles skips)")
_PEAKED_BENCH = ("peaked rows as the bench draws them (Zipf exponent 1 + N(0, 1) noise): ~90% of the probabilities "
                 "below 2^-12")
_PEAKED_FULL = ("peaked rows as the bench draws them (Zipf exponent 1 + N(0, 1) noise), Qwen vocabulary: 99.8% of the "
                "probabilities and most 128 x 128 gradient tiles (Cut Cross-Entropy's) below 2^-12")


def _ce_logits_cases(size: str) -> list[Case]:
    def case(name, about, n, v, *, scale=3.0, ignore_index=-100, frac=0.25, pad=0, zipf=0.0, divide=None):
        def build(b: Builder):
            if zipf:
                logits = peaked_logits(_gauss(b), n, v, exponent=zipf).to(b.dtype)
            elif pad:
                logits = b.strided(n, v, pad=pad, scale=scale)
            else:
                logits = b.randn(n, v, scale=scale)
            return {"logits": logits, "labels": _labels(b, n, v, ignore_index, frac), "ignore_index": ignore_index}

        return Case(name, _normalised(build, divide), ("logits",), about)

    small = [
        case("mixed-13x37", "a quarter of the labels ignored", 13, 37),
        case("all-ignored-5x16", "every label is ignore_index: loss 0, gradients 0", 5, 16, frac=1.0),
        case("ignore-index-3-9x20", "ignore_index=3, a real class id (not the default -100)", 9, 20,
             ignore_index=3, frac=0.4),
        case("strided-rows-11x50", "rows with a stride", 11, 50, pad=14),
        case("large-logits-6x33", "|logits| ~ 40: log-sum-exp must be stable", 6, 33, scale=40.0, frac=0.0),
        case("peaked-zipf2-32x2048", _PEAKED_SMALL, 32, 2048, zipf=2.0),
        case("peaked-16x4096", _PEAKED_BENCH, 16, 4096, zipf=1.0),
        case("all-ignored-mean-5x16", _DIVIDED["count"], 5, 16, frac=1.0, divide="count"),
        case("all-ignored-num-items-0-5x16", _DIVIDED["num_items_0"], 5, 16, frac=1.0, divide="num_items_0"),
    ]
    full = [
        case("mixed-2048x32768", "vocabulary 32k", 2048, 32768),
        case("odd-vocab-1023x50257", "odd vocabulary (GPT-2)", 1023, 50257),
        case("all-ignored-256x32000", "every label ignored", 256, 32000, frac=1.0),
        case("strided-rows-512x32000", "rows with a stride", 512, 32000, pad=64),
        case("large-logits-128x151936", "|logits| ~ 40, Qwen vocabulary", 128, 151936, scale=40.0, frac=0.0),
        case("peaked-2048x151936", _PEAKED_FULL, 2048, 151936, zipf=1.0),
        case("all-ignored-mean-256x32000", _DIVIDED["count"], 256, 32000, frac=1.0, divide="count"),
        case("all-ignored-num-items-0-256x32000", _DIVIDED["num_items_0"], 256, 32000, frac=1.0,
             divide="num_items_0"),
    ]
    return pick(size, small, full)


def _ce_linear_cases(size: str) -> list[Case]:
    def case(name, about, n, h, v, *, bias=False, ignore_index=-100, frac=0.25, pad=0, logit_scale=2.0, zipf=0.0,
             divide=None):
        def build(b: Builder):
            if zipf:
                hidden, weight = (t.to(b.dtype) for t in peaked_linear(_gauss(b), n, h, v, exponent=zipf))
            else:
                hidden = b.strided(n, h, pad=pad) if pad else b.randn(n, h)
                # weights ~ N(0, logit_scale² / H): logits of order logit_scale
                weight = b.randn(v, h, scale=logit_scale / math.sqrt(h))
            out = {"hidden": hidden, "weight": weight, "labels": _labels(b, n, v, ignore_index, frac),
                   "ignore_index": ignore_index, "bias": b.randn(v, scale=0.5) if bias else None}
            return out

        diff = ("hidden", "weight", "bias") if bias else ("hidden", "weight")
        return Case(name, _normalised(build, divide), diff, about)

    small = [
        case("mixed-37x24x53", "a quarter of the labels ignored", 37, 24, 53),
        case("bias-19x16x40", "with an lm_head bias", 19, 16, 40, bias=True),
        case("all-ignored-8x16x32", "every label ignored: loss 0, gradients 0", 8, 16, 32, frac=1.0),
        case("many-tokens-300x32x64", "enough tokens for several chunks", 300, 32, 64),
        case("strided-hidden-21x24x30", "hidden rows with a stride", 21, 24, 30, pad=16),
        case("ignore-index-0-17x16x24", "ignore_index=0, a real class id", 17, 16, 24, ignore_index=0, frac=0.3),
        case("peaked-zipf2-64x16x2048", _PEAKED_SMALL, 64, 16, 2048, zipf=2.0),
        case("peaked-32x16x4096", _PEAKED_BENCH, 32, 16, 4096, zipf=1.0),
        case("all-ignored-mean-8x16x32", _DIVIDED["count"], 8, 16, 32, frac=1.0, divide="count"),
        case("all-ignored-num-items-0-8x16x32", _DIVIDED["num_items_0"], 8, 16, 32, frac=1.0, divide="num_items_0"),
    ]
    full = [
        case("mixed-4096x2560x32000", "hidden 2560, vocabulary 32k", 4096, 2560, 32000),
        case("odd-1031x2048x50257", "odd sizes", 1031, 2048, 50257),
        case("qwen-vocab-512x1024x151936", "Qwen vocabulary", 512, 1024, 151936),
        case("bias-777x1024x32000", "with a bias", 777, 1024, 32000, bias=True),
        case("all-ignored-256x1024x32000", "every label ignored", 256, 1024, 32000, frac=1.0),
        case("strided-hidden-600x2048x16384", "hidden rows with a stride", 600, 2048, 16384, pad=128),
        case("peaked-1024x2560x151936", _PEAKED_FULL, 1024, 2560, 151936, zipf=1.0),
        case("all-ignored-mean-256x1024x32000", _DIVIDED["count"], 256, 1024, 32000, frac=1.0, divide="count"),
        case("all-ignored-num-items-0-256x1024x32000", _DIVIDED["num_items_0"], 256, 1024, 32000, frac=1.0,
             divide="num_items_0"),
    ]
    return pick(size, small, full)


#: The ``cross_entropy`` harness: how the conformance kit and the bench call its kernels, and its cases.
HARNESS = OpHarness(
    op="cross_entropy",
    out_names=("loss",),
    reference={"logits": "veomni_ops.ops.cross_entropy.kernel:cross_entropy_sum",
               "fused_linear": "veomni_ops.ops.cross_entropy.kernel:fused_linear_cross_entropy_sum"},
    call=_ce_call,
    out_dtypes=lambda dt: [loss_dtypes(dt)],
    cases=lambda variant, size: _ce_logits_cases(size) if variant == "logits" else _ce_linear_cases(size),
)
