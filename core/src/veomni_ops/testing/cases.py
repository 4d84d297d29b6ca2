"""What the conformance kit feeds each op, as data: input generators and how to call a kernel.

For every op an :class:`OpHarness` says how to call a kernel per its contract
(:mod:`veomni_ops.hookspecs`), which eager function is the reference for each variant, which
dtypes the outputs must have, and lists :class:`Case` objects per variant and size:

* ``small`` — a few dozen elements per tensor; what CI runs on the CPU and under the Triton
  interpreter (``TRITON_INTERPRET=1``);
* ``full`` — shapes of real models (hidden sizes of thousands, vocabularies of tens of
  thousands), for GPUs.

Every case builds fresh random inputs from a seed (:class:`Builder`): odd sizes, the layouts
models actually pass (``[B, S, H, D]`` tensors transposed into ``[B, H, S, D]``, gate and up
as two halves of one projection, rows with a stride), and the op's edge cases: mixed dtypes
(a float32 norm weight with 16-bit activations), experts with no tokens, every token to one
expert, a token listing one expert twice, every label ``ignore_index``, a non-default
``ignore_index``, padding masks, partial rotary, values wide enough that statistics computed
in half precision would overflow.

Tensors are generated in float64 from seeded ``torch.Generator`` objects — on the device
under test for the large random tensors (generating hundreds of millions of float64 values
on the CPU would dominate a GPU run), on the CPU for small integer draws — then cast to the
dtype under test. A seed gives the same inputs on every run on the same kind of device. The
reference sees exactly those values, cast back to float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

SIZES = ("small", "full")

#: dtype name -> torch dtype
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


class Builder:
    """Random inputs for one case: generated in float64 on the CPU, cast, moved to the device."""

    def __init__(self, seed: int, dtype: torch.dtype, device: torch.device | str):
        self.gen = torch.Generator().manual_seed(int(seed))  # CPU: small integer draws
        self.dtype = dtype
        self.device = torch.device(device)
        if self.device.type == "cpu":
            self.dgen = self.gen
        else:
            self.dgen = torch.Generator(device=self.device).manual_seed(int(seed))

    def _out(self, t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        return t.to(dtype or self.dtype).to(self.device)

    def randn(self, *shape: int, scale: float = 1.0, shift: float = 0.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.randn(shape, generator=self.dgen, dtype=torch.float64, device=self.dgen.device) * scale + shift
        return self._out(t, dtype)

    def uniform(self, *shape: int, low: float, high: float, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.rand(shape, generator=self.dgen, dtype=torch.float64, device=self.dgen.device) * (high - low) + low
        return self._out(t, dtype)

    def randint(self, low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=self.gen).to(self.device)

    def randperm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen)

    def perms(self, rows: int, n: int) -> torch.Tensor:
        """``rows`` independent random permutations of ``range(n)`` (CPU, int64)."""
        return torch.rand(rows, n, generator=self.gen).argsort(dim=1)

    def strided(self, *shape: int, pad: int, scale: float = 1.0) -> torch.Tensor:
        """A ``shape`` tensor whose rows are ``pad`` elements longer than its last dimension
        (a slice of a wider buffer): rows are not contiguous, the last dimension is."""
        *lead, last = shape
        return self.randn(*lead, last + pad, scale=scale)[..., :last]

    def bshd(self, b: int, h: int, s: int, d: int, scale: float = 1.0) -> torch.Tensor:
        """``[B, H, S, D]`` as models pass it: a ``[B, S, H, D]`` projection, transposed (a view)."""
        return self.randn(b, s, h, d, scale=scale).transpose(1, 2)


@dataclass(frozen=True)
class Case:
    """One input configuration of an op.

    ``build(builder)`` returns the kernel's inputs by name (see the op's harness for the
    names). ``diff`` names the inputs the contract says backward differentiates (an input
    that is a list contributes each element). ``optional`` marks a form of input a kernel
    may refuse with a clear ``ValueError``/``TypeError``/``NotImplementedError`` (reported
    as unsupported, not as a failure) — used for the attention mask formats, which differ
    per implementation.
    """

    name: str
    build: Callable[[Builder], dict[str, Any]]
    diff: tuple[str, ...]
    about: str = ""
    optional: bool = False


@dataclass(frozen=True)
class OpHarness:
    """How to exercise one op.

    ``call(fn, inputs, reference)`` calls ``fn`` per the contract and returns the outputs
    to compare as a tuple of tensors (``reference`` is True for the float64 eager call,
    which may take a differently formatted input, e.g. the 4-D form of a 2-D mask).
    ``out_dtypes(dtype)`` lists, per output, the dtypes the contract allows for inputs of
    ``dtype``. ``out_masks(inputs)`` optionally marks, per output, which elements count
    (``None`` = all). ``reference[variant]`` is ``"module:function"`` of the core's eager kernel.
    """

    op: str
    out_names: tuple[str, ...]
    reference: dict[str, str]
    call: Callable[[Callable[..., Any], dict[str, Any], bool], tuple[torch.Tensor, ...]]
    out_dtypes: Callable[[torch.dtype], list[tuple[torch.dtype, ...]]]
    cases: Callable[[str, str], list[Case]]
    out_masks: Callable[[dict[str, Any]], list[torch.Tensor | None]] | None = None

    def reference_fn(self, variant: str) -> Callable[..., Any]:
        import importlib

        mod, _, attr = self.reference[variant].partition(":")
        return getattr(importlib.import_module(mod), attr)


def _same(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    return (dtype,)


def _loss_dtype(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    # The contract says float32; a float64 kernel may keep float64 (the eager reference does).
    return (torch.float32, torch.float64) if dtype == torch.float64 else (torch.float32,)


def _pick(size: str, small: Sequence[Case], full: Sequence[Case]) -> list[Case]:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; use one of {', '.join(SIZES)}")
    return list(small if size == "small" else full)


# --------------------------------------------------------------------------- rms_norm
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
        case("strided-rows-777x2048", "rows with a stride", lambda b: b.strided(777, 2048, pad=64), 2048),
        case("wide-range-64x8192", "|x| ~ 100 at hidden 8192", lambda b: b.randn(64, 8192, scale=100.0), 8192),
        case("odd-hidden-300x5121", "odd hidden size past a power of two", lambda b: b.randn(300, 5121), 5121),
        case("fp32-weight-512x4096", "float32 weight, 16-bit activations (mixed precision)",
             lambda b: b.randn(512, 4096), 4096, fp32_weight=True),
    ]
    return _pick(size, small, full)


RMS_NORM = OpHarness(
    op="rms_norm",
    out_names=("out",),
    reference={"standard": "veomni_ops.kernels.rms_norm:rms_norm_standard",
               "offset": "veomni_ops.kernels.rms_norm:rms_norm_offset"},
    call=_rms_call,
    out_dtypes=lambda dt: [_same(dt)],
    cases=_rms_cases,
)


# --------------------------------------------------------------------------- rotary
def cos_sin(b: Builder, batch: int, seq: int, rotary_dim: int, theta: float = 10000.0):
    """What a model's rotary embedding returns: ``cat(freqs, freqs)`` cos/sin ``[B, S, R]``,
    at random position offsets per sequence (packed / shifted positions)."""
    offsets = torch.randint(0, 4 * seq + 1, (batch, 1), generator=b.gen).to(torch.float64)
    pos = offsets + torch.arange(seq, dtype=torch.float64)
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(b.dtype).to(b.device), emb.sin().to(b.dtype).to(b.device)


def _rotary_call(fn, inp, reference):
    q, k = fn(inp["q"], inp["k"], inp["cos"], inp["sin"])
    return q, k


def _rotary_cases(variant: str, size: str) -> list[Case]:
    def case(name, about, bsz, hq, hk, s, d, transposed=False):
        # partial: a quarter of the head rotates (Qwen3.5 / Qwen3-Next), at least 2 channels.
        r = d if variant == "full" else max(2, d // 4)

        def build(b: Builder):
            if transposed:
                q, k = b.bshd(bsz, hq, s, d), b.bshd(bsz, hk, s, d)
            else:
                q, k = b.randn(bsz, hq, s, d), b.randn(bsz, hk, s, d)
            cos, sin = cos_sin(b, bsz, s, r)
            return {"q": q, "k": k, "cos": cos, "sin": sin}

        label = f"{name}-r{r}" if variant == "partial" else name
        return Case(label, build, ("q", "k"), about)

    small = [
        case("mha-1x2x2x5x16", "one sequence, as many kv heads as q heads", 1, 2, 2, 5, 16),
        case("gqa-2x4x2x7x32", "grouped-query heads, odd sequence", 2, 4, 2, 7, 32),
        case("bshd-view-2x4x1x9x64", "q/k as the model passes them: [B,S,H,D] transposed (not contiguous)",
             2, 4, 1, 9, 64, transposed=True),
    ]
    full = [
        case("gqa-2x32x8x512x128", "32 q / 8 kv heads, head dim 128", 2, 32, 8, 512, 128),
        case("bshd-view-1x16x2x1031x256", "model layout, odd sequence, head dim 256", 1, 16, 2, 1031, 256,
             transposed=True),
        case("mha-4x8x8x257x64", "head dim 64, odd sequence", 4, 8, 8, 257, 64),
    ]
    return _pick(size, small, full)


ROTARY = OpHarness(
    op="rotary",
    out_names=("q_out", "k_out"),
    reference={"full": "veomni_ops.kernels.rotary:apply_rotary", "partial": "veomni_ops.kernels.rotary:apply_rotary"},
    call=_rotary_call,
    out_dtypes=lambda dt: [_same(dt), _same(dt)],
    cases=_rotary_cases,
)


# --------------------------------------------------------------------------- swiglu
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
    return _pick(size, small, full)


SWIGLU = OpHarness(
    op="swiglu",
    out_names=("out",),
    reference={"standard": "veomni_ops.kernels.swiglu:silu_mul"},
    call=_swiglu_call,
    out_dtypes=lambda dt: [_same(dt)],
    cases=_swiglu_cases,
)


# --------------------------------------------------------------------------- cross_entropy
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
    return _pick(size, small, full)


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
    return _pick(size, small, full)


CROSS_ENTROPY = OpHarness(
    op="cross_entropy",
    out_names=("loss",),
    reference={"logits": "veomni_ops.kernels.cross_entropy:cross_entropy_sum",
               "fused_linear": "veomni_ops.kernels.cross_entropy:fused_linear_cross_entropy_sum"},
    call=_ce_call,
    out_dtypes=lambda dt: [_loss_dtype(dt)],
    cases=lambda variant, size: _ce_logits_cases(size) if variant == "logits" else _ce_linear_cases(size),
)


# --------------------------------------------------------------------------- moe_experts
def _moe_call(fn, inp, reference):
    return (fn(inp["hidden_states"], inp["top_k_index"], inp["top_k_weights"], inp["gate_up_proj"], inp["down_proj"]),)


def _moe_cases(variant: str, size: str) -> list[Case]:
    # H and I are multiples of 8, as in every real model: grouped GEMMs need 16-byte rows.
    def case(name, about, t, e, k, h, i, routing="random", pad=0):
        def build(b: Builder):
            hidden = b.strided(t, h, pad=pad) if pad else b.randn(t, h)
            if routing == "random":  # k distinct experts per token
                index = b.perms(t, e)[:, :k].contiguous()
            elif routing == "idle":  # only the first half of the experts get tokens
                index = b.perms(t, max(k, e // 2))[:, :k].contiguous()
            elif routing == "one":  # every route to one expert
                index = torch.full((t, k), e // 2, dtype=torch.long)
            elif routing == "duplicate":  # distinct routes, then every other token lists an expert twice
                index = b.perms(t, e)[:, :k].clone()
                index[::2, 1] = index[::2, 0]
            elif routing == "hot":  # half the tokens all go to expert 0 (load imbalance)
                index = b.perms(t, e)[:, :k].clone()
                hot = index[: t // 2]
                has0 = (hot == 0).any(dim=1)
                hot[~has0, 0] = 0
            else:
                raise ValueError(routing)
            router = torch.randn(t, k, generator=b.gen, dtype=torch.float64).softmax(-1)
            return {
                "hidden_states": hidden,
                "top_k_index": index.to(b.device),
                "top_k_weights": router.to(b.dtype).to(b.device),
                "gate_up_proj": b.randn(e, 2 * i, h, scale=1 / math.sqrt(h)),
                "down_proj": b.randn(e, h, i, scale=1 / math.sqrt(i)),
            }

        return Case(name, build, ("hidden_states", "top_k_weights", "gate_up_proj", "down_proj"), about)

    small = [
        case("random-13tok-e5-k2", "odd token count, random distinct routes", 13, 5, 2, 16, 24),
        case("idle-experts-16tok-e8-k2", "half the experts get no token", 16, 8, 2, 16, 8, routing="idle"),
        case("one-expert-9tok-e4-k2", "every route goes to one expert", 9, 4, 2, 8, 16, routing="one"),
        case("duplicate-routes-10tok-e4-k2", "tokens that list the same expert twice", 10, 4, 2, 16, 16,
             routing="duplicate"),
        case("strided-hidden-11tok-e4-k3", "hidden rows with a stride", 11, 4, 3, 16, 8, pad=8),
    ]
    full = [
        case("random-1031tok-e64-k8", "64 experts, top-8", 1031, 64, 8, 1024, 512),
        case("idle-experts-512tok-e128-k8", "half of 128 experts idle", 512, 128, 8, 512, 256, routing="idle"),
        case("hot-expert-1024tok-e32-k4", "half the tokens on expert 0", 1024, 32, 4, 1024, 768, routing="hot"),
        case("duplicate-routes-257tok-e16-k4", "duplicate routes", 257, 16, 4, 512, 384, routing="duplicate"),
        case("one-expert-300tok-e8-k2", "every route to one expert", 300, 8, 2, 1024, 512, routing="one"),
    ]
    return _pick(size, small, full)


MOE_EXPERTS = OpHarness(
    op="moe_experts",
    out_names=("out",),
    reference={"standard": "veomni_ops.kernels.moe:moe_experts_eager"},
    call=_moe_call,
    out_dtypes=lambda dt: [_same(dt)],
    cases=_moe_cases,
)


# --------------------------------------------------------------------------- load_balancing_loss
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
    return _pick(size, small, full)


LOAD_BALANCING_LOSS = OpHarness(
    op="load_balancing_loss",
    out_names=("loss",),
    reference={"standard": "veomni_ops.kernels.load_balancing:load_balancing_loss"},
    call=_lbl_call,
    out_dtypes=lambda dt: [_loss_dtype(dt)],
    cases=_lbl_cases,
)


# --------------------------------------------------------------------------- attention
class AttentionModule(torch.nn.Module):
    """The attributes transformers' attention modules carry that kernels read."""

    def __init__(self, head_dim: int, is_causal: bool):
        super().__init__()
        self.head_dim = head_dim
        self.is_causal = is_causal
        self.scaling = head_dim**-0.5
        self.layer_idx = 0
        self.eval()  # conformance is checked without dropout


