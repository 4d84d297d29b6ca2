"""Expected tokens/s of the Qwen3-30B-A3B shapes (4 layers) on 1, 2, 8 and 64 nodes of 8 H100s.

A model on paper (issue 36; prose: docs/scaling.md). Every input is a committed measurement,
named with its file, or a named assumption. Run from the repository root:

    python benchmarks/scaling_model.py          # prints the Markdown tables

Stdlib only. Times in ms, bytes in B, bandwidths in B/s.
"""

from __future__ import annotations

R = "benchmarks/results/"
PROF = R + "x4-2026-11-26-compile-layout/callG-h100x4/x2b/30b4-dp2.r0.json"  # dp_shard 2, rank 0, per step

# --- Measured on H100 (committed files) -----------------------------------------------------
ONE_GPU_TOK_S = 46_507      # one GPU, batch 2 x 2048: R + "h100x4-2026-11-26-parallel/callC-30b4-x2/cli-30b4-one.json"
DP2_TOK_S = 87_791          # dp_shard 2, same call:  R + "h100x4-2026-11-26-parallel/callC-30b4-x2/cli-30b4-dp2.json"
DP4_TOK_S = 182_583         # dp_shard 4, same call:  R + "h100x4-2026-11-26-parallel/callC-30b4-x4/cli-30b4-dp4.json"
TOKENS_PER_GPU = 2 * 2048   # rows a GPU x row: benchmarks/gpu/issue23/30b4-one.yaml, 30b4-dp2.yaml, 30b4-dp4.yaml
# PROF's kernel_ms_by_kind (GPU time a step, dp_shard 2; the profiled step was 133.9 ms wall):
FWD_BWD_MS = 15.671 + 17.632 + 1.007 + 0.166 + 0.120  # matmul + other (Triton MoE) + elementwise + attention + reduce
COPY_MS = 15.582            # copy/cast: FSDP2's copy-in/out of the whole (unsharded) gradients and parameters
OPT_MS_DP2 = 23.377         # optimizer(multi_tensor): fused AdamW + float32->bf16 cast of the rank's half
AG_MS_DP2 = 12.217          # nccl_allgather
RS_MS_DP2 = 25.060          # nccl_reducescatter
COMM_MS_DP2 = 37.420        # comm_ms: union of the NCCL kernels
EXPOSED_MS_DP2 = 18.773     # comm_exposed_ms: NCCL time with no compute kernel running
AG_ELEMS = 3_119_008_768    # collectives_per_step: all-gathered bf16 elements (6 calls; the whole model once)
RS_ELEMS = 3_114_814_464    # collectives_per_step: reduce-scattered float32 elements (5 calls)
RS_CALLS = 5                # FSDP2 units a step (4 layers + root): one gradient all-reduce each under HSDP

# --- Derived from the measurements ------------------------------------------------------------
ONE_GPU_STEP_MS = TOKENS_PER_GPU / ONE_GPU_TOK_S * 1e3   # 88.1 ms
AG_BYTES, RS_BYTES = AG_ELEMS * 2, RS_ELEMS * 4          # 6.24 GB bf16, 12.46 GB float32 a step
# a ring all-gather / reduce-scatter over n ranks moves (n-1)/n of the whole tensor through each GPU
NVLINK_AG_BW = AG_BYTES * (1 / 2) / (AG_MS_DP2 / 1e3)     # 255 GB/s (waits for the other rank included)
NVLINK_RS_BW = RS_BYTES * (1 / 2) / (RS_MS_DP2 / 1e3)     # 249 GB/s
HIDDEN = 1 - EXPOSED_MS_DP2 / COMM_MS_DP2                 # 0.50: share of NCCL time under compute at dp2

# --- Assumptions (named; not measured here) -------------------------------------------------
GPUS_PER_NODE = 8           # H100 SXM nodes; the shard group is one node (dp_shard 8)
# NVLink bus bandwidth a GPU at 8 ranks = the one measured at 2 ranks (NVSwitch: each GPU its own links)
NETWORKS = {                # inter-node bandwidth a node, one NIC a GPU, split evenly over its 8 GPUs
    "400 GB/s": 400e9,      # 8 x 400 Gb/s InfiniBand NDR a node
    "100 GB/s": 100e9,      # pessimistic: 8 x 100 Gb/s (or 2 x 400 Gb/s)
}
ALPHA_S = 10e-6             # latency of one ring step across nodes (NIC + switch + NCCL proxy)
NODES = (1, 2, 8, 64)


def gpu_compute_ms(shard: int) -> tuple[float, float]:
    """(compute comm can hide: forward, backward, FSDP2 copies; compute it cannot: the optimizer,
    which runs after the last reduce, on the rank's 1/shard of the parameters)."""
    return FWD_BWD_MS + COPY_MS, OPT_MS_DP2 * 2 / shard


def nvlink_ms(shard: int) -> float:
    """All-gather (bf16 parameters) and reduce-scatter (float32 gradients) within the node."""
    f = (shard - 1) / shard
    return (AG_BYTES * f / NVLINK_AG_BW + RS_BYTES * f / NVLINK_RS_BW) * 1e3


