"""Numerics of veomni-triton's moe_experts and load_balancing_loss at real shapes, on a CUDA GPU.

Every case runs forward and backward of our kernel and of a float64 reference on the same
inputs and checks ``|ours - ref| <= atol*scale + rtol*|ref|`` with the tolerances our
KernelSpec declares (printed per case, never changed here). ``scale`` (printed per row) puts
atol in the units of the reference tensor, as the core's conformance kit does
(``veomni_ops.testing.runner.unit_scale``: the reference's RMS rounded to a power of two),
but never below 1 (the spec's atol is the floor). For the expert weight gradients it is at
least sqrt(tokens of the busiest expert) (their absolute error grows like the square root of
the number of summed tokens). For the MoE cases the same check is run on the core's bf16/fp32
kernel (eager loop or grouped_mm, when importable) and its worst error/tolerance ratio is
printed beside ours, for context.

Also checked: expert without tokens, all tokens to one expert (duplicate routes), the
expert-parallel sentinel index, odd sizes (H, I multiples of no tile), a strided input,
decode-sized batches, fp32/fp16, bitwise determinism (two runs), and torch.compile
(fullgraph, inductor) giving the same bits.

    python plugins/veomni-triton/gpu/check_moe_lbl.py [--json out.json] [--ops moe,lbl]

Needs: a CUDA GPU (sm80+), torch, triton; transformers for the load-balancing reference
(else the core's reference). ~10 GB of GPU memory (float64 references). Prints a table;
exits 1 if any case fails or errors. ``TRITON_INTERPRET=1 VEOMNI_GPU_SMOKE=1`` runs the
plumbing on the CPU at tiny shapes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import traceback

import torch
import torch.nn.functional as F
from _setup import SMOKE, device, pick

ROWS: list[dict] = []


def tol_for(op: str, dtype: torch.dtype):
    import veomni_triton.specs as specs

    spec = next(s for s in getattr(specs, op)() if s.name == "triton")
    return spec.tolerance(str(dtype).removeprefix("torch."))


def _local_unit_scale(ref: torch.Tensor) -> float:
    """Same rule as ``veomni_ops.testing.runner.unit_scale`` (used when the core is not importable)."""
    if ref.numel() <= 1:
        return 1.0
    finite = ref[torch.isfinite(ref)]
    if finite.numel() == 0:
        return 1.0
    rms = float(finite.double().pow(2).mean().sqrt())
    if rms < 2.0**-40 or not math.isfinite(rms):
        return 1.0
    return 2.0 ** round(math.log2(rms))


def unit_scale(ref: torch.Tensor) -> float:
    try:
        from veomni_ops.testing.runner import unit_scale as core_unit_scale
    except Exception:
        return _local_unit_scale(ref)
    return core_unit_scale(ref)


def atol_scale(expected: torch.Tensor, floor: float = 1.0) -> float:
    """atol's unit for this reference: its RMS as a power of two (the core's rule), at least ``floor`` (>= 1)."""
    return max(1.0, floor, unit_scale(expected.detach().double()))


def err_ratio(op, dtype, actual, expected, scale=1.0) -> tuple[float, float]:
    tol = tol_for(op, dtype)
    a = actual.detach().double()
    e = expected.detach().double()
    if a.shape != e.shape:
        return float("inf"), float("inf")
    if not a.numel():
        return 0.0, 0.0
    err = (a - e).abs()
    if not torch.isfinite(a).all():
        return float("inf"), float("inf")
    return err.max().item(), (err / (tol.atol * scale + tol.rtol * e.abs())).max().item()


def record(op, case, dtype, tensor, max_err=None, ratio=None, ok=True, note="", context=None, scale=None):
    tol = None
    if ratio is not None:
        t = tol_for(op, dtype)
        tol = [t.atol, t.rtol]
    ROWS.append({
        "op": op, "case": case, "dtype": str(dtype).removeprefix("torch."), "tensor": tensor,
        "max_abs_err": max_err, "worst_err_over_tol": ratio, "core_err_over_tol": context,
        "atol_scale": scale, "spec_tolerance_atol_rtol": tol, "pass": bool(ok), "note": note,
    })


def guarded(fn, args, op, case, dtype):
    try:
        fn(*args)
    except Exception as e:  # one broken case must not hide the others
        traceback.print_exc()
        record(op, case, dtype, "ERROR", ok=False, note=f"{type(e).__name__}: {e}"[:300])
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def core(module):
    try:
        return importlib.import_module(f"veomni_ops.kernels.{module}")
    except Exception:
        return None


# --------------------------------------------------------------------------- MoE
def moe_reference(x, idx, w, gate_up, down):
    """The contract, route by route grouped per expert (host-synchronising: a reference only).

    Routes whose expert is outside [0, E) are skipped. Runs in the dtype it is given.
    """
    t, k = idx.shape
    num_experts = gate_up.shape[0]
    flat = idx.reshape(-1)
    valid = (flat >= 0) & (flat < num_experts)
    routes = torch.nonzero(valid).squeeze(1)
    order = routes[torch.argsort(flat[routes], stable=True)]
    counts = torch.bincount(flat[order], minlength=num_experts).tolist()
    out = torch.zeros_like(x)
    start = 0
    wf = w.reshape(-1)
    for e, c in enumerate(counts):
        if c == 0:
            continue
        r = order[start:start + c]
        start += c
        tok = r // k
        g, u = F.linear(x[tok], gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(g) * u, down[e]) * wf[r, None]
        out = out.index_add(0, tok, y)
    return out


def moe_inputs(t, h, inter, e, k, dtype, dev, routing):
    x = torch.randn(t, h, device=dev, dtype=torch.float32)
    if routing in ("router", "sentinel"):
        logits = torch.randn(t, e, device=dev)
        w, idx = torch.softmax(logits, -1).topk(k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        if routing == "sentinel":
            idx[torch.rand(t, k, device=dev) < 0.1] = e
    elif routing == "skewed":  # one hot expert takes ~half the routes, a quarter of the experts get none
        idx = torch.randint(e // 4, e, (t, k), device=dev)
        idx[torch.rand(t, k, device=dev) < 0.5] = 0
        w = torch.rand(t, k, device=dev)
    elif routing == "one_expert":  # every token sends all K routes to expert 1 (duplicates)
        idx = torch.ones(t, k, dtype=torch.long, device=dev)
        w = torch.rand(t, k, device=dev)
    else:
        raise ValueError(routing)
    gate_up = torch.randn(e, 2 * inter, h, device=dev) * h**-0.5
    down = torch.randn(e, h, inter, device=dev) * inter**-0.5
    return [x.to(dtype), idx, w.to(dtype), gate_up.to(dtype), down.to(dtype)]


def moe_run(fn, x, idx, w, gate_up, down, grad, cast=None):
    leaves = [a.detach().to(cast or a.dtype).requires_grad_() for a in (x, w, gate_up, down)]
    out = fn(leaves[0], idx, leaves[1], leaves[2], leaves[3])
    out.backward(grad.to(out.dtype))
    res = [out.detach()] + [a.grad for a in leaves]
    return res


MOE_NAMES = ("out", "d_hidden", "d_top_k_weights", "d_gate_up_proj", "d_down_proj")


def moe_case(dev, case, t, h, inter, e, k, dtype, routing, strided=False, repeat=False, compile_check=False):
    from veomni_triton.kernels.moe import moe_experts

    args = moe_inputs(t, h, inter, e, k, dtype, dev, routing)
    grad = torch.randn(t, h, device=dev, dtype=dtype)
    if strided:  # hidden_states as a column slice of a wider buffer
        wide = torch.zeros(t, h + 24, device=dev, dtype=dtype)
        wide[:, 8:8 + h] = args[0]
        args_ours = [wide[:, 8:8 + h]] + args[1:]
    else:
        args_ours = args
    ours = moe_run(moe_experts, *args_ours, grad)
    ref = moe_run(moe_reference, *args, grad, cast=torch.float64)
    idx = args[1]
    hits = torch.bincount(idx[(idx >= 0) & (idx < e)].reshape(-1), minlength=e)
    busiest = max(1, int(hits.max()))
    floors = {"d_gate_up_proj": busiest**0.5, "d_down_proj": busiest**0.5}
    scales = {n: atol_scale(r, floors.get(n, 1.0)) for n, r in zip(MOE_NAMES, ref)}
    context = [None] * 5
    c = core("moe")
    if c is not None:
        try:
            ok_grouped = dtype == torch.bfloat16 and c.grouped_mm_available(dev) and h % 8 == 0 and inter % 8 == 0
            fn = c.moe_experts_grouped_mm if ok_grouped else c.moe_experts_eager
            if routing == "sentinel" and not ok_grouped:
                fn = None  # the eager loop (like transformers') cannot take the sentinel index
            if fn is not None:
                base = moe_run(fn, *args, grad)
                context = [err_ratio("moe_experts", dtype, b, r, scales[n])[1] for n, b, r in zip(MOE_NAMES, base, ref)]
                del base
        except Exception as ex:  # context only
            print(f"core comparison failed for {case}: {ex}", file=sys.stderr)
    for i, (name, a, r) in enumerate(zip(MOE_NAMES, ours, ref)):
        me, ratio = err_ratio("moe_experts", dtype, a, r, scales[name])
        record("moe_experts", case, dtype, name, me, ratio, ratio <= 1.0, "vs float64", context[i], scales[name])
    if routing in ("one_expert", "skewed"):
        empty = hits == 0
        ok = bool((ours[3][empty] == 0).all() and (ours[4][empty] == 0).all())
        record("moe_experts", case, dtype, "empty experts: zero weight grad", ok=ok, note=f"{int(empty.sum())} empty")
    if routing == "sentinel":
        skipped = (idx < 0) | (idx >= e)
        record("moe_experts", case, dtype, "sentinel routes: zero d_weights", ok=bool((ours[2][skipped] == 0).all()))
    del ref
    if repeat:
        again = moe_run(moe_experts, *args_ours, grad)
        same = all(torch.equal(a, b) for a, b in zip(ours, again))
        record("moe_experts", case, dtype, "bitwise determinism (2 runs)", ok=same)
    if compile_check and not SMOKE:
        compiled = torch.compile(moe_experts, fullgraph=True)
        got = moe_run(compiled, *args_ours, grad)
        same = all(torch.equal(a, b) for a, b in zip(ours, got))
        record("moe_experts", case, dtype, "torch.compile fullgraph == eager (bits)", ok=same)


def check_moe(dev):
    bf16, f32, f16 = torch.bfloat16, torch.float32, torch.float16
    real = pick((8192, 2048, 768, 128, 8), (40, 64, 48, 8, 4))
    cases = [
        ("qwen3-30b-a3b shape, router top-8", *real, bf16, "router", False, True, True),
        ("real shape, skewed (hot expert, empty experts)", *real, bf16, "skewed", False, False, False),
        ("all tokens to expert 1, K=2 (duplicates)", pick(4096, 20), real[1], real[2], real[3], 2, bf16,
         "one_expert", False, False, False),
        ("sentinel index E on 10% of routes", pick(2048, 24), real[1], real[2], real[3], real[4], bf16,
         "sentinel", False, False, False),
        ("odd sizes T=999 H=1000 I=200 E=7 K=3", pick(999, 23), pick(1000, 40), pick(200, 24), 7, 3, bf16,
         "router", True, False, False),
        ("odd sizes, fp32", pick(999, 23), pick(1000, 40), pick(200, 24), 7, 3, f32, "router", True, False, False),
        ("fp16 T=1024 H=1024 I=512 E=16 K=4", pick(1024, 16), pick(1024, 32), pick(512, 32), 16, 4, f16,
         "router", False, False, False),
        ("decode-sized T=3, E=128, K=8", 3, pick(2048, 64), pick(768, 48), pick(128, 16), 8, bf16, "router",
         False, False, False),
    ]
    for case, t, h, inter, e, k, dtype, routing, strided, repeat, comp in cases:
        guarded(moe_case, (dev, case, t, h, inter, e, k, dtype, routing, strided, repeat, comp),
                "moe_experts", case, dtype)


# --------------------------------------------------------------------------- load balancing
def lbl_reference():
    try:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

        return (lambda logits, e, k, m: load_balancing_loss_func(tuple(logits), e, k, m)), "transformers"
    except Exception:
        c = core("load_balancing")
        if c is None:
            raise RuntimeError("neither transformers nor veomni_ops.kernels.load_balancing is importable") from None
        return c.load_balancing_loss, "core reference"


def lbl_run(fn, logits, e, k, mask, cast=None):
    leaves = [x.detach().to(cast or x.dtype).requires_grad_() for x in logits]
    loss = fn(leaves, e, k, mask)
    (loss * 7.0).backward()
    return [loss.detach()] + [x.grad for x in leaves]


def lbl_case(dev, case, layers, b, s, e, k, dtype, masked, repeat=False, compile_check=False):
    from veomni_triton.kernels.load_balancing import load_balancing_loss

    ref_fn, ref_name = lbl_reference()
    if dtype == torch.float32:
        logits = [torch.randn(b * s, e, device=dev) for _ in range(layers)]
    else:
        # 16-bit random logits tie often (bf16 has 8 significant bits), and among tied experts
        # the top-k choice is implementation-defined (ours: lowest index; torch.topk: unspecified).
        # Distinct values per row, exact in bf16/fp16 for E <= 256: a random permutation of (j - E/2) / 16.
        logits = [((torch.rand(b * s, e, device=dev).argsort(dim=-1) - e // 2) / 16.0).to(dtype)
                  for _ in range(layers)]
    mask = None
    if masked:
        mask = torch.ones(b, s, dtype=torch.long, device=dev)
        for i in range(b):
            mask[i, s - (i * s) // (2 * b):] = 0  # right padding of growing length
    ours = lbl_run(load_balancing_loss, logits, e, k, mask)
    ref = lbl_run(ref_fn, logits, e, k, mask, cast=torch.float64)
    me, ratio = err_ratio("load_balancing_loss", dtype, ours[0], ref[0], atol_scale(ref[0]))
    record("load_balancing_loss", case, dtype, "loss", me, ratio, ratio <= 1.0 and ours[0].dtype == torch.float32,
           f"vs {ref_name} float64", scale=atol_scale(ref[0]))
    worst = (0.0, 0.0, 1.0)
    for g, r in zip(ours[1:], ref[1:]):
        sc = atol_scale(r)
        m2, r2 = err_ratio("load_balancing_loss", dtype, g, r, sc)
        worst = max(worst, (r2, m2, sc))
    record("load_balancing_loss", case, dtype, f"d_logits (worst of {layers})", worst[1], worst[0], worst[0] <= 1.0,
           f"vs {ref_name} float64", scale=worst[2])
    del ref
    if repeat:
        again = lbl_run(load_balancing_loss, logits, e, k, mask)
        record("load_balancing_loss", case, dtype, "bitwise determinism (2 runs)",
               ok=all(torch.equal(a, b) for a, b in zip(ours, again)))
    if compile_check and not SMOKE:
        compiled = torch.compile(load_balancing_loss, fullgraph=True)
        got = lbl_run(compiled, logits, e, k, mask)
        record("load_balancing_loss", case, dtype, "torch.compile fullgraph == eager (bits)",
               ok=all(torch.equal(a, b) for a, b in zip(ours, got)))


def check_lbl(dev):
    layers, b, s = pick((48, 4, 2048), (3, 2, 19))
    cases = [
        ("48 layers x 8192 tokens, E=128, top-8", layers, b, s, pick(128, 16), 8, torch.float32, False, True, True),
        ("same, attention mask (right padding)", layers, b, s, pick(128, 16), 8, torch.float32, True, True, False),
        ("bf16 logits, mask", layers, b, s, pick(128, 16), 8, torch.bfloat16, True, False, False),
        ("E=60 top-4, 5 layers x 999 tokens", 5, 1, pick(999, 37), 60, 4, torch.float32, True, False, False),
        ("E=256 top-8, fp16", 4, 2, pick(1024, 16), 256, 8, torch.float16, False, False, False),
    ]
    for case, nl, bb, ss, e, k, dtype, masked, repeat, comp in cases:
        guarded(lbl_case, (dev, case, nl, bb, ss, e, k, dtype, masked, repeat, comp),
                "load_balancing_loss", case, dtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the rows as JSON to this path")
    ap.add_argument("--ops", default="moe,lbl")
    args = ap.parse_args()
    picked = device("this script checks the compiled kernels on a GPU")
    if picked is None:
        return 2
    dev, name = picked
    torch.manual_seed(0)
    import triton

    print(f"device: {name}  torch {torch.__version__}  triton {triton.__version__}", flush=True)
    print("tolerance: |ours - ref| <= atol*scale + rtol*|ref| with the KernelSpec's (atol, rtol) per dtype (column "
          "'tol', unchanged); scale = max(1, RMS of the float64 reference rounded to a power of two) as in the core's "
          "conformance kit (unit_scale), and >= sqrt(tokens of the busiest expert) for the expert weight gradients "
          "(column 'scale')", flush=True)
    for op in args.ops.split(","):
        {"moe": check_moe, "lbl": check_lbl}[op](dev)
    fmt = "{:<20} {:<48} {:<9} {:<40} {:>10} {:>13} {:>7} {:>8} {:>8}  {}"
    print(fmt.format("op", "case", "dtype", "tensor", "max_err", "tol", "scale", "err/tol", "core", "result"))
    for r in ROWS:
        me = "" if r["max_abs_err"] is None else f"{r['max_abs_err']:.3g}"
        wr = "" if r["worst_err_over_tol"] is None else f"{r['worst_err_over_tol']:.3f}"
        cr = "" if r["core_err_over_tol"] is None else f"{r['core_err_over_tol']:.3f}"
        tl_ = "" if r["spec_tolerance_atol_rtol"] is None else "{:g},{:g}".format(*r["spec_tolerance_atol_rtol"])
        sc = "" if r["atol_scale"] is None else f"{r['atol_scale']:.4g}"
        print(fmt.format(r["op"], r["case"][:48], r["dtype"], r["tensor"][:40], me, tl_, sc, wr, cr,
                         ("ok" if r["pass"] else "FAIL") + (f"  {r['note']}" if r["note"] else "")))
    bad = [r for r in ROWS if not r["pass"]]
    print(f"\n{len(ROWS) - len(bad)} passed, {len(bad)} failed")
    for r in bad:
        print("FAILED:", r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "triton": triton.__version__, "rows": ROWS}, f,
                      indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
