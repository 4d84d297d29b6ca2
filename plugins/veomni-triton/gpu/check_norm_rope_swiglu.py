"""Numerics of veomni-triton's rms_norm, rotary and swiglu kernels at real shapes, on a CUDA GPU.

Every case runs forward and backward of our kernel and of a float64 reference on the same
inputs and checks ``|ours - ref| <= atol*scale + rtol*|ref|`` with the tolerances our
KernelSpec declares (``scale`` = sqrt(rows) for the weight gradient, a sum over rows). The
core's eager kernels, when importable, are compared the same way. Also checked: the
batch-invariant RMSNorm gives a row the same bits whatever the batch, and backward is
deterministic run to run.

    python plugins/veomni-triton/gpu/check_norm_rope_swiglu.py [--json out.json]

Needs: a CUDA GPU (sm80+), torch, triton. Prints a table; exits 1 if any case fails or errors.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback

import torch
from _setup import device, pick

ROWS: list[dict] = []


def tol_for(op: str, dtype: torch.dtype):
    import veomni_triton.specs as specs

    spec = next(s for s in getattr(specs, op)() if s.name == "triton")
    return spec.tolerance(str(dtype).removeprefix("torch."))


def compare(op, case, kernel, dtype, name, actual, expected, scale=1.0, against="float64"):
    tol = tol_for(op, dtype)
    a = actual.detach().double()
    e = expected.detach().double()
    err = (a - e).abs()
    bound = tol.atol * scale + tol.rtol * e.abs()
    ratio = (err / bound).max().item() if err.numel() else 0.0
    finite = bool(torch.isfinite(a).all())
    ok = finite and ratio <= 1.0 and actual.shape == expected.shape
    ROWS.append(
        {
            "op": op, "kernel": kernel, "case": case, "dtype": str(dtype).removeprefix("torch."), "tensor": name,
            "against": against, "max_abs_err": err.max().item() if err.numel() else 0.0,
            "worst_err_over_tol": ratio, "pass": ok,
        }
    )
    return ok


def record(op, case, kernel, dtype, name, ok, note=""):
    ROWS.append(
        {
            "op": op, "kernel": kernel, "case": case, "dtype": str(dtype).removeprefix("torch."), "tensor": name,
            "against": note, "max_abs_err": None, "worst_err_over_tol": None, "pass": bool(ok),
        }
    )


def guarded(fn, op, case, kernel, dtype):
    try:
        fn()
    except Exception as e:  # one broken case must not hide the others
        traceback.print_exc()
        record(op, case, kernel, dtype, "ERROR", False, f"{type(e).__name__}: {e}"[:200])
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def core(module):
    try:
        import importlib

        return importlib.import_module(f"veomni_ops.kernels.{module}")
    except Exception:
        return None


# --------------------------------------------------------------------------- rms_norm
def rms_ref(x, w, eps, variant, dtype=None):
    """The contract in float64; the standard variant rounds x̂ to ``dtype`` (the input dtype)
    before the weight multiply, with a straight-through gradient as autograd of .to()."""
    dtype = dtype or x.dtype
    x64 = x.double()
    xhat = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    if variant == "offset":
        return xhat * (1.0 + w.double())
    return w.double() * (xhat + (xhat.to(dtype).double() - xhat).detach())


def check_rms_norm(dev):
    from veomni_triton.kernels import rms_norm as K

    fns = {
        ("standard", "triton"): K.rms_norm_standard,
        ("offset", "triton"): K.rms_norm_offset,
        ("standard", "triton_batch_invariant"): K.rms_norm_standard_batch_invariant,
        ("offset", "triton_batch_invariant"): K.rms_norm_offset_batch_invariant,
    }
    eps = 1e-6
    shapes = pick(
        {
            "seed [4,2048,2560]": (4, 2048, 2560),
            "qk-norm [4,2048,32,128]": (4, 2048, 32, 128),
            "[2,1000,5120]": (2, 1000, 5120),
            "[3,333,8192]": (3, 333, 8192),
            "[517,16384]": (517, 16384),
            "[4097,1000]": (4097, 1000),
        },
        {"seed (smoke)": (2, 3, 40), "odd (smoke)": (5, 33)},
    )
    c = core("rms_norm")
    for (variant, kernel), fn in fns.items():
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for case, shape in shapes.items():
                if dtype != torch.bfloat16 and not case.startswith("seed"):
                    continue
                for strided in (False, True):
                    if strided and not case.startswith("seed"):
                        continue
                    label = case + (" rows of a wider buffer" if strided else "")

                    def run(shape=shape, strided=strided, label=label, fn=fn, variant=variant, dtype=dtype,
                            kernel=kernel):
                        n = shape[-1]
                        if strided:
                            x = torch.randn(*shape[:-1], 2 * n, device=dev, dtype=dtype)[..., n // 2 : n // 2 + n]
                        else:
                            x = torch.randn(shape, device=dev, dtype=dtype)
                        x.requires_grad_()
                        w = (1 + 0.5 * torch.randn(n, device=dev)).to(dtype).requires_grad_()
                        y = fn(x, w, eps)
                        dy = torch.randn_like(y)
                        y.backward(dy)
                        x64 = x.detach().double().requires_grad_()
                        w64 = w.detach().double().requires_grad_()
                        rms_ref(x64, w64, eps, variant, dtype).backward(dy.double())
                        rows = x.numel() // n
                        compare("rms_norm", f"{variant} {label}", kernel, dtype, "y", y, rms_ref(x.detach(), w.detach(), eps, variant))
                        compare("rms_norm", f"{variant} {label}", kernel, dtype, "dx", x.grad, x64.grad)
                        compare("rms_norm", f"{variant} {label}", kernel, dtype, "dw", w.grad, w64.grad, math.sqrt(rows))
                        if c is not None and kernel == "triton":
                            ref_fn = c.rms_norm_standard if variant == "standard" else c.rms_norm_offset
                            xr = x.detach().clone().requires_grad_()
                            wr = w.detach().clone().requires_grad_()
                            yr = ref_fn(xr, wr, eps)
                            yr.backward(dy)
                            compare("rms_norm", f"{variant} {label}", kernel, dtype, "y", y, yr, against="core eager")
                            compare("rms_norm", f"{variant} {label}", kernel, dtype, "dx", x.grad, xr.grad, against="core eager")
                            compare("rms_norm", f"{variant} {label}", kernel, dtype, "dw", w.grad, wr.grad,
                                    math.sqrt(rows), against="core eager")
                        # backward determinism: same inputs, same bits
                        x.grad = w.grad = None
                        fn(x, w, eps).backward(dy)
                        g1 = (x.grad.clone(), w.grad.clone())
                        x.grad = w.grad = None
                        fn(x, w, eps).backward(dy)
                        same = torch.equal(g1[0], x.grad) and torch.equal(g1[1], w.grad)
                        record("rms_norm", f"{variant} {label}", kernel, dtype, "bwd deterministic", same, "bitwise")

                    guarded(run, "rms_norm", f"{variant} {label}", kernel, dtype)

    # batch invariance, bitwise, at real widths
    for variant in ("standard", "offset"):
        for kernel in ("triton_batch_invariant", "triton"):
            fn = fns[(variant, kernel)]
            for n in pick((2560, 128, 4096, 5120), (40,)):

                def run(fn=fn, n=n, kernel=kernel, variant=variant):
                    total = pick(2048, 12)
                    x = torch.randn(total, n, device=dev, dtype=torch.bfloat16)
                    w = torch.randn(n, device=dev, dtype=torch.bfloat16)
                    full = fn(x, w, 1e-6)
                    same = True
                    for m in (1, 2, 3, 7, 16, 31, 100, 257, 1000, 2047):
                        if m >= total:
                            continue
                        for start in (0, 5, total - m):
                            part = fn(x[start : start + m], w, 1e-6)
                            same &= torch.equal(part, full[start : start + m])
                    if kernel == "triton_batch_invariant":
                        record("rms_norm", f"{variant} N={n} rows alone vs in batches", kernel, torch.bfloat16,
                               "batch-invariant", same, "bitwise")
                    else:  # informative: the `triton` mode does not promise it
                        print(f"[info] rms_norm {variant} kernel=triton N={n}: batch-invariant bitwise = {same}")

                guarded(run, "rms_norm", f"{variant} N={n} batch invariance", kernel, torch.bfloat16)


# --------------------------------------------------------------------------- rotary
def rot_ref(q, k, cos, sin):
    r = cos.shape[-1]
    c, s = cos.double().unsqueeze(1), sin.double().unsqueeze(1)
    out = []
    for x in (q, k):
        x = x.double()
        rot, rest = x[..., :r], x[..., r:]
        h = r // 2
        rh = torch.cat((-rot[..., h:], rot[..., :h]), dim=-1)
        out.append(torch.cat((rot * c + rh * s, rest), dim=-1))
    return out


def check_rotary(dev):
    from veomni_triton.kernels.rotary import apply_rotary

    c = core("rotary")
    cases = pick(
        [
            # (label, B, S, Hq, Hk, D, R, layout, cos batch)
            ("seed full", 4, 2048, 32, 8, 128, 128, "bhsd", 1),
            ("seed full, q/k transposed from [B,S,H,D]", 4, 2048, 32, 8, 128, 128, "bshd", 4),
            ("qwen3.5 partial R=D/4", 2, 2048, 16, 2, 256, 64, "bshd", 1),
            ("partial R=D/2", 2, 1024, 16, 4, 128, 64, "bhsd", 2),
            ("odd heads 40/5, D=96", 1, 777, 40, 5, 96, 96, "bshd", 1),
        ],
        [("seed full, q/k transposed from [B,S,H,D]", 2, 3, 4, 2, 16, 16, "bshd", 2),
         ("partial (smoke)", 1, 2, 3, 1, 16, 4, "bhsd", 1)],
    )
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for label, b, s, hq, hk, d, r, layout, cb in cases:
            if dtype != torch.bfloat16 and not label.startswith("seed full,"):
                continue
            variant = "full" if r == d else "partial"

            def run(b=b, s=s, hq=hq, hk=hk, d=d, r=r, layout=layout, cb=cb, label=label, dtype=dtype, variant=variant):
                if layout == "bhsd":
                    q = torch.randn(b, hq, s, d, device=dev, dtype=dtype)
                    k = torch.randn(b, hk, s, d, device=dev, dtype=dtype)
                else:
                    q = torch.randn(b, s, hq, d, device=dev, dtype=dtype).transpose(1, 2)
                    k = torch.randn(b, s, hk, d, device=dev, dtype=dtype).transpose(1, 2)
                q.requires_grad_()
                k.requires_grad_()
                inv = 1.0 / (10000 ** (torch.arange(0, r, 2, device=dev, dtype=torch.float32) / r))
                pos = torch.arange(s, device=dev, dtype=torch.float32).expand(cb, s) + torch.arange(cb, device=dev)[:, None]
                emb = torch.cat((pos[..., None] * inv, pos[..., None] * inv), dim=-1)
                cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
                qo, ko = apply_rotary(q, k, cos, sin)
                gq, gk = torch.randn_like(qo), torch.randn_like(ko)
                torch.autograd.backward((qo, ko), (gq, gk))
                q64 = q.detach().double().requires_grad_()
                k64 = k.detach().double().requires_grad_()
                qr, kr = rot_ref(q64, k64, cos, sin)
                torch.autograd.backward((qr, kr), (gq.double(), gk.double()))
                case = f"{variant} {label}"
                for name, a, e in (("q", qo, qr), ("k", ko, kr), ("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad)):
                    compare("rotary", case, "triton", dtype, name, a, e)
                record("rotary", case, "triton", dtype, "output keeps input layout",
                       qo.stride() == q.stride() and ko.stride() == k.stride(), "strides")
                if c is not None:
                    qi = q.detach().clone().requires_grad_()
                    ki = k.detach().clone().requires_grad_()
                    qc, kc = c.apply_rotary(qi, ki, cos, sin)
                    torch.autograd.backward((qc, kc), (gq, gk))
                    for name, a, e in (("q", qo, qc), ("k", ko, kc), ("dq", q.grad, qi.grad), ("dk", k.grad, ki.grad)):
                        compare("rotary", case, "triton", dtype, name, a, e, against="core eager")

            guarded(run, "rotary", f"{variant} {label}", "triton", dtype)


# --------------------------------------------------------------------------- swiglu
def check_swiglu(dev):
    import torch.nn.functional as F
    from veomni_triton.kernels.swiglu import silu_mul

    c = core("swiglu")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for label in ("seed [8192,6912]", "chunked gate_up [4,2048,2*6912]", "[3,1000,11008]"):
            if dtype != torch.bfloat16 and not label.startswith("seed"):
                continue

            def run(label=label, dtype=dtype):
                if label.startswith("chunked"):
                    leaf = torch.randn(pick((4, 2048, 2 * 6912), (2, 3, 2 * 20)), device=dev, dtype=dtype,
                                       requires_grad=True)
                    g, u = leaf.chunk(2, dim=-1)
                    leaves = (leaf,)
                else:
                    shape = (8192, 6912) if label.startswith("seed") else (3, 1000, 11008)
                    shape = pick(shape, (3, 50))
                    g = (2 * torch.randn(shape, device=dev, dtype=dtype)).requires_grad_()
                    u = torch.randn(shape, device=dev, dtype=dtype, requires_grad=True)
                    leaves = (g, u)
                y = silu_mul(g, u)
                dy = torch.randn_like(y)
                y.backward(dy)
                l64 = [t.detach().double().requires_grad_() for t in leaves]
                g64, u64 = l64[0].chunk(2, dim=-1) if len(l64) == 1 else l64
                y64 = F.silu(g64) * u64
                y64.backward(dy.double())
                compare("swiglu", label, "triton", dtype, "y", y, y64)
                for i, (t, t64) in enumerate(zip(leaves, l64)):
                    compare("swiglu", label, "triton", dtype, f"grad leaf {i}", t.grad, t64.grad)
                if c is not None and len(leaves) == 2:
                    gi = g.detach().clone().requires_grad_()
                    ui = u.detach().clone().requires_grad_()
                    yc = c.silu_mul(gi, ui)
                    yc.backward(dy)
                    compare("swiglu", label, "triton", dtype, "y", y, yc, against="core eager")
                    compare("swiglu", label, "triton", dtype, "dgate", g.grad, gi.grad, against="core eager")
                    compare("swiglu", label, "triton", dtype, "dup", u.grad, ui.grad, against="core eager")

            guarded(run, "swiglu", label, "triton", dtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the rows as JSON to this path")
    ap.add_argument("--ops", default="rms_norm,rotary,swiglu")
    args = ap.parse_args()
    picked = device("this script checks the compiled kernels on a GPU")
    if picked is None:
        return 2
    dev, name = picked
    torch.manual_seed(0)
    print(f"device: {name}  torch {torch.__version__}", flush=True)
    for op in args.ops.split(","):
        {"rms_norm": check_rms_norm, "rotary": check_rotary, "swiglu": check_swiglu}[op](dev)
    fmt = "{:<9} {:<24} {:<52} {:<9} {:<26} {:<11} {:>11} {:>9}  {}"
    print(fmt.format("op", "kernel", "case", "dtype", "tensor", "against", "max_err", "err/tol", "result"))
    for r in ROWS:
        me = "" if r["max_abs_err"] is None else f"{r['max_abs_err']:.3g}"
        wr = "" if r["worst_err_over_tol"] is None else f"{r['worst_err_over_tol']:.3f}"
        print(fmt.format(r["op"], r["kernel"], r["case"][:52], r["dtype"], r["tensor"][:26], (r["against"] or "")[:11],
                         me, wr, "ok" if r["pass"] else "FAIL"))
    bad = [r for r in ROWS if not r["pass"]]
    print(f"\n{len(ROWS) - len(bad)} passed, {len(bad)} failed")
    for r in bad:
        print("FAILED:", r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": ROWS}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
