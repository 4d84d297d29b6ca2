#!/usr/bin/env python
"""Check every kernel veomni-liger registers against a float64 reference, on a CUDA GPU.

Real shapes (the seed benchmark's: batch 4, sequence 2048, hidden 2560, intermediate 6912;
RoPE 32 q / 8 kv heads, head dim 128; partial RoPE 16 q / 2 kv heads, head dim 256, rotary
dim 64; fused linear cross-entropy hidden 2560, vocabulary 151936, 8192 tokens; MoE
Qwen3-30B-A3B-like: 128 experts, top-8, hidden 2048, expert intermediate 768, 8192 tokens),
forward and backward, float32 and bfloat16 (``--dtypes`` to change). Each output and
gradient must satisfy the kernel's declared tolerance (``veomni_liger.specs``):
``|got - ref| <= atol * max(1, max|ref|) + rtol * |ref|`` elementwise.

Also (``--no-compile`` to skip) whether ``torch.compile(fullgraph=True)`` traces each kernel,
forward and backward, and gives the eager result: the specs claim ``supports_compile=False``
until this says otherwise.

Usage (from the repository root, or anywhere: the script finds core/ and the plugin)::

    python plugins/veomni-liger/gpu/check_liger.py --json liger_check.json

Needs: a CUDA GPU (sm 8.0+; MoE sm 9.0+), torch, triton, liger-kernel; veomni-ops and
veomni-liger installed or in this checkout. Exit status 1 if any case fails or errors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[3]
for p in (REPO / "core" / "src", HERE.parents[1] / "src"):
    if p.is_dir() and str(p) not in sys.path:
        sys.path.insert(0, str(p))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the results as JSON to this path")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated (float32,bfloat16,float16)")
    ap.add_argument("--only", default="", help="comma-separated case-name prefixes to run (default: all)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile(fullgraph=True) checks")
    ap.add_argument("--no-moe-autotune", action="store_true",
                    help="set LIGER_FUSED_MOE_AUTOTUNE=0 (one config per MoE kernel, no autotuning)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes on the CPU under TRITON_INTERPRET=1 (tests this script, not the GPU)")
    return ap.parse_args()


ARGS = parse_args()
if ARGS.no_moe_autotune or ARGS.smoke:
    os.environ["LIGER_FUSED_MOE_AUTOTUNE"] = "0"
if ARGS.smoke:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEV = "cpu" if ARGS.smoke else "cuda"

#: Problem sizes. --smoke shrinks them to what Triton's CPU interpreter can run.
SHAPES = {
    "rms": (4, 2048, 2560),  # batch, sequence, hidden
    "rope_full": (4, 32, 8, 2048, 128, 128),  # batch, q heads, kv heads, sequence, head dim, rotary dim
    "rope_partial": (4, 16, 2, 2048, 256, 64),
    "swiglu": (4, 2048, 6912),
    "ce": (8192, 151936),  # tokens, vocabulary
    "flce": (8192, 2560, 151936),  # tokens, hidden, vocabulary
    "flce_bias_vocab": 32000,
    "moe": (8192, 2048, 768, 128, 8),  # tokens, hidden, expert intermediate, experts, top-k
}
if ARGS.smoke:
    SHAPES.update(
        rms=(2, 8, 64), rope_full=(2, 4, 2, 8, 32, 32), rope_partial=(2, 4, 2, 8, 64, 16), swiglu=(2, 8, 96),
        ce=(24, 300), flce=(24, 32, 300), flce_bias_vocab=100, moe=(70, 32, 16, 4, 2),
    )


# ---------------------------------------------------------------------------------------
# --smoke only: let Triton's CPU interpreter run Liger's RMSNorm/SwiGLU (as the tests do)
# ---------------------------------------------------------------------------------------


def install_interpreter_shims() -> None:
    """Scalar args arrive as Python floats under the interpreter (Liger calls ``.to()`` on
    them) and libdevice's rsqrt is missing there. Never used on a GPU."""
    import triton
    import triton.language as tl
    import veomni_liger.kernels.rms_norm as rms
    from liger_kernel.ops import rms_norm as liger_rms
    from liger_kernel.ops import swiglu as liger_swiglu

    class InterpFloat(float):
        def to(self, dtype):
            return float(self)

    @triton.jit
    def _rsqrt(x):
        return tl.rsqrt(x)

    # The interpreter resolves names through the jit function's globals: make `tl` one.
    _rsqrt.fn.__globals__.setdefault("tl", tl)
    liger_rms.rsqrt = _rsqrt
    real = rms.LigerRMSNormFunction

    class ScalarShim:
        @staticmethod
        def apply(x, w, eps, offset, casting_mode, in_place):
            return real.apply(x, w, InterpFloat(eps), InterpFloat(offset), casting_mode, in_place)

    rms.LigerRMSNormFunction = ScalarShim
    liger_swiglu.float = InterpFloat


