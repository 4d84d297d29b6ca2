#!/usr/bin/env bash
# Issue 33 on one CUDA GPU: the fused loss's chunk budget (kernel sweep, errors against float64 beside
# the peers', the step at each budget). From a checkout's root, with liger-kernel and
# cut-cross-entropy wheels in $WHL (default .whl/peers; issue24.sh installs them):
#   bash benchmarks/gpu/issue33.sh STEP...
# Steps (each writes into $OUT/i33/, default OUT=./gpu-results):
#   sweep:H:T[,T]     tune_flce.py --hidden H --tokens T... --chunks 1024 2048 4096 8192 (ours, Liger, CCE, eager)
#   errors:H:T        tune_flce.py --hidden H --errors T (loss, dH, dW against float64, every implementation)
#   step:MIB:NAME     issue24.sh step:NAME with VEOMNI_TRITON_FLCE_CHUNK_MIB=MIB (MIB "default": unset)
#   mem:NAME / prof:NAME / moe   issue24.sh's steps of those names
#   check:OP          veomni-ops check --backend veomni-triton --op OP, then the plugin's tests of OP on the GPU
#   bench:PRESET:OP   veomni-ops bench --preset PRESET --op OP (every usable kernel of OP, eager included)
#   compare:A:B       veomni-ops train examples/A.yaml --compare examples/B.yaml --json (same seed and data; A runs
#                     first: compare:A:A and compare:B:A measure what the order alone does)
#   tma               plugins/veomni-triton/gpu/moe_tma.py: the experts' weight-gradient and dh GEMMs through TMA on gathered rows
#   host              benchmarks/gpu/host_time.py: host time per call of the fusions' wrappers beside eager's
# A step is skipped once fewer than 60 s are left of DEADLINE (epoch seconds; default now + 540).
set -u
OUT=${OUT:-$PWD/gpu-results}; RES=$OUT/i33; mkdir -p "$RES"
export DEADLINE=${DEADLINE:-$(( $(date +%s) + 540 ))}
export STEPS=${STEPS:-20}
OUT="$OUT" bash benchmarks/gpu/issue24.sh >/dev/null   # installs into /tmp/site-i24 (no steps)
export PYTHONPATH=/tmp/site-i24 PATH=/tmp/site-i24/bin:$PATH PYTHONUNBUFFERED=1
T="python3 plugins/veomni-triton/gpu/tune_flce.py"
for s in "$@"; do
  left=$(( DEADLINE - $(date +%s) ))
  if [ $left -lt 60 ]; then echo "[i33] skip $s ($left s left)"; continue; fi
  t0=$(date +%s)
  IFS=: read -r kind a b <<< "$s"
  case $kind in
    sweep) timeout $((left - 5)) $T --hidden "$a" --tokens ${b//,/ } --chunks 1024 2048 4096 8192 \
             --only triton liger cce eager --json "$RES/sweep-h$a-t${b//,/-}.json" > "$RES/sweep-h$a-t${b//,/-}.log" 2>&1
           grep -v Warning "$RES/sweep-h$a-t${b//,/-}.log" | tail -30;;
    errors) timeout $((left - 5)) $T --hidden "$a" --errors "$b" --tokens --json "$RES/errors-h$a-t$b.json" \
             > "$RES/errors-h$a-t$b.log" 2>&1; tail -12 "$RES/errors-h$a-t$b.log";;
    step) mib=$a; sub=$RES/step-mib-$mib
          if [ "$mib" = default ]; then env -u VEOMNI_TRITON_FLCE_CHUNK_MIB OUT=$sub bash benchmarks/gpu/issue24.sh "step:$b"
          else VEOMNI_TRITON_FLCE_CHUNK_MIB=$mib OUT=$sub bash benchmarks/gpu/issue24.sh "step:$b"; fi;;
    mem|prof|moe) OUT=$RES bash benchmarks/gpu/issue24.sh "$s";;
    check) timeout $((left - 5)) python3 -m veomni_ops.cli check --backend veomni-triton --op "$a" > "$RES/check-$a.log" 2>&1
           tail -8 "$RES/check-$a.log"
           (cd plugins/veomni-triton && timeout $((left - 5)) python3 -m pytest -q -p no:cacheprovider tests -k "${a#moe_}" \
             > "$RES/pytest-$a.log" 2>&1); tail -3 "$RES/pytest-$a.log";;
    bench) timeout $((left - 5)) python3 -m veomni_ops.cli bench --preset "$a" --op "$b" --quiet --json "$RES/bench-$a.json" \
             > "$RES/bench-$a.out" 2> "$RES/bench-$a.log"; grep -E "^\| $b" "$RES/bench-$a.out" | cut -c1-220;;
    compare) timeout $((left - 5)) python3 -m veomni_ops.cli train "examples/$a.yaml" --steps "$STEPS" --compare "examples/$b.yaml" \
             --json > "$RES/compare-$a-vs-$b.json" 2> "$RES/compare-$a-vs-$b.log"; grep "^done:" "$RES/compare-$a-vs-$b.log";;
    tma) timeout $((left - 5)) python3 plugins/veomni-triton/gpu/moe_tma.py --json "$RES/moe-tma.json" \
           > "$RES/moe-tma.log" 2>&1; tail -40 "$RES/moe-tma.log";;
    host) timeout $((left - 5)) python3 benchmarks/gpu/host_time.py --json "$RES/host.json" > "$RES/host.log" 2>&1
          tail -6 "$RES/host.log";;
    *) echo "unknown step $s";;
  esac
  echo "[i33]   ($s took $(( $(date +%s) - t0 )) s)"
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RES/gpu.txt" 2>&1
tar czf "$OUT/i33.tgz" -C "$OUT" i33
