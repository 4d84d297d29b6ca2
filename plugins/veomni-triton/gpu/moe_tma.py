"""An experiment for issue 33's experts goal: three backward GEMMs of ``moe_experts`` with Hopper's
TMA (Triton tensor descriptors) on rows gathered once, beside the shipped kernels.

    python plugins/veomni-triton/gpu/moe_tma.py [--json moe_tma.json]

At the moe-30b-a3b shape (T 8192, top-8 of 128 experts, H 2048, I 768, bf16) the shipped
``wgrad_kernel`` reads one operand of each weight gradient through the routing permutation (a
gather: ``grad_out[token]`` for ``d down_proj``, ``x[token]`` for ``d gate_up_proj``). TMA cannot
gather on Hopper, so this script times, per GEMM:

* ``shipped``: ``kernels.moe._wgrad`` as ``moe_experts`` calls it (the gather inside);
* ``gathered + shipped``: the gathered operand written once in expert order (``index_select``,
  timed on its own line), then the same kernel without the gather;
* ``gathered + tma BMxBNxBK/warps/stages``: that copy, then the plugin's ``wgrad_tma_kernel``
  (``GemmConfig(..., tma=True)``: the path ``moe_experts`` takes where its table says so), whose loads
  are tensor descriptors; each expert's last, partial block of rows is zeroed in registers;
* ``gathered + torch._grouped_mm``: CUTLASS's grouped GEMM on the same rows, the reference.

and for ``dh`` (``grad_out[token] @ down_proj[e]`` with the SiLU·up backward epilogue, the
slowest GEMM against CUTLASS in ``benchmarks/results/h100-2026-11-25-moe``):

* ``shipped``: ``kernels.moe._dh`` (the gather inside);
* ``gathered + tma ...``: the plugin's ``dh_tma_kernel`` (``GemmConfig(..., tma=True)``), the same
  epilogue (``_dh_epilogue``) after a main loop whose A (the gathered ``grad_out`` rows, the copy
  ``d down_proj`` shares) and B (``down_proj`` as ``[E*H, I]``) are tensor descriptors;
* ``gathered + torch._grouped_mm (no epilogue)``: the GEMM alone, what the epilogue costs.

Last, the whole op (fwd+bwd) with the shipped table and with ``tma`` on at the fastest TMA
configurations found, in the same process.

Each line has the median (``triton.testing.do_bench``), TFLOP/s and the worst error against a
float32 reference, relative to its largest magnitude. The figures decide whether ``moe_experts``'
sm90 table turns ``tma`` on for the weight gradients and dh (results under ``benchmarks/results/``).
``TRITON_INTERPRET=1 VEOMNI_GPU_SMOKE=1`` runs the plumbing on the CPU at tiny shapes (no timing
worth reading).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
from _setup import SMOKE, device, pick
from tune_moe import forward_saved, moe_inputs, timed

#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) tried for the TMA weight-gradient kernel.
TMA_CONFIGS = [(128, 128, 64, 4, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3),
               (128, 128, 32, 4, 5), (128, 128, 128, 8, 2), (64, 128, 64, 4, 4)]
#: ... and for the TMA dh kernel (the shipped dh config first).
DH_CONFIGS = [(128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (128, 64, 64, 8, 4),
              (128, 128, 128, 8, 3), (64, 128, 64, 4, 4), (128, 256, 64, 8, 3)]


def tma_label(cfg: tuple) -> str:
    """``gathered + tma BMxBNxBK/Ww/Ss`` for a (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) tuple."""
    return "gathered + tma " + "x".join(map(str, cfg[:3])) + f"/{cfg[3]}w/{cfg[4]}s"


def reference(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, e: int) -> torch.Tensor:
    o = offs.tolist()
    return torch.stack([a[o[i]:o[i + 1]].float().T @ b[o[i]:o[i + 1]].float() for i in range(e)])


def one_gemm(M, gname: str, a: torch.Tensor, a_g: bool, b: torch.Tensor, b_g: bool, shape, perm: torch.Tensor,
             offs: torch.Tensor, k: int, e: int, cfg_shipped, tma_configs: list[tuple]) -> list[dict]:
    """Every variant of one weight gradient (module docstring), printed and returned as rows."""
    tokens = perm // k
    flops = 2 * perm.numel() * shape[1] * shape[2]
    a_rows = a.index_select(0, tokens) if a_g else a
    b_rows = b.index_select(0, tokens) if b_g else b
    ref = reference(a_rows, b_rows, offs, e)
    out = torch.empty(shape, device=a.device, dtype=a.dtype)
    variants = {
        "shipped": (lambda: M._wgrad(a, a_g, b, b_g, perm, offs, out, k, cfg_shipped), None),
        "gathered + shipped": (lambda: M._wgrad(a_rows, False, b_rows, False, perm, offs, out, k, cfg_shipped), None),
    }
    for cfg in tma_configs:
        variants[tma_label(cfg)] = (lambda cfg=cfg: M._wgrad(a_rows, False, b_rows, False, perm, offs, out, k,
                                                             M.GemmConfig(*cfg, tma=True)), cfg)
    if hasattr(torch, "_grouped_mm") and not SMOKE:
        variants["gathered + torch._grouped_mm"] = (lambda: out.copy_(
            torch._grouped_mm(a_rows.t(), b_rows, offs=offs[1:].to(torch.int32))), None)
    gathered = a if a_g else b
    copy_ms = timed(lambda: gathered.index_select(0, tokens))
    print(f"\n{gname}: out {tuple(shape)}; the gather copy alone {copy_ms:.4f} ms", flush=True)
    return [{"gemm": gname, "variant": "gather copy", "ms": copy_ms}] + measure(
        gname, variants, lambda: out.float(), ref, flops)


def measure(gname: str, variants: dict, result, ref: torch.Tensor, flops: int) -> list[dict]:
    """Run, check (worst error relative to ``ref``'s largest magnitude) and time each variant
    (name: (function, its TMA tile tuple or None))."""
    scale = ref.abs().max().item()
    rows: list[dict] = []
    for vname, (fn, tma_cfg) in variants.items():
        try:
            fn()
            err = ((result() - ref).abs().max().item() / scale) if scale else 0.0
            ms = timed(fn)
            note = f"{ms:9.4f} ms  {flops / (ms * 1e-3) / 1e12:6.0f} TFLOP/s  error {err:.2e}"
            rows.append({"gemm": gname, "variant": vname, "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12,
                         "rel_error": err, "tma_config": tma_cfg})
        except Exception as ex:  # a configuration out of resources, an API this Triton lacks: next
            note = f"ERROR {type(ex).__name__}: {str(ex)[:160]}"
            rows.append({"gemm": gname, "variant": vname, "error": note})
        print(f"  {vname:40s} {note}", flush=True)
    return rows


def dh_gemm(M, grad, perm, offs, w, down, gu, k: int, cfg_shipped, configs: list[tuple]) -> list[dict]:
    """Every variant of the dh GEMM (module docstring): ``dgu`` checked against a float32 reference."""
    e, h, inter = down.shape
    tk = perm.numel()
    go_rows = grad.index_select(0, perm // k)
    o = offs.tolist()
    dhu = torch.cat([go_rows[o[i]:o[i + 1]].float() @ down[i].float() for i in range(e)])
    g, u = gu.float().chunk(2, dim=1)
    rw = w.reshape(-1)[perm].float()[:, None]
    sig = torch.sigmoid(g)
    ref = torch.cat([dhu * rw * u * sig * (1 + g * (1 - sig)), dhu * rw * g * sig], dim=1)
    tiles = M._Tiles(offs, tk, e)
    dgu = torch.empty_like(gu)
    hw = torch.empty((tk, inter), device=gu.device, dtype=gu.dtype)  # the shipped path recomputes it here

    def dwp(bn: int) -> torch.Tensor:
        return torch.zeros((tk, triton.cdiv(inter, bn)), device=grad.device, dtype=torch.float32)

    variants = {"shipped": (lambda: M._dh(grad, perm, w, down, tiles, gu, dgu, dwp(cfg_shipped.block_n), k,
                                          cfg_shipped, hw=hw), None)}
    for cfg in configs:
        variants[tma_label(cfg)] = (lambda cfg=cfg: M._dh(grad, perm, w, down, tiles, gu, dgu, dwp(cfg[1]), k,
                                                          M.GemmConfig(*cfg, tma=True), hw=hw, go_rows=go_rows), cfg)
    if hasattr(torch, "_grouped_mm") and not SMOKE:
        variants["gathered + torch._grouped_mm (no epilogue)"] = (lambda: dgu[:, :inter].copy_(
            torch._grouped_mm(go_rows, down, offs=offs[1:].to(torch.int32))), None)
    print(f"\ndh: [{tk}, {2 * inter}] from grad_out rows and down_proj; the shipped config "
          f"{tuple(cfg_shipped.__dict__.values())}", flush=True)
    return measure("dh", variants, lambda: dgu.float(), ref, 2 * tk * h * inter)


def best_tma(rows: list[dict], gname: str):
    """The fastest TMA tile tuple measured for ``gname`` (None if none ran)."""
    timed_rows = [r for r in rows if r["gemm"] == gname and r.get("tma_config") and "ms" in r]
    return min(timed_rows, key=lambda r: r["ms"])["tma_config"] if timed_rows else None


def whole_op(M, rows: list[dict], x, idx, w, gate_up, down, grad) -> list[dict]:
    """``moe_experts`` fwd+bwd (do_bench median) with the shipped table, then with ``tma`` on for
    the weight gradients, dh, and both, each at the fastest TMA configuration measured above;
    outputs and gradients compared with the shipped table's (relative to their largest value)."""
    leaves = [p.detach().clone().requires_grad_() for p in (x, w, gate_up, down)]

    def step():
        for p in leaves:
            p.grad = None
        M.moe_experts(leaves[0], idx, leaves[1], leaves[2], leaves[3]).backward(grad)
        return [p.grad.float() for p in leaves]

    best = {kind: best_tma(rows, gname) for gname, kind in
            (("d down_proj", "wgrad_down"), ("d gate_up_proj", "wgrad_gate_up"), ("dh", "dh"))}
    on = {kind: M.GemmConfig(*cfg, tma=True) for kind, cfg in best.items() if cfg}
    tma = {kind: cfg for kind, cfg in on.items() if kind != "dh"}
    dh = {kind: cfg for kind, cfg in on.items() if kind == "dh"}
    variants = {"shipped table": {}, "tma weight gradients": tma, "tma dh": dh, "tma both": {**tma, **dh}}
    print("\nmoe_experts fwd+bwd, whole op:", flush=True)
    base = step()
    out: list[dict] = []
    for vname, cfgs in variants.items():
        with M.override_configs(**cfgs):
            got = step()
            diff = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in zip(got, base))
            ms = timed(step)
        print(f"  {vname:24s} {ms:9.4f} ms  grads vs the shipped table {diff:.2e}  "
              f"{ {k: tuple(v.__dict__.values()) for k, v in cfgs.items()} }", flush=True)
        out.append({"gemm": "moe_experts fwd+bwd", "variant": vname, "ms": ms, "rel_diff_vs_shipped": diff,
                    "configs": {k: list(v.__dict__.values()) for k, v in cfgs.items()}})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    picked = device("the TMA experiment for the experts' backward GEMMs")
    if picked is None:
        return 2
    dev, name = picked
    from veomni_triton.kernels import moe as M

    t, h, inter, e, k = pick((8192, 2048, 768, 128, 8), (64, 64, 48, 8, 4))
    dt = torch.bfloat16
    torch.manual_seed(0)
    x, idx, w, gate_up, down, grad = moe_inputs(t, h, inter, e, k, dev, dt)
    gu, hw, perm, offs = forward_saved(M, x, idx, w, gate_up, down)
    tk = t * k
    dgu = (torch.randn(tk, 2 * inter, device=dev) * 0.1).to(dt)
    tma_configs = [(16, 32, 16, 4, 1)] if SMOKE else TMA_CONFIGS
    gemms = {  # name: (A, A gathered?, B, B gathered?, output shape, the shipped kernel's config)
        "d down_proj": (grad, True, hw, False, down.shape, M._config("wgrad_down", dev, dt, tk / e)),
        "d gate_up_proj": (dgu, False, x, True, gate_up.shape, M._config("wgrad_gate_up", dev, dt, tk / e)),
    }

    rows: list[dict] = []
    print(f"{name}; T {t}, top-{k} of {e} experts, H {h}, I {inter}, bf16; triton {triton.__version__}, "
          f"torch {torch.__version__}", flush=True)
    for gname, (a, a_g, b, b_g, shape, cfg_shipped) in gemms.items():
        rows += one_gemm(M, gname, a, a_g, b, b_g, shape, perm, offs, k, e, cfg_shipped, tma_configs)
    rows += dh_gemm(M, grad, perm, offs, w, down, gu, k, M._config("dh", dev, dt, tk / e),
                    [(16, 16, 16, 4, 1)] if SMOKE else DH_CONFIGS)
    rows += whole_op(M, rows, x, idx, w, gate_up, down, grad)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "shape": dict(T=t, H=h, I=inter, E=e, K=k), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