# ---------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------


def spec_for(op: str, variant: str):
    import veomni_liger.specs as specs

    return next(s for s in getattr(specs, op)() if s.variant == variant)


def compare(got: torch.Tensor, ref: torch.Tensor, tol, chunk: int = 1 << 25) -> dict:
    """Elementwise check against the reference, in float64, chunk by chunk (logits are 1.2e9 elements)."""
    if got.shape != ref.shape:
        return {"ok": False, "why": f"shape {tuple(got.shape)} != {tuple(ref.shape)}"}
    g = got.detach().reshape(-1)
    r = ref.detach().reshape(-1)
    if r.device != g.device:
        r = r.to(g.device)
    numel = g.numel()
    if numel == 0:
        return {"ok": True, "numel": 0}
    ref_max = max(r[i:i + chunk].abs().max().item() for i in range(0, numel, chunk))
    scale = max(1.0, ref_max)
    n_bad, max_err, worst, finite = 0, 0.0, 0.0, True
    for i in range(0, numel, chunk):
        gc = g[i:i + chunk].double()
        rc = r[i:i + chunk].double()
        finite = finite and bool(torch.isfinite(gc).all())
        err = (gc - rc).abs()
        bound = tol.atol * scale + tol.rtol * rc.abs()
        n_bad += int((err > bound).sum())
        max_err = max(max_err, err.max().item())
        # Error in units of the allowed bound (<= 1 passes): the tolerance's headroom.
        worst = max(worst, (err / bound).max().item())
        del gc, rc, err, bound
    return {
        "ok": finite and n_bad == 0,
        "max_abs_err": max_err,
        "ref_max_abs": ref_max,
        "worst_err_over_bound": worst,
        "n_bad": n_bad,
        "numel": numel,
        "finite": finite,
        "tolerance": [tol.atol, tol.rtol],
    }


def dt(name: str) -> torch.dtype:
    return getattr(torch, name)


# ---------------------------------------------------------------------------------------
# float64 references (the op contracts)
# ---------------------------------------------------------------------------------------


def ref_rms(x, w, eps, variant):
    x = x.double()
    w = w.double()
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return xhat * w if variant == "standard" else xhat * (1.0 + w)


