"""FlashAttention 2, 3 and 4 through veomni-flash's adapter on the real libraries: numerics, and a benchmark.

Run on a CUDA machine (Hopper) where the flash packages import (flash-attn for FA2, flash-attn-3's
``flash_attn_interface`` for FA3, flash-attn-4 + nvidia-cutlass-dsl for FA4; ``--path DIR`` adds a
``pip install --target DIR`` folder)::

    python plugins/veomni-flash/gpu/check_flash.py --json flash.json                       # every kernel that imports
    python plugins/veomni-flash/gpu/check_flash.py --kernel flash_attention_2 --json fa2.json

A kernel whose package does not import is listed under ``skipped`` with the import error.

Numerics (32 query / 8 key-value heads, head dim 128, bf16 unless the case says otherwise): every case
runs forward and backward through ``veomni_flash.kernels.fa{2,3,4}.flash_attention_{2,3,4}`` (the
transformers attention signature: [B, H, S, D] in, [B, S, H, D] out), through
``F.scaled_dot_product_attention`` and through the core's eager attention, all in the case's dtype,
and compares each with one float32 reference (TF32 off, one batch row at a time). A kernel passes a
case when its error is at most twice sdpa's error in the same dtype plus 1e-3 of the reference's
magnitude (the criterion of the flash-attention test suite; eager is the baseline where sdpa has no
such form, softcap); whether it is inside the KernelSpec tolerance is reported too. Padded query rows
are excluded (flash returns zeros there, sdpa garbage). The forms: dense causal and bidirectional,
GQA 8:1 (Qwen3-30B-A3B's heads), float16, padding (2-D mask, left and right), packed documents by
restarting ``position_ids`` and by ``cu_seq_lens_q/k``, sliding window, softcap, and Ulysses sequence
parallelism on one process (``veomni_ops.parallel.ulysses.ulysses_attention`` over a one-rank NCCL
group: the all-to-alls, the global position ids, packing and the window through the wrapper).

Dropout: FA2 trains with ``dropout=0.1`` (output and gradients finite, the output differs from the
dropout-free one, the mean attention output stays within 5% of it); FA3/FA4 must refuse it
(``ValueError``) while training.

Model: a tiny Qwen3 (2 layers, 8 q / 2 kv heads of 128, bf16) built with
``attn_implementation="veomni_flash_attention_{v}_with_sp"`` after
``veomni_flash.transformers_adapter.register_flash_attention(v)``, against the same weights under sdpa
in bf16 and in float32: logits and the gradient of layer 0's q_proj, on a padded batch (left and
right padding) and on a packed row (restarting position ids).

Benchmark (batch 4, sequence 4096, 32/8 heads, d 128, causal, bf16): each kernel through the
adapter and called directly, and sdpa; forward and forward+backward. Median wall time of
``triton.testing.do_bench`` (50 ms warm-up, 300 ms of repeats), kernel time = sum of the GPU kernels
of one call from ``torch.profiler`` (mean of 20 calls), TFLOP/s from wall time with causal forward
FLOPs = 4*B*Hq*S*S*D/2 and forward+backward = 3.5x that, peak memory.

``--smoke`` runs the whole script on the CPU at tiny shapes with the float64 stand-ins of the three
packages from the tests (plumbing check only, no measurement).

Every case catches its own exception; the JSON is written after every case.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback
import zlib
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN_SRC = os.path.normpath(os.path.join(HERE, "..", "src"))
CORE_SRC = os.path.normpath(os.path.join(HERE, "..", "..", "..", "core", "src"))
STANDINS = os.path.normpath(os.path.join(HERE, "..", "tests", "standins"))
ALL_KERNELS = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
DISTRIBUTIONS = {"flash_attention_2": "flash-attn", "flash_attention_3": "flash-attn-3",
                 "flash_attention_4": "flash-attn-4"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--kernel", action="append", default=[], choices=ALL_KERNELS,
                   help="kernel to check (repeatable; default: all three, each where its package imports)")
    p.add_argument("--path", action="append", default=[], help="extra sys.path entry (e.g. a pip --target dir)")
    p.add_argument("--smoke", action="store_true", help="CPU plumbing check with the float64 stand-ins")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--skip-model", action="store_true", help="no tiny-Qwen3 check through transformers")
    p.add_argument("--cases", default="", help="comma-separated subset of numerics cases")
    return p.parse_args()


ARGS = parse_args()
for extra in reversed(ARGS.path):
    sys.path.insert(0, extra)
if ARGS.smoke:
    sys.path[:0] = [os.path.join(STANDINS, "full"), STANDINS]
for mod, path in (("veomni_ops", CORE_SRC), ("veomni_flash", PLUGIN_SRC)):
    if importlib.util.find_spec(mod) is None and os.path.isdir(path):
        sys.path.insert(0, path)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEVICE = "cpu" if ARGS.smoke else "cuda"
HQ, HK, D = (8, 2, 16) if ARGS.smoke else (32, 8, 128)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}

RESULTS: dict[str, Any] = {"meta": {}, "kernels": {}, "skipped": {}, "checks": [], "model": [], "bench": [],
                           "bench_details": [], "errors": [], "notes": []}


def write_json() -> None:
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)


def dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def meta() -> None:
    m = RESULTS["meta"]
    m.update(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        **{d.replace("-", "_"): dist_version(d) for d in ("flash-attn", "flash-attn-3", "flash-attn-4",
                                                         "nvidia-cutlass-dsl", "triton", "transformers",
                                                         "veomni-ops", "veomni-flash")},
        smoke=ARGS.smoke,
        heads=f"{HQ}/{HK}",
        head_dim=D,
    )
    if DEVICE == "cuda":
        m.update(device=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()))
    else:
        m.update(device="cpu (smoke: float64 stand-ins for the flash packages)")


# ---- the implementations ---------------------------------------------------------------------


class Attn(torch.nn.Module):
    def __init__(self, is_causal: bool):
        super().__init__()
        self.is_causal = is_causal
        self.eval()  # no dropout unless a case trains


def load_kernels() -> dict[str, Any]:
    """kernel name -> its veomni_flash.kernels module; the others go to RESULTS["skipped"]."""
    got = {}
    for name in ARGS.kernel or ALL_KERNELS:
        v = name[-1]
        try:
            mod = importlib.import_module(f"veomni_flash.kernels.fa{v}")
        except Exception as e:
            RESULTS["skipped"][name] = f"{type(e).__name__}: {e}"
            log(f"{name}: skipped ({type(e).__name__}: {str(e)[:300]})")
            continue
        got[name] = mod
        be = mod.BACKEND
        RESULTS["kernels"][name] = {"module": getattr(be.module, "__file__", None) or str(getattr(be.module, "__path__", "")),
                                    "distribution": DISTRIBUTIONS[name],
                                    "version": dist_version(DISTRIBUTIONS[name])}
        log(f"{name}: {RESULTS['kernels'][name]}")
    return got


def call_kernel(mods: dict[str, Any], name: str):
    return getattr(mods[name], name)


def core_eager():
    from veomni_ops.kernels.attention import eager_attention

    return eager_attention


def build_mask(b, s, *, causal, window=None, valid=None, segments=None, device):
    """Boolean [B|1, 1, S, S]; padded query rows see themselves only, so every row is finite."""
    i = torch.arange(s, device=device)[:, None]
    j = torch.arange(s, device=device)[None, :]
    m = torch.ones(1, 1, s, s, dtype=torch.bool, device=device)
    if causal:
        m = m & (j <= i)
    if window is not None:
        m = m & (j > i - window) & (True if causal else (j < i + window))
    if valid is not None:
        m = m & valid[:, None, None, :]
        m = m | (~valid[:, None, :, None] & (i == j))
    if segments is not None:
        m = m & (segments[:, None, :, None] == segments[:, None, None, :])
    return m


def reference_fp32(q, k, v, dout, mask, causal, scale, softcap):
    """float32 attention (TF32 off) and its gradients, one batch row at a time (memory)."""
    outs, dqs, dks, dvs = [], [], [], []
    rep = q.shape[1] // k.shape[1]
    s_len = q.shape[2]
    for b in range(q.shape[0]):
        qb, kb, vb = (t[b : b + 1].float().detach().requires_grad_(True) for t in (q, k, v))
        kk, vv = kb.repeat_interleave(rep, 1), vb.repeat_interleave(rep, 1)
        s = (qb @ kk.transpose(-1, -2)) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        if mask is not None:
            mb = mask[b : b + 1] if mask.shape[0] > 1 else mask
            s = s.masked_fill(~mb, float("-inf"))
        elif causal:
            s = s.masked_fill(~torch.ones(s_len, s_len, dtype=torch.bool, device=q.device).tril(), float("-inf"))
        p = torch.softmax(s, -1)
        ob = (p @ vv).transpose(1, 2)  # [1, S, H, D]
        ob.backward(dout[b : b + 1].float())
        outs.append(ob.detach())
        dqs.append(qb.grad)
        dks.append(kb.grad)
        dvs.append(vb.grad)
        del s, p, ob
    return torch.cat(outs), (torch.cat(dqs), torch.cat(dks), torch.cat(dvs))


def fwd_bwd(fn, q, k, v, dout):
    q_, k_, v_ = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = fn(q_, k_, v_)
    out.backward(dout)
    return out.detach(), (q_.grad, k_.grad, v_.grad)


_GROUP_READY = False


def one_rank_group() -> None:
    """A process group of one rank (NCCL on the GPU, gloo on the CPU) for the Ulysses wrapper."""
    global _GROUP_READY
    import torch.distributed as dist

    if not _GROUP_READY and not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", rank=0, world_size=1,
                                **({"device_id": torch.device("cuda", 0)} if DEVICE == "cuda" else {}))
    _GROUP_READY = True


# ---- numerics ---------------------------------------------------------------------------------


def cases() -> list[dict[str, Any]]:
    if ARGS.smoke:
        return [
            dict(name="dense_causal", b=2, s=64, causal=True),
            dict(name="dense_bidirectional", b=2, s=48, causal=False),
            dict(name="gqa_causal", b=1, s=40, causal=True, hk=1),
            dict(name="fp16_causal", b=2, s=32, causal=True, dtype="float16"),
            dict(name="padded_causal", b=3, s=64, causal=True, padded=True),
            dict(name="packed_position_ids", b=1, s=96, causal=True, packed=[40, 7, 30, 19]),
            dict(name="packed_cu_seq_lens", b=1, s=96, causal=True, packed=[40, 7, 30, 19], use_cu=True),
            dict(name="sliding_window", b=2, s=64, causal=True, window=16),
            dict(name="softcap", b=2, s=32, causal=True, softcap=5.0),
            dict(name="sp_ulysses_packed_window", b=1, s=96, causal=True, packed=[40, 7, 30, 19], window=16, sp=True),
        ]
    return [
        dict(name="dense_causal_b2_s1024", b=2, s=1024, causal=True),
        dict(name="dense_causal_b4_s4096", b=4, s=4096, causal=True),
        dict(name="dense_bidirectional_b2_s2048", b=2, s=2048, causal=False),
        dict(name="gqa8_causal_b2_s2048", b=2, s=2048, causal=True, hk=4),
        dict(name="fp16_causal_b2_s1024", b=2, s=1024, causal=True, dtype="float16"),
        dict(name="padded_causal_b3_s2048", b=3, s=2048, causal=True, padded=True),
        dict(name="packed_position_ids_s4096", b=1, s=4096, causal=True, packed=[1000, 37, 2048, 1011]),
        dict(name="packed_cu_seq_lens_s4096", b=1, s=4096, causal=True, packed=[1000, 37, 2048, 1011], use_cu=True),
        dict(name="sliding_window1024_b2_s4096", b=2, s=4096, causal=True, window=1024),
        dict(name="softcap50_b2_s1024", b=2, s=1024, causal=True, softcap=50.0),
        dict(name="sp_ulysses_packed_window1024_s4096", b=1, s=4096, causal=True, packed=[1000, 37, 2048, 1011],
             window=1024, sp=True),
    ]


def metric(a: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor | None) -> tuple[float, float, bool]:
    a, ref = a.float(), ref.float()
    if rows is not None:
        a, ref = a[rows], ref[rows]
    err = (a - ref).abs().max().item()
    scale = ref.abs().max().item()
    return err, scale, bool(torch.isfinite(a).all().item())


def run_case(c: dict[str, Any], mods: dict[str, Any], eager, tols) -> None:
    b, s, causal = c["b"], c["s"], c["causal"]
    hk = c.get("hk", HK)
    dtype_name = c.get("dtype", "bfloat16")
    dtype = DTYPES[dtype_name]
    shape = f"B={b},S={s},Hq={HQ},Hk={hk},D={D},{dtype_name}"
    log(f"case {c['name']} ({shape}, causal={causal})")
    g = torch.Generator(device=DEVICE).manual_seed(zlib.crc32(c["name"].encode()))
    # [B, S, H, D] projections viewed as [B, H, S, D], as in a transformers model.
    q = torch.randn(b, s, HQ, D, device=DEVICE, dtype=dtype, generator=g).transpose(1, 2)
    k = torch.randn(b, s, hk, D, device=DEVICE, dtype=dtype, generator=g).transpose(1, 2)
    v = torch.randn(b, s, hk, D, device=DEVICE, dtype=dtype, generator=g).transpose(1, 2)
    dout = torch.randn(b, s, HQ, D, device=DEVICE, dtype=dtype, generator=g)
    scale = D**-0.5
    module = Attn(causal)
    kw: dict[str, Any] = {}
    attn_mask2d = None
    valid = None
    segments = None
    if c.get("padded"):
        lens = [s, s - s // 3, s // 2][:b]
        valid = torch.zeros(b, s, dtype=torch.bool, device=DEVICE)
        valid[0, :] = True
        valid[1, s - lens[1] :] = True  # left padding
        valid[2, : lens[2]] = True  # right padding
        attn_mask2d = valid.long()
    if c.get("packed"):
        lens = c["packed"]
        assert sum(lens) == s
        pos = torch.cat([torch.arange(n, device=DEVICE) for n in lens])[None]
        segments = torch.cat([torch.full((n,), i, device=DEVICE) for i, n in enumerate(lens)])[None]
        if c.get("use_cu"):
            cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
            kw.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lens), max_length_k=max(lens))
        else:
            kw["position_ids"] = pos
    window, softcap = c.get("window"), c.get("softcap")
    mask = None
    if valid is not None or segments is not None or window is not None:
        mask = build_mask(b, s, causal=causal, window=window, valid=valid, segments=segments, device=DEVICE)
    rows = valid if valid is not None else None
    if rows is not None:
        dout = dout * rows[:, :, None, None].to(dout.dtype)

    impls: dict[str, Any] = {}

    def flash_fn(name):
        fn = call_kernel(mods, name)
        if c.get("sp"):
            from veomni_ops.parallel.ulysses import ulysses_attention

            one_rank_group()
            fn = ulysses_attention(fn, None, 1, name)

        def run(q_, k_, v_):
            return fn(module, q_, k_, v_, attn_mask2d, scaling=scale, sliding_window=window, softcap=softcap, **kw)[0]

        return run

    def sdpa_fn(q_, k_, v_):
        if softcap:
            raise NotImplementedError("sdpa has no softcap")
        if mask is None:
            o = F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal, scale=scale, enable_gqa=True)
        else:
            rep = HQ // hk
            o = F.scaled_dot_product_attention(q_, k_.repeat_interleave(rep, 1), v_.repeat_interleave(rep, 1),
                                               attn_mask=mask, scale=scale)
        return o.transpose(1, 2)

    def eager_fn(q_, k_, v_):
        m = mask
        if m is None and causal:
            m = build_mask(1, s, causal=True, device=DEVICE)
        return eager(module, q_, k_, v_, m, scaling=scale, softcap=softcap)[0]

    runs = [(n, flash_fn(n)) for n in mods] + [("sdpa", sdpa_fn), ("eager", eager_fn)]
    for name, fn in runs:
        try:
            t0 = time.perf_counter()
            impls[name] = fwd_bwd(fn, q, k, v, dout)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            log(f"  {name}: fwd+bwd ok ({time.perf_counter() - t0:.1f} s incl. compile)")
        except NotImplementedError as e:
            log(f"  {name}: n/a ({e})")
        except Exception as e:
            RESULTS["errors"].append({"case": c["name"], "impl": name, "error": repr(e)[:2000],
                                      "traceback": traceback.format_exc()[-4000:]})
            log(f"  {name}: FAILED {repr(e)[:500]}")
        if DEVICE == "cuda":
            torch.cuda.empty_cache()

    try:
        old_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = reference_fp32(q, k, v, dout, mask, causal, scale, softcap)
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    except Exception as e:
        RESULTS["errors"].append({"case": c["name"], "impl": "fp32 reference", "error": repr(e)})
        log(f"  reference FAILED {e!r}")
        return

    def pick(name: str, t_i: int) -> torch.Tensor:
        out, grads = impls[name]
        # Gradients are [B, H, S, D] like the inputs; compare everything as [B, S, H, D].
        return out if t_i == 0 else grads[t_i - 1].transpose(1, 2)

    for kname in mods:
        tol = tols[kname].get(dtype_name)
        for t_i, tname in enumerate(("out", "dq", "dk", "dv")):
            ref_t = ref[0] if t_i == 0 else ref[1][t_i - 1].transpose(1, 2)
            r = rows if tname in ("out", "dq") else None  # padded query rows: flash zeros, sdpa garbage
            base_row = {"kernel": kname, "case": c["name"], "shape": shape, "dtype": dtype_name, "causal": causal,
                        "tensor": tname, "sp": bool(c.get("sp"))}
            if kname not in impls:
                RESULTS["checks"].append({**base_row, "ok": False, "why": f"{kname} failed to run"})
                continue
            errs = {name: metric(pick(name, t_i), ref_t, r) for name in impls}
            fa_err, scale_t, finite = errs[kname]
            base = errs.get("sdpa") or errs.get("eager")  # softcap: sdpa has none, eager is the baseline
            bound = 2 * base[0] + 1e-3 * scale_t if base else None
            a, rr = pick(kname, t_i).float(), ref_t.float()
            if r is not None:
                a, rr = a[r], rr[r]
            # The spec tolerance, with atol scaled to the tensor's magnitude (gradients are not O(1)).
            spec_ok = None if tol is None else bool(
                torch.allclose(a, rr, atol=tol[0] * max(scale_t, 1e-6), rtol=tol[1]))
            ok = finite and bound is not None and fa_err <= bound
            row = {
                **base_row,
                "ref_max_abs": scale_t,
                "max_err": fa_err,
                "sdpa_max_err": errs["sdpa"][0] if "sdpa" in errs else None,
                "eager_max_err": errs["eager"][0] if "eager" in errs else None,
                "bound_2x_baseline": bound,
                "spec_tolerance_ok": spec_ok,
                "finite": finite,
                "ok": ok,
            }
            RESULTS["checks"].append(row)
            log(f"  {kname} {tname}: err {fa_err:.3g} (sdpa {row['sdpa_max_err']}, eager {row['eager_max_err']}, "
                f"|ref| {scale_t:.3g}) -> {'OK' if ok else 'FAIL'}{'' if spec_ok is not False else ' (outside spec tolerance)'}")


def check_dropout(mods: dict[str, Any]) -> None:
    """FA2 trains with dropout; FA3/FA4 refuse it while training (and ignore it in eval)."""
    b, s = (2, 64) if ARGS.smoke else (2, 1024)
    g = torch.Generator(device=DEVICE).manual_seed(7)
    q, k, v = (torch.randn(b, s, h, D, device=DEVICE, dtype=torch.bfloat16, generator=g).transpose(1, 2)
               for h in (HQ, HK, HK))
    module = Attn(True)
    for kname in mods:
        fn = call_kernel(mods, kname)
        row: dict[str, Any] = {"kernel": kname, "case": "dropout0.1_train", "tensor": "dropout",
                               "shape": f"B={b},S={s},Hq={HQ},Hk={HK},D={D},bfloat16"}
        try:
            module.train()
            if kname == "flash_attention_2":
                torch.manual_seed(0)
                q_, k_, v_ = (t.detach().requires_grad_(True) for t in (q, k, v))
                out = fn(module, q_, k_, v_, None, dropout=0.1, scaling=D**-0.5)[0]
                out.float().sum().backward()
                module.eval()
                with torch.no_grad():
                    clean = fn(module, q, k, v, None, dropout=0.1, scaling=D**-0.5)[0]  # eval: no dropout
                finite = bool(torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in (q_, k_, v_)))
                differs = bool((out.float() - clean.float()).abs().max() > 0)
                # dropout rescales by 1/(1-p): the mean output stays, within noise
                mean_rel = abs(out.float().mean().item() - clean.float().mean().item()) / \
                    max(clean.float().abs().mean().item(), 1e-6)
                row.update(finite=finite, differs_from_eval=differs, mean_rel_diff=mean_rel,
                           ok=finite and differs and mean_rel < 0.05)
            else:
                try:
                    fn(module, q, k, v, None, dropout=0.1, scaling=D**-0.5)
                    row.update(ok=False, why="accepted dropout while training")
                except ValueError as e:
                    row.update(ok="no attention dropout" in str(e), refused=str(e)[:300])
        except Exception as e:
            row.update(ok=False, error=repr(e)[:1000])
        finally:
            module.eval()
        RESULTS["checks"].append(row)
        log(f"  {kname} dropout: {'OK' if row['ok'] else 'FAIL'} {dict((k_, v_) for k_, v_ in row.items() if k_ not in ('kernel', 'case', 'tensor', 'shape'))}")


def spec_tolerances(names) -> dict[str, dict[str, tuple[float, float]]]:
    from veomni_flash.specs import attention as attention_specs

    out: dict[str, dict[str, tuple[float, float]]] = {}
    for sp in attention_specs():
        if sp.name in names:
            out[sp.name] = {dt: (sp.tolerance(dt).atol, sp.tolerance(dt).rtol) for dt in sp.dtypes}
    return out


def check_all(mods: dict[str, Any]) -> None:
    eager = core_eager()
    tols = spec_tolerances(mods)
    RESULTS["meta"]["spec_tolerances"] = tols
    wanted = {x for x in ARGS.cases.split(",") if x}
    for c in cases():
        if wanted and c["name"] not in wanted:
            continue
        try:
            run_case(c, mods, eager, tols)
        except Exception as e:
            RESULTS["errors"].append({"case": c["name"], "error": repr(e), "traceback": traceback.format_exc()})
            log(f"case {c['name']} FAILED: {e!r}")
        finally:
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        write_json()
    if not wanted or "dropout" in wanted:
        log("case dropout")
        check_dropout(mods)
        write_json()


# ---- a tiny Qwen3 through transformers ----------------------------------------------------------


def check_model(mods: dict[str, Any]) -> None:
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from veomni_flash import transformers_adapter as ta

    RESULTS["meta"]["transformers"] = transformers.__version__
    d = 16 if ARGS.smoke else 128
    cfg = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=d, max_position_embeddings=4096,
                      attention_dropout=0.0)
    s = 32 if ARGS.smoke else 512

    def build(impl, dtype):
        torch.manual_seed(0)
        return Qwen3ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=dtype).to(DEVICE)

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 512, (3, s), generator=g).to(DEVICE)
    pad = torch.ones(3, s, dtype=torch.long, device=DEVICE)
    pad[1, : s // 4] = 0  # left padding
    pad[2, s - s // 3 :] = 0  # right padding
    lens = [s // 2, 3, s - s // 2 - 3]
    packed_ids = torch.randint(0, 512, (1, sum(lens)), generator=g).to(DEVICE)
    pos = torch.cat([torch.arange(n) for n in lens])[None].to(DEVICE)
    inputs = {
        # use_cache=False: transformers' sdpa/eager mask honours packing only without a cache (training)
        "padded": ({"input_ids": ids, "attention_mask": pad, "use_cache": False}, pad.bool()),
        "packed_position_ids": ({"input_ids": packed_ids, "position_ids": pos, "use_cache": False}, None),
    }
    for kname in mods:
        v = int(kname[-1])
        name = f"veomni_flash_attention_{v}_with_sp"
        try:
            ta.register_flash_attention(v)
            models = {"flash": build(name, torch.bfloat16), "sdpa": build("sdpa", torch.bfloat16),
                      "fp32": build("sdpa", torch.float32)}
            sd = models["flash"].state_dict()
            for m in ("sdpa", "fp32"):
                models[m].load_state_dict(sd)
        except Exception as e:
            RESULTS["model"].append({"kernel": kname, "ok": False, "error": repr(e)[:2000],
                                     "traceback": traceback.format_exc()[-4000:]})
            log(f"  model {kname}: FAILED to build {e!r}")
            continue
        for form, (kw, valid) in inputs.items():
            got = {}
            try:
                for m, model in models.items():
                    model.zero_grad(set_to_none=True)
                    logits = model(**kw).logits
                    w = valid[..., None] if valid is not None else torch.ones_like(logits[..., :1], dtype=torch.bool)
                    loss = (logits.float() * w).square().mean()
                    loss.backward()
                    grad = model.model.layers[0].self_attn.q_proj.weight.grad
                    got[m] = (logits.detach().float(), grad.detach().float())
                row: dict[str, Any] = {"kernel": kname, "attn_implementation": name, "form": form}
                ok = True
                for i, what in enumerate(("logits", "q_proj_grad")):
                    ref = got["fp32"][i]
                    rows = valid if what == "logits" else None  # padded positions' logits do not count

                    def sel(t, rows=rows):
                        return t if rows is None else t[rows]

                    err_f = (sel(got["flash"][i]) - sel(ref)).abs().max().item()
                    err_s = (sel(got["sdpa"][i]) - sel(ref)).abs().max().item()
                    sc = sel(ref).abs().max().item()
                    bound = 2 * err_s + 1e-3 * sc
                    fin = bool(torch.isfinite(got["flash"][i]).all())
                    row[what] = {"flash_err": err_f, "sdpa_bf16_err": err_s, "ref_max_abs": sc, "bound": bound,
                                 "finite": fin, "ok": fin and err_f <= bound}
                    ok = ok and row[what]["ok"]
                row["ok"] = ok
                RESULTS["model"].append(row)
                log(f"  model {kname} {form}: {'OK' if ok else 'FAIL'} logits {row['logits']['flash_err']:.3g} "
                    f"(sdpa {row['logits']['sdpa_bf16_err']:.3g}), q_proj grad {row['q_proj_grad']['flash_err']:.3g} "
                    f"(sdpa {row['q_proj_grad']['sdpa_bf16_err']:.3g})")
            except Exception as e:
                RESULTS["model"].append({"kernel": kname, "form": form, "ok": False, "error": repr(e)[:2000],
                                         "traceback": traceback.format_exc()[-4000:]})
                log(f"  model {kname} {form}: FAILED {e!r}")
        ta.restore()
        del models
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        write_json()


# ---- benchmark ----------------------------------------------------------------------------------


def wall_ms(fn, grad_to_none=None) -> float:
    if DEVICE == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=50, rep=300, grad_to_none=grad_to_none, return_mode="median"))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_ms(fn, iters: int = 20) -> tuple[float | None, list[str]]:
    """Mean GPU time of one call: the sum of the CUDA kernels' durations in the profiler trace."""
    if DEVICE != "cuda":
        return None, []
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total_us = 0.0
    per_name: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            us = e.time_range.elapsed_us()
            total_us += us
            per_name[e.name] = per_name.get(e.name, 0.0) + us
    top = sorted(per_name, key=lambda n: per_name[n], reverse=True)[:4]
    return total_us / iters / 1e3, [f"{n[:90]} ({per_name[n] / iters / 1e3:.3f} ms)" for n in top]