def _attn_call(fn, inp, reference):
    mask = inp["ref_attention_mask"] if reference and "ref_attention_mask" in inp else inp["attention_mask"]
    out = fn(inp["module"], inp["query"], inp["key"], inp["value"], mask, dropout=0.0, scaling=inp["scaling"])
    if not isinstance(out, (tuple, list)) or len(out) < 1:
        raise TypeError(f"attention kernel returned {type(out).__name__}; the contract is (output, weights or None)")
    return (out[0],)


def _attn_out_masks(inp):
    rows = inp.get("valid_rows")  # [B, S] bool: padded query rows do not count
    return [None if rows is None else rows[:, :, None, None]]


def _attn_cases(variant: str, size: str) -> list[Case]:
    def case(name, about, bsz, hq, hk, s, d, *, causal=True, layout="plain", mask=None):
        def build(b: Builder):
            mk = b.bshd if layout == "bshd" else (lambda bb, h, ss, dd: b.randn(bb, h, ss, dd))
            q, k, v = mk(bsz, hq, s, d), mk(bsz, hk, s, d), mk(bsz, hk, s, d)
            out = {"module": AttentionModule(d, causal), "query": q, "key": k, "value": v,
                   "attention_mask": None, "scaling": d**-0.5}
            if mask:
                # right padding: sequence r has lens[r] real tokens; the first is full length
                lens = torch.randint(max(1, s // 3), s + 1, (bsz,), generator=b.gen)
                lens[0] = s
                valid = (torch.arange(s)[None, :] < lens[:, None]).to(b.device)  # [B, S]
                allowed = valid[:, None, None, :].expand(bsz, 1, s, s)
                if causal:
                    allowed = allowed & torch.ones(s, s, dtype=torch.bool, device=b.device).tril()
                if mask == "4d-bool":
                    out["attention_mask"] = allowed
                elif mask == "4d-additive":
                    neg = torch.finfo(b.dtype).min
                    zero = torch.zeros((), dtype=b.dtype, device=b.device)
                    out["attention_mask"] = torch.where(allowed, zero, torch.full((), neg, dtype=b.dtype, device=b.device))
                elif mask == "2d":
                    out["attention_mask"] = valid.long()  # the padding mask flash implementations receive
                    out["ref_attention_mask"] = allowed
                out["valid_rows"] = valid
            return out

        return Case(name, build, ("query", "key", "value"), about, optional=mask is not None)

    small = [
        case("causal-gqa-1x4x2x9x16", "causal, 4 q / 2 kv heads, odd sequence", 1, 4, 2, 9, 16),
        case("causal-mha-2x2x2x16x32", "causal, batch 2", 2, 2, 2, 16, 32),
        case("bshd-view-2x4x1x12x32", "model layout ([B,S,H,D] transposed), 4:1 GQA", 2, 4, 1, 12, 32, layout="bshd"),
        case("bidirectional-1x2x2x7x16", "module.is_causal = False", 1, 2, 2, 7, 16, causal=False),
        case("padding-4d-bool-3x4x2x10x16", "padding as a 4-D boolean mask (eager/sdpa form)", 3, 4, 2, 10, 16,
             causal=False, mask="4d-bool"),
        case("padding-4d-additive-2x2x2x8x16", "padding as a 4-D additive mask", 2, 2, 2, 8, 16, causal=False,
             mask="4d-additive"),
        case("padding-2d-3x4x2x10x16", "padding as a 2-D [B, S] mask (flash form)", 3, 4, 2, 10, 16, causal=False,
             mask="2d"),
    ]
    full = [
        case("causal-gqa-2x16x4x1024x128", "causal, 16 q / 4 kv heads, head dim 128", 2, 16, 4, 1024, 128),
        case("bshd-view-1x32x8x1031x128", "model layout, odd sequence", 1, 32, 8, 1031, 128, layout="bshd"),
        case("causal-mha-1x8x8x2048x64", "head dim 64, sequence 2048", 1, 8, 8, 2048, 64),
        case("bidirectional-2x8x2x777x128", "not causal, odd sequence", 2, 8, 2, 777, 128, causal=False),
        case("padding-4d-bool-4x8x2x512x128", "padding, 4-D boolean mask", 4, 8, 2, 512, 128, causal=False,
             mask="4d-bool"),
        case("padding-2d-4x8x2x512x128", "padding, 2-D mask (flash form)", 4, 8, 2, 512, 128, causal=False,
             mask="2d"),
    ]
    return _pick(size, small, full)


ATTENTION = OpHarness(
    op="attention",
    out_names=("out",),
    reference={"standard": "veomni_ops.kernels.attention:eager_attention"},
    call=_attn_call,
    out_dtypes=lambda dt: [_same(dt)],
    cases=_attn_cases,
    out_masks=_attn_out_masks,
)


HARNESSES: dict[str, OpHarness] = {
    h.op: h for h in (RMS_NORM, ROTARY, SWIGLU, CROSS_ENTROPY, MOE_EXPERTS, LOAD_BALANCING_LOSS, ATTENTION)
}


def harness(op: str) -> OpHarness:
    try:
        return HARNESSES[op]
    except KeyError:
        raise ValueError(f"the conformance kit has no cases for op {op!r}; ops: {', '.join(HARNESSES)}") from None


#: The former private name, still imported by tests outside the core.
_router_logits = router_logits