def ref_rope(q, k, cos, sin):
    r = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]

    def rot(x):
        xr, xp = x[..., :r], x[..., r:]
        rh = torch.cat([-xr[..., r // 2:], xr[..., : r // 2]], dim=-1)
        return torch.cat([xr * cos + rh * sin, xp], dim=-1)

    return rot(q), rot(k)


def ref_ce_chunked(z_fn, n, labels, ignore_index, grad_scale, chunk=1024):
    """Loss sum and d(loss * grad_scale)/dz per chunk, float64, without holding all logits."""
    total = torch.zeros((), dtype=torch.float64, device=DEV)
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        z = z_fn(s, e)  # float64 [c, V]
        lab = labels[s:e]
        mask = lab != ignore_index
        safe = torch.where(mask, lab, torch.zeros_like(lab))
        lse = torch.logsumexp(z, -1)
        zy = z.gather(1, safe[:, None])[:, 0]
        total += ((lse - zy) * mask).sum()
        p = torch.softmax(z, -1)
        p[torch.arange(e - s, device=DEV), safe] -= 1.0
        p[~mask] = 0.0
        yield s, e, p * grad_scale
        del z, p
    yield None, None, total


def rope_cos_sin(batch, seq, r, dtype):
    inv = 1.0 / (1_000_000 ** (torch.arange(0, r, 2, dtype=torch.float64, device=DEV) / r))
    pos = torch.arange(seq, dtype=torch.float64, device=DEV)[None] + 17 * torch.arange(batch, device=DEV)[:, None]
    f = pos[..., None] * inv
    emb = torch.cat([f, f], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


# ---------------------------------------------------------------------------------------
# cases: each returns {name: comparison}
# ---------------------------------------------------------------------------------------


def case_rms(variant, dtype):
    from veomni_liger.kernels.rms_norm import rms_norm_offset, rms_norm_standard

    fn = rms_norm_standard if variant == "standard" else rms_norm_offset
    tol = spec_for("rms_norm", variant).tolerance(str(dtype).removeprefix("torch."))
    b, s, h = SHAPES["rms"]
    x = torch.randn(b, s, h, device=DEV, dtype=dtype, requires_grad=True)
    base = 1.0 if variant == "standard" else 0.0
    w = (base + 0.1 * torch.randn(h, device=DEV)).to(dtype).requires_grad_()
    y = fn(x, w, 1e-6)
    g = torch.randn_like(y)
    y.backward(g)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    r = ref_rms(x64, w64, 1e-6, variant)
    r.backward(g.double())
    return {"y": compare(y, r, tol), "dx": compare(x.grad, x64.grad, tol), "dw": compare(w.grad, w64.grad, tol)}


def case_rope(variant, dtype):
    from veomni_liger.kernels.rotary import apply_rotary_full, apply_rotary_partial

    tol = spec_for("rotary", variant).tolerance(str(dtype).removeprefix("torch."))
    b, hq, hk, s, d, r = SHAPES["rope_" + variant]
    fn = apply_rotary_full if variant == "full" else apply_rotary_partial
    # transformers' layout: q_proj(x).view(B, S, H, D).transpose(1, 2)
    q = torch.randn(b, s, hq, d, device=DEV, dtype=dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(b, s, hk, d, device=DEV, dtype=dtype).transpose(1, 2).requires_grad_()
    cos, sin = rope_cos_sin(b, s, r, dtype)
    q0, k0 = q.detach().clone(), k.detach().clone()
    oq, ok = fn(q, k, cos, sin)
    gq, gk = torch.randn_like(oq), torch.randn_like(ok)
    gq0 = gq.clone()
    torch.autograd.backward((oq, ok), (gq, gk))
    q64 = q0.double().requires_grad_()
    k64 = k0.double().requires_grad_()
    rq, rk = ref_rope(q64, k64, cos.double(), sin.double())
    torch.autograd.backward((rq, rk), (gq0.double(), gk.double()))
    out = {
        "q": compare(oq, rq, tol),
        "k": compare(ok, rk, tol),
        "dq": compare(q.grad, q64.grad, tol),
        "dk": compare(k.grad, k64.grad, tol),
    }
    out["inputs_untouched"] = {"ok": bool(torch.equal(q.detach(), q0) and torch.equal(gq, gq0))}
    if variant == "partial":
        out["pass_through_bitwise"] = {"ok": bool(torch.equal(oq[..., r:], q0[..., r:]))}
    return out


def case_swiglu(variant, dtype):
    from veomni_liger.kernels.swiglu import silu_mul

    tol = spec_for("swiglu", "standard").tolerance(str(dtype).removeprefix("torch."))
    shape = SHAPES["swiglu"]
    gate0 = torch.randn(shape, device=DEV, dtype=dtype)
    up0 = torch.randn(shape, device=DEV, dtype=dtype)
    gate = gate0.clone().requires_grad_()
    up = up0.clone().requires_grad_()
    # Non-leaf views, as an MLP's projections give them (Liger writes grads into them).
    out = silu_mul(gate * 1, up * 1)
    g = torch.randn_like(out)
    out.backward(g)
    g64 = gate0.double().requires_grad_()
    u64 = up0.double().requires_grad_()
    ref = F.silu(g64) * u64
    ref.backward(g.double())
    return {"out": compare(out, ref, tol), "dgate": compare(gate.grad, g64.grad, tol),
            "dup": compare(up.grad, u64.grad, tol)}


def _labels(n, vocab, ignored_frac=0.1):
    labels = torch.randint(0, vocab, (n,), device=DEV)
    labels[torch.rand(n, device=DEV) < ignored_frac] = -100
    return labels


def case_ce_logits(variant, dtype):
    from veomni_liger.kernels.cross_entropy import cross_entropy_sum

    tol = spec_for("cross_entropy", "logits").tolerance(str(dtype).removeprefix("torch."))
    n, vocab = SHAPES["ce"]
    logits0 = (2.0 * torch.randn(n, vocab, device=DEV)).to(dtype)
    labels = _labels(n, vocab)
    count = int((labels != -100).sum())
    x = logits0.clone().requires_grad_()  # Liger writes the gradient into it
    loss = cross_entropy_sum(x, labels)
    (loss / count).backward()
    grad = x.grad
    ref_grad = torch.empty(n, vocab, device=DEV, dtype=torch.float32)
    gen = ref_ce_chunked(lambda s, e: logits0[s:e].double(), n, labels, -100, 1.0 / count)
    for s, e, val in gen:
        if s is None:
            total = val
        else:
            ref_grad[s:e] = val.float()
    # The float64 gradient is kept in float32 (5 GB instead of 10): far below bf16/fp32 tolerances.
    out = {"loss": compare(loss, total, tol), "dlogits": compare(grad, ref_grad, tol)}
    return out


def case_ce_fused(variant, dtype, with_bias=False):
    from veomni_liger.kernels.cross_entropy import fused_linear_cross_entropy_sum

    tol = spec_for("cross_entropy", "fused_linear").tolerance(str(dtype).removeprefix("torch."))
    n, h, vocab = SHAPES["flce"]
    if with_bias:
        vocab = SHAPES["flce_bias_vocab"]
    hidden = torch.randn(n, h, device=DEV, dtype=dtype, requires_grad=True)
    weight = (torch.randn(vocab, h, device=DEV) * (2.0 / h**0.5)).to(dtype).requires_grad_()
    bias = (0.5 * torch.randn(vocab, device=DEV)).to(dtype).requires_grad_() if with_bias else None
    labels = _labels(n, vocab)
    count = int((labels != -100).sum())
    if DEV == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base_mem = torch.cuda.memory_allocated()
    loss = fused_linear_cross_entropy_sum(hidden, weight, labels, bias=bias)
    (loss / count).backward()
    peak = (torch.cuda.max_memory_allocated() - base_mem) / 2**30 if DEV == "cuda" else 0.0
    h64 = hidden.detach().double()
    w64 = weight.detach().double()
    b64 = bias.detach().double() if with_bias else None
    dh = torch.zeros_like(h64)
    dw = torch.zeros_like(w64)
    db = torch.zeros(vocab, dtype=torch.float64, device=DEV) if with_bias else None

    def z_fn(s, e):
        z = h64[s:e] @ w64.T
        return z + b64 if b64 is not None else z

    for s, e, val in ref_ce_chunked(z_fn, n, labels, -100, 1.0 / count):
        if s is None:
            total = val
            continue
        dh[s:e] = val @ w64
        dw += val.T @ h64[s:e]
        if db is not None:
            db += val.sum(0)
    out = {
        "loss": compare(loss, total, tol),
        "dhidden": compare(hidden.grad, dh, tol),
        "dweight": compare(weight.grad, dw, tol),
        "peak_gib_above_inputs": {"ok": True, "value": round(peak, 3)},
    }
    if with_bias:
        out["dbias"] = compare(bias.grad, db, tol)
    return out


def ref_moe(x, idx, w, gate_up, down):
    out = torch.zeros_like(x)
    inter = gate_up.shape[1] // 2
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    start = 0
    k = idx.shape[1]
    for e, c in enumerate(counts):
        if c == 0:
            continue
        sel = order[start:start + c]
        start += c
        tok = sel // k
        gu = x[tok] @ gate_up[e].T
        y = (F.silu(gu[:, :inter]) * gu[:, inter:]) @ down[e].T
        out = out.index_add(0, tok, y * w.reshape(-1)[sel, None])
    return out


def case_moe(variant, dtype):
    from veomni_liger.kernels.moe import moe_experts

    tol = spec_for("moe_experts", "standard").tolerance(str(dtype).removeprefix("torch."))
    t, h, i, e, k = SHAPES["moe"]
    x = torch.randn(t, h, device=DEV, dtype=dtype, requires_grad=True)
    gate_up = (torch.randn(e, 2 * i, h, device=DEV) / h**0.5).to(dtype).requires_grad_()
    down = (torch.randn(e, h, i, device=DEV) / i**0.5).to(dtype).requires_grad_()
    router = torch.randn(t, e, device=DEV)
    router[:, 0] += 2.0  # a popular expert
    router[:, e - 1] = -1e9  # an expert no token picks
    probs = router.softmax(-1)
    w, idx = probs.topk(k, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).requires_grad_()  # float32 routing weights
    out = moe_experts(x, idx, w, gate_up, down)
    g = torch.randn_like(out)
    out.backward(g)
    leaves = [p.detach().double().requires_grad_() for p in (x, w, gate_up, down)]
    ref = ref_moe(leaves[0], idx, leaves[1], leaves[2], leaves[3])
    ref.backward(g.double())
    names = ["dx", "dweights", "dgate_up", "ddown"]
    res = {"out": compare(out, ref, tol)}
    for name, got, want in zip(names, (x, w, gate_up, down), leaves):
        res[name] = compare(got.grad, want.grad, tol)
    res["empty_expert_zero_grad"] = {"ok": bool((gate_up.grad[e - 1] == 0).all() and (down.grad[e - 1] == 0).all())}
    return res


CASES = [
    ("rms_norm/standard", lambda d: case_rms("standard", d)),
    ("rms_norm/offset", lambda d: case_rms("offset", d)),
    ("rotary/full", lambda d: case_rope("full", d)),
    ("rotary/partial", lambda d: case_rope("partial", d)),
    ("swiglu/standard", lambda d: case_swiglu("standard", d)),
    ("cross_entropy/logits", lambda d: case_ce_logits("logits", d)),
    ("cross_entropy/fused_linear", lambda d: case_ce_fused("fused_linear", d)),
    ("cross_entropy/fused_linear+bias", lambda d: case_ce_fused("fused_linear", d, with_bias=True)),
    ("moe_experts/standard", lambda d: case_moe("standard", d)),
]


# ---------------------------------------------------------------------------------------
# torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------------------


def compile_checks() -> list[dict]:
    from veomni_liger.kernels import cross_entropy as ce
    from veomni_liger.kernels import moe, rms_norm, rotary, swiglu

    def rms_std():
        x = torch.randn(4, 64, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        return rms_norm.rms_norm_standard, (x, w, 1e-6)

    def rms_off():
        x = torch.randn(4, 64, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        w = torch.zeros(256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        return rms_norm.rms_norm_offset, (x, w, 1e-6)

    def rope(partial):
        d, r = (128, 32) if partial else (128, 128)
        q = torch.randn(2, 64, 8, d, device=DEV, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        kk = torch.randn(2, 64, 2, d, device=DEV, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
        cos, sin = rope_cos_sin(2, 64, r, torch.bfloat16)
        fn = rotary.apply_rotary_partial if partial else rotary.apply_rotary_full
        return fn, (q, kk, cos, sin)

    def silu():
        g = torch.randn(128, 512, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        u = torch.randn(128, 512, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        return (lambda a, b: swiglu.silu_mul(a * 1, b * 1)), (g, u)

    def ce_logits():
        z = torch.randn(64, 1000, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        return (lambda a, lab: ce.cross_entropy_sum(a * 1, lab)), (z, torch.randint(0, 1000, (64,), device=DEV))

    def flce():
        hh = torch.randn(64, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(1000, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        return ce.fused_linear_cross_entropy_sum, (hh, w, torch.randint(0, 1000, (64,), device=DEV))

    def moe_case():
        x = torch.randn(64, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        gu = torch.randn(8, 256, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        dn = torch.randn(8, 256, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        idx = torch.randint(0, 8, (64, 2), device=DEV)
        w = torch.rand(64, 2, device=DEV, requires_grad=True)
        return moe.moe_experts, (x, idx, w, gu, dn)

    makers = [("rms_norm/standard", rms_std), ("rms_norm/offset", rms_off),
              ("rotary/full", lambda: rope(False)), ("rotary/partial", lambda: rope(True)),
              ("swiglu/standard", silu), ("cross_entropy/logits", ce_logits),
              ("cross_entropy/fused_linear", flce), ("moe_experts/standard", moe_case)]
    results = []
    for name, make in makers:
        rec = {"kernel": name}
        t0 = time.time()
        try:
            torch._dynamo.reset()
            fn, args = make()

            def run(f, args=args):
                cloned = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
                          and a.is_floating_point() else a for a in args]
                out = f(*cloned)
                outs = out if isinstance(out, tuple) else (out,)
                sum(o.float().sum() for o in outs).backward()
                grads = [c.grad for c in cloned if isinstance(c, torch.Tensor) and c.requires_grad]
                return [o.detach() for o in outs] + grads

            eager = run(fn)
            compiled = run(torch.compile(fn, fullgraph=True))
            same = all(torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1e-2) for a, b in zip(eager, compiled))
            rec.update(traced=True, matches_eager=bool(same))
        except Exception as ex:  # noqa: BLE001 - report, go on
            rec.update(traced=False, error=f"{type(ex).__name__}: {str(ex).splitlines()[0][:300]}")
        rec["seconds"] = round(time.time() - t0, 1)
        results.append(rec)
    return results


# ---------------------------------------------------------------------------------------


def environment() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def ver(d):
        try:
            return version(d)
        except PackageNotFoundError:
            return None

    on_gpu = DEV == "cuda"
    return {
        "device": torch.cuda.get_device_properties(0).name if on_gpu else "cpu (Triton interpreter, --smoke)",
        "capability": list(torch.cuda.get_device_capability(0)) if on_gpu else [0, 0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": ver("triton"),
        "liger-kernel": ver("liger-kernel"),
        "transformers": ver("transformers"),
        "veomni-liger": ver("veomni-liger") or "checkout",
        "python": platform.python_version(),
        "moe_autotune": os.environ.get("LIGER_FUSED_MOE_AUTOTUNE", "1"),
        "shapes": SHAPES,
    }


def main() -> int:
    if not ARGS.smoke and not torch.cuda.is_available():
        print("check_liger: no CUDA device; this script checks the GPU kernels (--smoke runs it on the CPU)",
              file=sys.stderr)
        return 2
    if ARGS.smoke:
        install_interpreter_shims()
    env = environment()
    print("environment:", json.dumps(env))
    dtypes = [d.strip() for d in ARGS.dtypes.split(",") if d.strip()]
    only = [o.strip() for o in ARGS.only.split(",") if o.strip()]
    cap = tuple(env["capability"])
    results = []
    for name, fn in CASES:
        if only and not any(name.startswith(o) for o in only):
            continue
        for d in dtypes:
            rec = {"case": name, "dtype": d}
            if name.startswith("moe_experts") and cap < (9, 0) and not ARGS.smoke:
                rec.update(status="skipped", why="spec needs sm 9.0+")
                results.append(rec)
                continue
            torch.manual_seed(ARGS.seed)
            t0 = time.time()
            try:
                checks = fn(dt(d))
                rec["checks"] = checks
                rec["status"] = "pass" if all(c.get("ok") for c in checks.values()) else "FAIL"
            except Exception as ex:  # noqa: BLE001 - one case must not stop the others
                rec["status"] = "ERROR"
                rec["error"] = f"{type(ex).__name__}: {ex}"
                rec["traceback"] = traceback.format_exc(limit=8)
            rec["seconds"] = round(time.time() - t0, 1)
            results.append(rec)
            torch.cuda.empty_cache()
            print(_row(rec), flush=True)

    comp = [] if ARGS.no_compile or ARGS.smoke else compile_checks()

    print("\n== numerics (worst error / allowed bound per check; <= 1 passes) ==")
    for rec in results:
        print(_row(rec))
        if rec["status"] == "ERROR":
            print("   ", rec["traceback"].replace("\n", "\n    "))
    if comp:
        print("\n== torch.compile(fullgraph=True), forward+backward, bf16 ==")
        for c in comp:
            state = ("traces, matches eager" if c.get("matches_eager") else "traces, DIFFERS from eager") \
                if c["traced"] else f"does not trace: {c['error']}"
            print(f"  {c['kernel']:<28} {state}  ({c['seconds']} s)")
    failed = [r for r in results if r["status"] in ("FAIL", "ERROR")]
    print(f"\n{len(results) - len(failed)}/{len(results)} cases pass" + (f"; FAILED: {[r['case'] + '/' + r['dtype'] for r in failed]}" if failed else ""))
    if ARGS.json:
        ARGS.json.parent.mkdir(parents=True, exist_ok=True)
        ARGS.json.write_text(json.dumps({"environment": env, "results": results, "compile": comp}, indent=1))
        print(f"wrote {ARGS.json}")
    return 1 if failed else 0


def _row(rec: dict) -> str:
    head = f"{rec['case']:<42} {rec['dtype']:<9} {rec['status']:<7}"
    if rec.get("status") == "ERROR":
        return head + " " + rec["error"][:200]
    if rec.get("status") == "skipped":
        return head + " " + rec["why"]
    parts = []
    for k, c in rec.get("checks", {}).items():
        if "worst_err_over_bound" in c:
            parts.append(f"{k}={c['worst_err_over_bound']:.2g}{'' if c['ok'] else '!'}")
        elif "value" in c:
            parts.append(f"{k}={c['value']}")
        else:
            parts.append(f"{k}={'ok' if c['ok'] else 'NO'}")
    return head + " " + " ".join(parts) + f"  ({rec.get('seconds', '?')} s)"


if __name__ == "__main__":
    sys.exit(main())