def peak_gib(fn) -> float | None:
    if DEVICE != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def bench(mods: dict[str, Any]) -> None:
    b, s = (1, 64) if ARGS.smoke else (4, 4096)
    dtype = torch.bfloat16
    preset = "smoke" if ARGS.smoke else "anchors_b4_s4096"
    shape = f"B={b},S={s},Hq={HQ},Hk={HK},D={D},causal"
    fwd_flops = 4 * b * HQ * s * s * D / 2
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q4 = torch.randn(b, s, HQ, D, device=DEVICE, dtype=dtype, generator=g)
    k4 = torch.randn(b, s, HK, D, device=DEVICE, dtype=dtype, generator=g)
    v4 = torch.randn(b, s, HK, D, device=DEVICE, dtype=dtype, generator=g)
    dout = torch.randn(b, s, HQ, D, device=DEVICE, dtype=dtype, generator=g)
    # Model layout: [B, H, S, D] views of [B, S, H, D] projections.
    qh, kh, vh = (t.transpose(1, 2).detach().requires_grad_(True) for t in (q4, k4, v4))
    q4r, k4r, v4r = (t.detach().requires_grad_(True) for t in (q4, k4, v4))
    module = Attn(True)

    def run_sdpa():
        return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=D**-0.5, enable_gqa=True).transpose(1, 2)

    kernels = []
    for kname in mods:
        fn = call_kernel(mods, kname)
        raw = mods[kname].BACKEND.flash_attn_func

        def run_adapter(fn=fn):
            return fn(module, qh, kh, vh, None, scaling=D**-0.5)[0]

        def run_raw(raw=raw):
            out = raw(q4r, k4r, v4r, softmax_scale=D**-0.5, causal=True)
            return out[0] if isinstance(out, tuple) else out

        kernels += [(kname, run_adapter, [qh, kh, vh]),
                    (f"{mods[kname].BACKEND.module.__name__}.flash_attn_func (direct)", run_raw, [q4r, k4r, v4r])]
    kernels.append(("sdpa", run_sdpa, [qh, kh, vh]))
    for name, fn, leaves in kernels:
        for pass_name in ("fwd", "fwd+bwd"):
            log(f"bench {name} {pass_name}")
            try:
                if pass_name == "fwd":

                    def call(fn=fn):
                        with torch.no_grad():
                            return fn()
                else:

                    def call(fn=fn, leaves=leaves):
                        for t in leaves:
                            t.grad = None
                        fn().backward(dout)

                call()  # compile / warm up
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                w = wall_ms(call, grad_to_none=leaves if pass_name != "fwd" else None)
                kms, top = kernel_ms(call)
                pk = peak_gib(call)
                flops = fwd_flops * (1.0 if pass_name == "fwd" else 3.5)
                row = {
                    "op": "attention",
                    "variant": "standard",
                    "kernel": name,
                    "preset": preset,
                    "shape": shape,
                    "dtype": "bfloat16",
                    "pass": pass_name,
                    "wall_ms": round(w, 4),
                    "kernel_ms": round(kms, 4) if kms is not None else None,
                    "tbps": None,
                    "tflops": round(flops / (w * 1e-3) / 1e12, 1),
                    "peak_gib": round(pk, 3) if pk is not None else None,
                }
                RESULTS["bench"].append(row)
                RESULTS["bench_details"].append({"kernel": name, "pass": pass_name, "top_gpu_kernels": top,
                                                 "tflops_from_kernel_time": round(flops / (kms * 1e-3) / 1e12, 1)
                                                 if kms else None})
                log(f"  wall {w:.3f} ms, kernel {kms if kms is None else round(kms, 3)} ms, "
                    f"{row['tflops']} TFLOP/s, peak {row['peak_gib']} GiB; top: {top[:2]}")
            except Exception as e:
                RESULTS["errors"].append({"bench": name, "pass": pass_name, "error": repr(e)[:2000],
                                          "traceback": traceback.format_exc()[-4000:]})
                log(f"  FAILED {e!r}")
            finally:
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
            write_json()


