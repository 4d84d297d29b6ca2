"""Sweep the tile configurations of veomni-triton's MoE GEMM kernels at the moe-30b-a3b shape (~5 min).

    python plugins/veomni-triton/gpu/tune_moe.py [--json tune_moe.json]

The kernels pick a tile configuration from a table per device (``_TABLE_SM90`` in
``veomni_triton/kernels/moe.py``), not by autotuning. This script times each of the five
GEMM kernels alone (gate_up, down, dh, dx, the two weight gradients) over candidate
configurations (``triton.testing.do_bench`` median), prints them from fastest to slowest and
the table the fastest make, so the table can be corrected from a real measurement. The
speed of the whole op against its peers is ``veomni-ops bench --preset moe-30b-a3b``.
Needs a CUDA GPU, torch, triton; ``TRITON_INTERPRET=1 VEOMNI_GPU_SMOKE=1`` runs the plumbing
on the CPU at tiny shapes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from _setup import SMOKE, pick

ROWS: list[dict] = []


def tune_candidates(G) -> dict:
    """Tile configurations tried per kernel by ``--tune`` (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)."""
    c = {
        "gate_up": [(128, 64, 64, 4, 3), (128, 64, 64, 8, 4), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4),
                    (128, 64, 128, 4, 3), (128, 64, 128, 8, 3), (64, 128, 64, 4, 4), (128, 32, 64, 4, 5),
                    (256, 64, 64, 8, 3)],
        "down": [(128, 256, 64, 8, 4), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4), (128, 256, 32, 8, 4),
                 (128, 128, 128, 8, 3), (256, 128, 64, 8, 3), (128, 256, 128, 8, 2), (64, 256, 64, 4, 4)],
        "dh": [(128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (128, 64, 64, 8, 4), (128, 128, 128, 8, 2),
               (128, 256, 64, 8, 3), (64, 128, 64, 4, 4), (128, 128, 32, 8, 5)],
        "wgrad": [(128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 128, 32, 8, 4), (128, 128, 128, 8, 2),
                  (128, 128, 128, 8, 3), (256, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4)],
    }
    c["dx"] = c["down"]
    c["wgrad_down"] = c["wgrad_gate_up"] = c.pop("wgrad")
    return {kind: [G(*v) for v in vals] for kind, vals in c.items()}


def timed(fn) -> float:
    """Median milliseconds of ``fn`` (``triton.testing.do_bench``); in a smoke run one timed call
    (the interpreter: nothing worth reading)."""
    if SMOKE:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing

    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def moe_inputs(t: int, h: int, inter: int, e: int, k: int, dev, dtype) -> tuple[torch.Tensor, ...]:
    """``(x, indices, weights, gate_up_proj, down_proj, grad_out)`` as in the benchmark: routing
    from a softmax over random logits (top-k, renormalised), weights scaled by fan-in."""
    logits = torch.randn(t, e, device=dev)
    w, idx = torch.softmax(logits, -1).topk(k, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    x = torch.randn(t, h, device=dev, dtype=dtype)
    gate_up = (torch.randn(e, 2 * inter, h, device=dev) * h**-0.5).to(dtype)
    down = (torch.randn(e, h, inter, device=dev) * inter**-0.5).to(dtype)
    grad = torch.randn(t, h, device=dev, dtype=dtype)
    return x, idx.contiguous(), w.contiguous(), gate_up, down, grad


def forward_saved(M, x, idx, w, gate_up, down) -> tuple[torch.Tensor, ...]:
    """``(gu, hw, perm, offs)``: what the forward keeps for backward, and ``hw``, the down GEMM's
    input that backward recomputes (here in torch: ``w_r * silu(g) * u`` from the saved bf16 g, u)."""
    _out, gu, perm, offs = M._moe_fwd(x, idx, w, gate_up, down, True)
    g, u = gu.float().chunk(2, dim=1)
    hw = (w.reshape(-1)[perm].float()[:, None] * torch.nn.functional.silu(g) * u).to(x.dtype)
    return gu, hw, perm, offs


def tune_moe() -> None:
    """Each GEMM kernel of moe_experts alone, per candidate tile configuration (do_bench median).

    Inputs as in the benchmark (router-like routing); the backward kernels get the forward's
    saved tensors and a random output gradient. Prints per kernel the candidates from fastest
    to slowest, then the table the fastest ones make (``_TABLE_SM90`` in kernels/moe.py).
    """
    import triton
    from veomni_triton.kernels import moe as M

    t, h, inter, e, k = pick((8192, 2048, 768, 128, 8), (64, 64, 48, 8, 4))
    dtype = torch.bfloat16
    dev = "cpu" if SMOKE else "cuda"
    x, idx, w, gate_up, down, grad = moe_inputs(t, h, inter, e, k, dev, dtype)
    tk = t * k
    gu, hw, perm, offs = forward_saved(M, x, idx, w, gate_up, down)
    tiles = M._Tiles(offs, tk, e)
    dgu = (torch.randn(tk, 2 * inter, device=dev) * 0.1).to(dtype)
    gu2, hw2, dgu2 = torch.empty_like(gu), torch.empty_like(hw), torch.empty_like(dgu)
    rows_out = torch.empty(tk, h, device=dev, dtype=dtype)
    dd_w, dgu_w = torch.empty_like(down), torch.empty_like(gate_up)

    def dh(cfg):
        dwp = torch.empty((tk, triton.cdiv(inter, cfg.block_n)), device=dev, dtype=torch.float32)
        M._dh(grad, perm, w, down, tiles, gu, dgu2, dwp, k, cfg, hw=hw2)

    launch = {
        "gate_up": (lambda cfg: M._gate_up(x, perm, w, gate_up, tiles, gu2, hw2, k, True, cfg), 2 * tk * h * 2 * inter),
        "down": (lambda cfg: M._grouped_scatter(hw, perm, tiles, down, rows_out, h, inter, down.stride(2),
                                                down.stride(1), cfg), 2 * tk * inter * h),
        "dh": (dh, 2 * tk * h * inter),
        "dx": (lambda cfg: M._grouped_scatter(dgu, perm, tiles, gate_up, rows_out, h, 2 * inter, gate_up.stride(1),
                                              gate_up.stride(2), cfg), 2 * tk * 2 * inter * h),
        "wgrad_down": (lambda cfg: M._wgrad(grad, True, hw, False, perm, offs, dd_w, k, cfg), 2 * tk * h * inter),
        "wgrad_gate_up": (lambda cfg: M._wgrad(dgu, False, x, True, perm, offs, dgu_w, k, cfg),
                          2 * tk * 2 * inter * h),
    }
    device = torch.device(dev)
    index = 0 if SMOKE else torch.cuda.current_device()
    budget = None if SMOKE else M._max_shared_mem(index) - 8192
    best: dict = {}
    for kind, cands in tune_candidates(M.GemmConfig).items():
        current = M._config(kind, device, dtype, tk / e)
        results = []
        for cfg in [current] + [c for c in cands if c != current]:
            tag = tuple(cfg.__dict__.values())
            if SMOKE:
                cfg = M._INTERPRET_TABLE["down"]
            elif M._smem_bytes(kind if kind == "gate_up" else "down", cfg, 2) > budget:
                results.append((float("inf"), tag, "shared memory"))
                continue
            fn, flops = launch[kind]
            try:
                fn(cfg)
                ms = timed(lambda fn=fn, cfg=cfg: fn(cfg))
                results.append((ms, tag, f"{flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s"))
            except Exception as ex:  # out of resources etc.: next candidate
                results.append((float("inf"), tag, f"ERROR {type(ex).__name__}: {str(ex)[:120]}"))
            if SMOKE:
                break
        results.sort(key=lambda r: r[0])
        print(f"\n{kind} (current: {tuple(current.__dict__.values())})", flush=True)
        for ms, tag, note in results:
            mark = "  <- current" if tag == tuple(current.__dict__.values()) else ""
            print(f"  {ms:9.4f} ms  {str(tag):24s} {note}{mark}", flush=True)
            ROWS.append({"op": "moe_experts", "kernel": "triton", "preset": f"tune:{kind}", "pass": kind,
                         "shape": f"T={t} H={h} I={inter} E={e} K={k}", "dtype": "bfloat16", "config": tag,
                         "wall_ms": None if ms == float("inf") else ms, "kernel_ms": None, "note": note,
                         "kernels": {}, "tflops": None, "tbps": None})
        best[kind] = results[0]
    print("\nfastest per kernel (a candidate _TABLE_SM90):", flush=True)
    saved = 0.0
    for kind, (ms, tag, note) in best.items():
        cur = next(r for r in ROWS if r.get("preset") == f"tune:{kind}" and r.get("config") == tuple(
            M._config(kind, device, dtype, tk / e).__dict__.values()))
        if cur["wall_ms"] is not None and ms != float("inf"):
            saved += cur["wall_ms"] - ms
        print(f'    "{kind}": GemmConfig{tag},  # {ms:.4f} ms, {note}', flush=True)
    print(f"sum of per-kernel savings vs the current table: {saved:.3f} ms per fwd+bwd", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write every timed configuration as JSON to this path")
    args = ap.parse_args()
    if not SMOKE and not torch.cuda.is_available():
        print("no CUDA device: this script times the compiled kernels on a GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    tune_moe()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": "cpu (smoke run)" if SMOKE else torch.cuda.get_device_name(), "rows": ROWS}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
