#!/usr/bin/env bash
# The 2026-11-26 session-8 device calls on one 4-GPU machine (nvidia-h100-x4 / nvidia-h200-x4),
# each at most 600 s, work split over the GPUs so that independent single-GPU work runs beside the
# multi-GPU runs (the jobs share the host's 64 cores; every ratio reported compares runs of one
# call). From the checkout's root, carry [".whl"] (.whl/peers: liger-kernel, cut-cross-entropy;
# .whl/veomni: veomni, liger-kernel):
#   bash benchmarks/gpu/x4_calls.sh A     # GPUs 0,1: issue 23 on two GPUs (small preset)
#                                         # GPU 2: issue 25's VeOmni step; GPU 3: issue 24's bench and steps
#   bash benchmarks/gpu/x4_calls.sh B     # GPUs 0-3: issue 23 on four GPUs (small preset), then
#                                         # GPUs 0,1 + 2: the 30B-shaped model over one GPU (big30b.sh)
#                                         # GPU 3: issue 24's tune and the locked step
#   bash benchmarks/gpu/x4_calls.sh C     # issue 23 on the 30B-shaped 4-layer model (bf16, fits one GPU)
#   bash benchmarks/gpu/x4_calls.sh D     # after the compile + layout fix: each layout eager and compiled
#                                         # (GPUs 0,1 small preset; GPUs 2,3 30B-shaped), then on four GPUs;
#                                         # then issue 24's tune and the locked step alone on the machine
#   bash benchmarks/gpu/x4_calls.sh F     # session 9: compile under a layout with the eager layout's Triton
#                                         # kernels named (*-compile-triton.yaml) beside compile mode's auto and
#                                         # eager, the hand-written FSDP2 script with our kernels, and a profile of
#                                         # each compiled layout beside its eager twin (GPUs 0,1 small; 2,3 30B-shaped)
#   bash benchmarks/gpu/x4_calls.sh G     # the same after the router-logit graph-break fix, with the code
#                                         # before it (.carry-before, carried) in the same call
# Results: $OUT/call-X.tgz (one file: a call's returned files are capped in count).
set -u
CALL=$1; REAL_OUT=${OUT:-$PWD/gpu-results}; W=/tmp/res-$CALL; rm -rf "$W"; mkdir -p "$W"
export OUT=$W
nvidia-smi > "$W/gpus-$CALL.txt" 2>&1; nvidia-smi topo -m >> "$W/gpus-$CALL.txt" 2>&1
I23=benchmarks/gpu/issue23; P=benchmarks/gpu/par_run.sh
now=$(date +%s)
case $CALL in
  A)
    ( export CUDA_VISIBLE_DEVICES=0,1 CFG=$I23 NPROC=2 DEADLINE=$((now + 560))
      bash $P . x2 cli:one cli:dp2:--baseline:transformers+fsdp2:--baseline:transformers+fsdp2+compile \
        cli:dp2-compile cli:sp2 cli:sp2-compile cli:dp2ep2 cli:dp2ep2-compile cli:one-compile ) > "$W/i23-x2.log" 2>&1 &
    ( export CUDA_VISIBLE_DEVICES=2 OMP_NUM_THREADS=8
      bash benchmarks/gpu/veomni_step.sh --steps 20 --timeout 100 ) > "$W/veomni.log" 2>&1 &
    ( export CUDA_VISIBLE_DEVICES=3 OMP_NUM_THREADS=8 DEADLINE=$((now + 565))
      bash benchmarks/gpu/issue24.sh flce step:qwen3-small-auto-compile step:qwen3-moe-small-auto-compile flce-dense ) > "$W/i24.log" 2>&1 &
    wait;;
  B)
    ( export CFG=$I23 NPROC=4 DEADLINE=$((now + 250))
      bash $P . x4 cli:one cli:dp4 cli:dp4-compile cli:sp4 cli:sp4-compile cli:dp4ep4 ) > "$W/i23-x4.log" 2>&1
    ( export PYTHONPATH=/tmp/site-x4 T_DP=300 T_ONE=240; bash benchmarks/gpu/big30b.sh ) > "$W/big30b.log" 2>&1 &
    ( export CUDA_VISIBLE_DEVICES=3 OMP_NUM_THREADS=8 DEADLINE=$(( $(date +%s) + 300 ))
      bash benchmarks/gpu/issue24.sh tune:qwen3-moe-small-auto lockstep:qwen3-moe-small-auto ) > "$W/i24b.log" 2>&1 &
    wait;;
  C)
    ( export CFG=$I23 NPROC=2 CUDA_VISIBLE_DEVICES=0,1 DEADLINE=$((now + 420))
      bash $P . x2c cli:30b4-one cli:30b4-dp2 cli:30b4-dp2-compile cli:30b4-one-compile cli:30b4-sp2 cli:30b4-dp2ep2 ) > "$W/i23-30b-x2.log" 2>&1
    ( export CFG=$I23 NPROC=4 DEADLINE=$(( $(date +%s) + 140 )); bash $P . x4c cli:30b4-dp4 ) > "$W/i23-30b-x4.log" 2>&1;;
  D)
    ( export CFG=$I23 NPROC=2 CUDA_VISIBLE_DEVICES=0,1 DEADLINE=$((now + 300))
      bash $P . x2 cli:one cli:one-compile cli:dp2 cli:dp2-compile cli:sp2 cli:sp2-compile cli:dp2ep2 cli:dp2ep2-compile ) > "$W/i23-x2.log" 2>&1 &
    ( export CFG=$I23 NPROC=2 CUDA_VISIBLE_DEVICES=2,3 DEADLINE=$((now + 300))
      bash $P . x2b cli:30b4-one cli:30b4-dp2 cli:30b4-dp2-compile cli:30b4-sp2 cli:30b4-dp2ep2 cli:30b4-one-compile ) > "$W/i23-30b-x2.log" 2>&1 &
    wait
    ( export CFG=$I23 NPROC=4 DEADLINE=$(( $(date +%s) + 100 )); bash $P . x4 cli:dp4 cli:dp4-compile ) > "$W/i23-x4.log" 2>&1
    ( export CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=8 DEADLINE=$(( $(date +%s) + 130 ))
      bash benchmarks/gpu/issue24.sh tune:qwen3-moe-small-auto lockstep:qwen3-moe-small-auto ) > "$W/i24.log" 2>&1;;
  F)
    ( export CFG=$I23 NPROC=2 CUDA_VISIBLE_DEVICES=0,1 DEADLINE=$((now + 540))
      bash $P . x2 cli:one cli:dp2 cli:dp2-compile cli:dp2-compile-triton script cli:one-compile-triton \
        prof:dp2-compile prof:dp2 prof:dp2-compile-triton ) > "$W/i23-x2.log" 2>&1 &
    ( export CFG=$I23 NPROC=2 CUDA_VISIBLE_DEVICES=2,3 DEADLINE=$((now + 540)) MASTER_PORT=29600
      bash $P . x2b cli:30b4-one cli:30b4-dp2 cli:30b4-dp2-compile cli:30b4-dp2-compile-triton cli:30b4-one-compile-triton \
        prof:30b4-dp2-compile prof:30b4-dp2 ) > "$W/i23-30b-x2.log" 2>&1 &
    wait;;
  G)  # the router-logit graph-break fix (3a59366), before (.carry-before: c125f4c's core and veomni-triton,
      # carried) and after, in one call; each compiled layout beside eager, Triton-named and one GPU
      # (a repeated run has a second `--steps 14`, the same value, for a file name of its own)
    ( export CFG=$I23 NPROC=2 CUDA_VISIBLE_DEVICES=0,1 DEADLINE=$((now + 550))
      bash $P . x2 cli:dp2 cli:dp2-compile
      bash $P .carry-before x2-before cli:dp2-compile
      bash $P . x2 cli:dp2-compile-triton cli:one cli:one-compile cli:one-compile-triton script \
        cli:dp2:--steps:14 cli:dp2-compile:--steps:14 prof:dp2-compile ) > "$W/i23-x2.log" 2>&1 &
    ( export CFG=$I23 NPROC=2 CUDA_VISIBLE_DEVICES=2,3 DEADLINE=$((now + 550)) MASTER_PORT=29600
      bash $P . x2b cli:30b4-dp2 cli:30b4-dp2-compile
      bash $P .carry-before x2b-before cli:30b4-dp2-compile
      bash $P . x2b cli:30b4-dp2-compile-triton cli:30b4-one cli:30b4-one-compile cli:30b4-one-compile-triton \
        cli:30b4-dp2:--steps:14 prof:30b4-dp2-compile prof:30b4-dp2 ) > "$W/i23-30b-x2.log" 2>&1 &
    wait;;
  *) echo "unknown call $CALL (A, B, C, D, F or G)"; exit 2;;
esac
cat "$W"/*.log | grep -v "^\s*$" | tail -150
# the profiles' Chrome traces stay behind (a returned file is at most 16 MiB); their summaries come back
tar czf "$REAL_OUT/call-$CALL.tgz" --exclude='*.trace.json.gz' -C /tmp "res-$CALL"
