#!/usr/bin/env bash
# Issue 23, "bigger than one GPU": examples/qwen3-30b-a3b-shaped-dp2.yaml on two GPUs (meta init,
# FSDP2) and its one-GPU twin (expected to run out of memory), at the same time on GPUs
# $GPUS_DP (default 0,1) and $GPU_ONE (default 2). From a checkout's root on a CUDA machine with
# core/ and plugins/veomni-triton/ installed on PYTHONPATH (benchmarks/gpu/par_run.sh's site):
#   bash benchmarks/gpu/big30b.sh
# The examples have 10 layers (6.85B parameters: 110 GB in float32 with AdamW, over an 80 GB H100);
# on a card of more than 100 GB (H200) both copies get 15 layers (9.97B: 160 GB on one GPU, 80 GB
# a GPU on two). Writes the job files used, JSON and logs into $OUT/big30b/.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/gpu-results}; RES=$OUT/big30b; mkdir -p "$RES"
GPUS_DP=${GPUS_DP:-0,1}; GPU_ONE=${GPU_ONE:-2}
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
L=10; [ "$mem" -gt 100000 ] && L=15
cp examples/qwen3-30b-a3b-4layers.config.json "$RES/"
for f in dp2 1gpu; do
  sed "s/num_hidden_layers: 10/num_hidden_layers: $L/" "examples/qwen3-30b-a3b-shaped-$f.yaml" > "$RES/shaped-$f.yaml"
done
echo "[big30b] $L layers (GPU memory $mem MiB)"
t0=$(date +%s)
CUDA_VISIBLE_DEVICES=$GPUS_DP timeout "${T_DP:-420}" python3 -m torch.distributed.run --nproc-per-node 2 \
  -m veomni_ops.cli train "$RES/shaped-dp2.yaml" --json > "$RES/dp2.json" 2> "$RES/dp2.log" &
dp=$!
( CUDA_VISIBLE_DEVICES=$GPU_ONE timeout "${T_ONE:-300}" python3 -m veomni_ops.cli train "$RES/shaped-1gpu.yaml" --json \
  > "$RES/1gpu.json" 2> "$RES/1gpu.log"; echo "exit $?" >> "$RES/1gpu.log" ) &
one=$!
# the GPUs' memory while they run (MiB, every 5 s)
( while kill -0 $dp 2>/dev/null; do nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$RES/memory.log"; sleep 5; done ) &
wait $dp; echo "exit $?" >> "$RES/dp2.log"; wait $one
echo "[big30b] took $(( $(date +%s) - t0 )) s"
echo "[big30b] one GPU:"; grep -i -E "out of memory|exit" "$RES/1gpu.log" | cut -c1-300 | tail -3
echo "[big30b] dp2:"; tail -6 "$RES/dp2.log"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"[big30b] dp2: {d['tokens_per_s']:.0f} tok/s, peak {d['peak_gib']:.2f} GiB, losses {[round(x, 4) for x in d.get('losses', [])]}\")" "$RES/dp2.json" 2>/dev/null || true
