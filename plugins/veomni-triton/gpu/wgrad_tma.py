"""An experiment for issue 33's experts goal: the two weight-gradient GEMMs of ``moe_experts``
with Hopper's TMA (Triton tensor descriptors) on rows gathered once, beside the shipped kernel.

    python plugins/veomni-triton/gpu/wgrad_tma.py [--json wgrad_tma.json]

At the moe-30b-a3b shape (T 8192, top-8 of 128 experts, H 2048, I 768, bf16) the shipped
``wgrad_kernel`` reads one operand of each weight gradient through the routing permutation (a
gather: ``grad_out[token]`` for ``d down_proj``, ``x[token]`` for ``d gate_up_proj``). TMA cannot
gather on Hopper, so this script times, per GEMM:

* ``shipped``: ``kernels.moe._wgrad`` as ``moe_experts`` calls it (the gather inside);
* ``gathered + shipped``: the gathered operand written once in expert order (``index_select``,
  timed on its own line), then the same kernel without the gather;
* ``gathered + tma BMxBNxBK/warps/stages``: that copy, then :func:`wgrad_tma_kernel`, whose loads
  are tensor descriptors; each expert's last, partial block of rows is zeroed in registers;
* ``gathered + torch._grouped_mm``: CUTLASS's grouped GEMM on the same rows, the reference.

Each line has the median (``triton.testing.do_bench``), TFLOP/s and the worst error against a
float32 reference, relative to its largest magnitude. Nothing here is used by the plugin; the
figures decide whether ``moe_experts`` should take this path (results under
``benchmarks/results/``). ``TRITON_INTERPRET=1 VEOMNI_GPU_SMOKE=1`` runs the plumbing on the
CPU at tiny shapes (no timing worth reading).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl
from _setup import SMOKE, device, pick
from tune_moe import moe_inputs, timed
from veomni_triton.kernels.moe_kernels import _to_out


@triton.jit
def wgrad_tma_kernel(
    a_desc, b_desc, offs_ptr, out_ptr, M, N, stride_oe, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):
    """``out[e] = A[rows of e]^T @ B[rows of e]``; A ``[R, M]`` and B ``[R, N]`` in expert order,
    read through tensor descriptors of blocks ``[BLOCK_K, BLOCK_M]`` and ``[BLOCK_K, BLOCK_N]``.
    Programs: (expert, M-tile, N-tile); an expert with no rows writes zeros."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    expert = pid // (num_m * num_n)
    rem = pid % (num_m * num_n)
    m0 = (rem // num_n) * BLOCK_M
    n0 = (rem % num_n) * BLOCK_N
    start = tl.load(offs_ptr + expert).to(tl.int32)
    end = tl.load(offs_ptr + expert + 1).to(tl.int32)
    full_end = start + (end - start) // BLOCK_K * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(start, full_end, BLOCK_K):  # whole blocks: straight from shared memory into the MMA
        a = a_desc.load([r0, m0])
        b = b_desc.load([r0, n0])
        if UPCAST:  # the interpreter's dot takes fp32
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a.T, b, acc)
    if full_end < end:  # the partial block: rows past the expert's end belong to the next one
        keep = (full_end + tl.arange(0, BLOCK_K)) < end
        a = a_desc.load([full_end, m0])
        b = b_desc.load([full_end, n0])
        a = tl.where(keep[:, None], a, tl.zeros_like(a))
        b = tl.where(keep[:, None], b, tl.zeros_like(b))
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a.T, b, acc)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    ptrs = out_ptr + expert.to(tl.int64) * stride_oe + offs_m[:, None].to(tl.int64) * stride_om \
        + offs_n[None, :] * stride_on
    # the shipped kernels' cast: round to nearest even under the interpreter too (it truncates)
    tl.store(ptrs, _to_out(acc, out_ptr.dtype.element_ty, UPCAST), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def wgrad_tma(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, cfg: tuple) -> None:
    """Launch :func:`wgrad_tma_kernel`; ``cfg`` = (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, warps, stages = cfg
    e, m, n = out.shape
    a_desc = TensorDescriptor.from_tensor(a, [bk, bm])
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
    grid = (e * triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    wgrad_tma_kernel[grid](a_desc, b_desc, offs, out, m, n, out.stride(0), out.stride(1), out.stride(2),
                           BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, UPCAST=SMOKE, num_warps=warps, num_stages=stages)


#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) tried for the TMA kernel.
TMA_CONFIGS = [(128, 128, 64, 4, 3), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3),
               (128, 128, 32, 4, 5), (128, 128, 128, 8, 2), (64, 128, 64, 4, 4)]


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
    scale = ref.abs().max().item()
    out = torch.empty(shape, device=a.device, dtype=a.dtype)
    variants = {
        "shipped": lambda: M._wgrad(a, a_g, b, b_g, perm, offs, out, k, cfg_shipped),
        "gathered + shipped": lambda: M._wgrad(a_rows, False, b_rows, False, perm, offs, out, k, cfg_shipped),
    }
    for cfg in tma_configs:
        label = "gathered + tma " + "x".join(map(str, cfg[:3])) + f"/{cfg[3]}w/{cfg[4]}s"
        variants[label] = lambda cfg=cfg: wgrad_tma(a_rows, b_rows, offs, out, cfg)
    if hasattr(torch, "_grouped_mm") and not SMOKE:
        variants["gathered + torch._grouped_mm"] = lambda: out.copy_(
            torch._grouped_mm(a_rows.t(), b_rows, offs=offs[1:].to(torch.int32)))
    gathered = a if a_g else b
    copy_ms = timed(lambda: gathered.index_select(0, tokens))
    print(f"\n{gname}: out {tuple(shape)}; the gather copy alone {copy_ms:.4f} ms", flush=True)
    rows: list[dict] = [{"gemm": gname, "variant": "gather copy", "ms": copy_ms}]
    for vname, fn in variants.items():
        try:
            fn()
            err = ((out.float() - ref).abs().max().item() / scale) if scale else 0.0
            ms = timed(fn)
            note = f"{ms:9.4f} ms  {flops / (ms * 1e-3) / 1e12:6.0f} TFLOP/s  error {err:.2e}"
            rows.append({"gemm": gname, "variant": vname, "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12,
                         "rel_error": err})
        except Exception as ex:  # a configuration out of resources, an API this Triton lacks: next
            note = f"ERROR {type(ex).__name__}: {str(ex)[:160]}"
            rows.append({"gemm": gname, "variant": vname, "error": note})
        print(f"  {vname:40s} {note}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    picked = device("the TMA weight-gradient experiment")
    if picked is None:
        return 2
    dev, name = picked
    from veomni_triton.kernels import moe as M

    t, h, inter, e, k = pick((8192, 2048, 768, 128, 8), (64, 64, 48, 8, 4))
    dt = torch.bfloat16
    torch.manual_seed(0)
    x, idx, w, gate_up, down, grad = moe_inputs(t, h, inter, e, k, dev, dt)
    _out, _gu, hw, perm, offs = M._moe_fwd(x, idx, w, gate_up, down, True)
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "shape": dict(T=t, H=h, I=inter, E=e, K=k), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
