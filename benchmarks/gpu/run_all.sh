#!/usr/bin/env bash
# The whole GPU pass of veomni-ops in stages that each fit a 10-minute job. Run from the repo
# root on a CUDA machine after `source benchmarks/gpu/setup.sh` (FA4 and Quack need the joined
# cutlass cu13 wheel, see that script). Results go to $RESULTS (default ./gpu-results).
#
#   benchmarks/gpu/run_all.sh check     veomni-ops plugins; veomni-ops check per distribution
#                                       (two at a time: correctness only, no timing); with
#                                       COMPILE=1 each also under torch.compile (check --compile)
#   benchmarks/gpu/run_all.sh bench-a   veomni-ops bench: seed, lbl-48, attn, attn-30b-a3b
#   benchmarks/gpu/run_all.sh bench-b   veomni-ops bench: moe-30b-a3b, flce-8k/16k/32k (peaked logits)
#   benchmarks/gpu/run_all.sh bench-c   veomni-ops bench: rope-qwen35, lbl-48-masked, host (opt-in presets)
#   benchmarks/gpu/run_all.sh bench-d   veomni-ops bench: flce-8k/16k/32k-dense (opt-in stress presets)
#
# then, anywhere: veomni-ops bench --from bench-a.json --from bench-b.json --json <device>-<date>.json
# The only GPU entry points are `veomni-ops check|bench|train`; the tuning sweeps of veomni-triton
# (plugins/veomni-triton/gpu/tune_*.py) and plugins/veomni-flash/gpu/check_fa4.py are run by hand.
#
# Liger's MoE autotuner runs for minutes per shape; it is switched off (LIGER_FUSED_MOE_AUTOTUNE=0,
# recorded in each result's "environment"), so Liger's MoE runs its default tile config.
set -uo pipefail
stage=${1:?usage: run_all.sh check|bench-a|bench-b|bench-c|bench-d}
R=${RESULTS:-gpu-results}
mkdir -p "$R"
export LIGER_FUSED_MOE_AUTOTUNE=0 PYTHONUNBUFFERED=1
T=${STAGE_TIMEOUT:-500}
BENCH=(--rep-ms 100 --warmup-ms 25 --quiet)

case $stage in
check)
  # Two streams (seven processes at once ran the GPU out of memory); the float64 references of
  # the full-size cases are large.
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  veomni-ops plugins >"$R/plugins.txt" 2>&1
  EXTRA=()
  if [ -n "${COMPILE:-}" ]; then EXTRA=(--compile); fi
  one() {
    timeout "$T" veomni-ops check --backend "$1" --seed 20261121 "${EXTRA[@]}" --json >"$R/check-$1.json" \
      2>"$R/check-$1.log"
    echo "$1 exit $?" >>"$R/check-exit.txt"
  }
  (one veomni-ops; one veomni-flash) &
  (one veomni-triton; one veomni-liger; one veomni-quack) &
  wait
  cat "$R/check-exit.txt"
  ;;
bench-a)
  timeout "$T" veomni-ops bench --preset seed --preset lbl-48 --preset attn --preset attn-30b-a3b "${BENCH[@]}" \
    --json "$R/bench-a.json" 2>&1 | tee "$R/bench-a.log"
  ;;
bench-b)
  timeout "$T" veomni-ops bench --preset moe-30b-a3b --preset flce-8k --preset flce-16k --preset flce-32k \
    "${BENCH[@]}" --json "$R/bench-b.json" 2>&1 | tee "$R/bench-b.log"
  ;;
bench-c)
  timeout "$T" veomni-ops bench --preset rope-qwen35 --preset lbl-48-masked --preset host "${BENCH[@]}" \
    --json "$R/bench-c.json" 2>&1 | tee "$R/bench-c.log"
  ;;
bench-d)
  timeout "$T" veomni-ops bench --preset flce-8k-dense --preset flce-16k-dense --preset flce-32k-dense \
    --op cross_entropy "${BENCH[@]}" --json "$R/bench-d.json" 2>&1 | tee "$R/bench-d.log"
  ;;
*)
  echo "unknown stage $stage (check, bench-a, bench-b, bench-c)" >&2
  exit 2
  ;;
esac