def main() -> int:
    meta()
    log(f"meta: {RESULTS['meta']}")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        RESULTS["errors"].append({"where": "setup", "error": "no CUDA device; use --smoke for a CPU plumbing run"})
        write_json()
        log("no CUDA device")
        return 2
    mods = load_kernels()
    if not mods:
        RESULTS["errors"].append({"where": "setup", "error": "no flash kernel imports", "skipped": RESULTS["skipped"]})
        write_json()
        return 2
    if not ARGS.skip_check:
        check_all(mods)
    if not ARGS.skip_model:
        log("model: tiny Qwen3 through transformers")
        try:
            check_model(mods)
        except Exception as e:
            RESULTS["errors"].append({"where": "model", "error": repr(e)[:2000], "traceback": traceback.format_exc()})
            log(f"model check FAILED: {e!r}")
    if not ARGS.skip_bench:
        bench(mods)
    rows = RESULTS["checks"] + RESULTS["model"]
    n_ok = sum(1 for c in rows if c.get("ok"))
    per_kernel = {k: {"ok": sum(1 for c in rows if c.get("kernel") == k and c.get("ok")),
                      "of": sum(1 for c in rows if c.get("kernel") == k)} for k in mods}
    RESULTS["summary"] = {"checks_ok": n_ok, "checks": len(rows), "per_kernel": per_kernel,
                          "errors": len(RESULTS["errors"]), "bench_rows": len(RESULTS["bench"]),
                          "skipped": sorted(RESULTS["skipped"])}
    write_json()
    log(f"summary: {RESULTS['summary']}")
    for r in RESULTS["bench"]:
        log(f"  {r['kernel']:<44} {r['pass']:<8} wall {r['wall_ms']} ms  kernel {r['kernel_ms']} ms  "
            f"{r['tflops']} TFLOP/s  peak {r['peak_gib']} GiB")
    return 0 if n_ok == len(rows) and not RESULTS["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