def network_ms(replicas: int, gpu_bw: float, shard: int = GPUS_PER_NODE) -> float:
    """HSDP: every GPU all-reduces its 1/shard of the float32 gradients with its peers in the other
    replicas (ring: 2(n-1)/n of the bytes, 2(n-1) steps), one all-reduce per FSDP2 unit."""
    if replicas == 1:
        return 0.0
    nbytes = RS_BYTES / shard
    return (2 * (replicas - 1) / replicas * nbytes / gpu_bw + RS_CALLS * 2 * (replicas - 1) * ALPHA_S) * 1e3


def step_ms(shard: int, replicas: int = 1, gpu_bw: float = 0.0) -> dict[str, float]:
    """A rank's step three ways, each at least the one-GPU step (a rank runs the one-GPU step's
    forward and backward, host work included, plus FSDP2's):
    serial   - no overlap: compute, then every collective;
    measured - the share of NCCL time hidden at dp2 (HIDDEN) hidden at every size;
    full     - NVLink and network are separate resources, each hidden under the hideable compute."""
    hideable, opt = gpu_compute_ms(shard)
    nv, net = nvlink_ms(shard), network_ms(replicas, gpu_bw, shard)
    full = max(ONE_GPU_STEP_MS, opt + max(hideable, nv, net))
    serial = max(ONE_GPU_STEP_MS, hideable + opt + nv + net)
    measured = max(full, hideable + opt + (1 - HIDDEN) * (nv + net))
    return {"nvlink_ms": nv, "network_ms": net, "serial": serial, "measured": measured, "full": full}


def tok_s(gpus: int, ms: float) -> float:
    return gpus * TOKENS_PER_GPU / (ms / 1e3)


def rows() -> list[dict]:
    """The table: one node (dp_shard 8), then HSDP (dp_replicate = nodes) on each network."""
    out = []
    for nodes in NODES:
        for net, bw in (NETWORKS.items() if nodes > 1 else [("none", 0.0)]):
            gpus = nodes * GPUS_PER_NODE
            s = step_ms(GPUS_PER_NODE, nodes, bw / GPUS_PER_NODE)
            out.append({"nodes": nodes, "gpus": gpus, "network": net, **s,
                        **{f"tok_{k}": tok_s(gpus, s[k]) for k in ("serial", "measured", "full")}})
    return out


def checks() -> list[tuple[str, float | None, float]]:
    """(run, measured tokens/s or None, model's tokens/s with the measured overlap) on one node:
    dp_shard 4 was not used to fit the model; the last two are predictions for the runs left
    (dp_replicate 2 x dp_shard 2: the replicas' all-reduce on NVLink at the reduce-scatter's rate)."""
    return [("one GPU (the floor)", ONE_GPU_TOK_S, tok_s(1, ONE_GPU_STEP_MS)),
            ("dp_shard 2", DP2_TOK_S, tok_s(2, step_ms(2)["measured"])),
            ("dp_shard 4", DP4_TOK_S, tok_s(4, step_ms(4)["measured"])),
            ("dp_replicate 2, dp_shard 2 (4 GPUs)", None, tok_s(4, step_ms(2, 2, NVLINK_RS_BW)["measured"])),
            ("dp_shard 8 (8 GPUs)", None, tok_s(8, step_ms(8)["measured"]))]


def k(x: float) -> str:
    return f"{x / 1e3:,.1f}k" if x < 1e6 else f"{x / 1e6:,.2f}M"


def main() -> None:
    print(f"Inputs: one-GPU step {ONE_GPU_STEP_MS:.1f} ms for {TOKENS_PER_GPU} tokens; at dp_shard 2:")
    print(f"forward+backward {FWD_BWD_MS:.1f} ms, FSDP2 copies {COPY_MS:.1f} ms, optimizer {OPT_MS_DP2:.1f} ms;")
    print(f"NVLink {NVLINK_AG_BW / 1e9:.0f} GB/s (all-gather), {NVLINK_RS_BW / 1e9:.0f} GB/s (reduce-scatter); "
          f"{HIDDEN:.0%} of NCCL time hidden;")
    print(f"{AG_BYTES / 1e9:.2f} GB all-gathered (bf16), {RS_BYTES / 1e9:.2f} GB reduce-scattered (float32) a step.\n")
    print("| run (one node) | measured tok/s | model tok/s (measured overlap) | model / measured |")
    print("|---|---|---|---|")
    for name, got, want in checks():
        print(f"| {name} | {k(got) if got else 'not run'} | {k(want)} | {f'{want / got:.3f}' if got else '-'} |")
    print("\nLayout: dp_shard 8 on one node; dp_replicate = nodes, dp_shard 8 (HSDP) on several.\n")
    print("| nodes | GPUs | network a node | NVLink ms | network ms | step ms: no overlap / measured / full |")
    print("|---|---|---|---|---|---|")
    table = rows()
    for r in table:
        print(f"| {r['nodes']} | {r['gpus']} | {r['network']} | {r['nvlink_ms']:.1f} | {r['network_ms']:.1f} "
              f"| {r['serial']:.1f} / {r['measured']:.1f} / {r['full']:.1f} |")
    print("\n| nodes | GPUs | network a node | tok/s: no overlap | measured overlap | full overlap | a GPU |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['nodes']} | {r['gpus']} | {r['network']} | {k(r['tok_serial'])} | {k(r['tok_measured'])} "
              f"| {k(r['tok_full'])} | {k(r['tok_measured'] / r['gpus'])} |")


if __name__ == "__main__":
    main()
