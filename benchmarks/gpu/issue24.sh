#!/usr/bin/env bash
# Issue 24 on one CUDA GPU: the peaked fused-loss bench beside its peers, the whole step against
# transformers + torch.compile, and a tuned plan lock beside the static auto. From a checkout's
# root, with liger-kernel and cut-cross-entropy wheels carried in $WHL (default .whl/peers):
#   bash benchmarks/gpu/issue24.sh STEP...
# installs $WHL/*.whl, core/, plugins/veomni-triton/ and plugins/veomni-liger/ (all --no-deps: the
# machine's torch, transformers and triton stay) into /tmp/site-i24 and runs each STEP, writing into
# $OUT/i24/ (default OUT=./gpu-results). Steps:
#   flce             veomni-ops bench --preset flce-{8k,16k,32k} --op cross_entropy (peaked logits)
#   flce-dense       the same on the -dense stress presets
#   step:NAME        veomni-ops train examples/NAME.yaml --baseline transformers+compile --json
#   tune:NAME        veomni-ops tune examples/NAME.yaml --out $OUT/i24/lock-NAME.json --json
#   lockstep:NAME    veomni-ops train examples/NAME.yaml --lock that lock --compare examples/NAME.yaml
#                    (the tuned plan, then the static auto, same data and seed)
#   prof:NAME        benchmarks/gpu/par_profile.py examples/NAME.yaml (timed steps, then 3 profiled: where the
#                    step's time goes, e.g. a train.compile job beside transformers + compile)
#   moe              veomni-ops bench --preset moe-30b-a3b --op moe_experts (the experts goal, <= 4.5 ms fwd+bwd)
#   mem:NAME         benchmarks/gpu/step_memory.py examples/NAME.yaml: what is allocated at the peak of a recorded step,
#                    ours beside transformers+compile (3 warm-up steps, MEM_TIMEOUT s a run, default 90)
# A step is skipped once fewer than 60 s are left of DEADLINE (epoch seconds; default now + 540).
# STEPS (default 30): training steps of each train run.
set -u
OUT=${OUT:-$PWD/gpu-results}; RES=$OUT/i24; mkdir -p "$RES"
WHL=${WHL:-.whl/peers}
SITE=/tmp/site-i24
DEADLINE=${DEADLINE:-$(( $(date +%s) + 540 ))}
STEPS=${STEPS:-30}
if [ ! -f "$SITE/.done" ]; then
  for w in liger_kernel cut_cross_entropy; do
    ls "$WHL"/$w-*.whl >/dev/null 2>&1 || { echo "no $w wheel in $WHL"; exit 2; }
  done
  SRC=/tmp/src-i24; rm -rf "$SRC"; mkdir -p "$SRC"; cp -r core plugins/veomni-triton plugins/veomni-liger "$SRC/"  # see par_run.sh
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" \
    "$WHL"/*.whl "$SRC/core" "$SRC/veomni-triton" "$SRC/veomni-liger" > "$RES/install.log" 2>&1 \
    || { echo "install failed:"; tail -20 "$RES/install.log"; exit 1; }
  touch "$SITE/.done"
fi
export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1 LIGER_FUSED_MOE_AUTOTUNE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RES/gpu.txt" 2>&1
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" >> "$RES/gpu.txt" 2>&1
V="python3 -m veomni_ops.cli"
for s in "$@"; do
  left=$(( DEADLINE - $(date +%s) ))
  if [ $left -lt 60 ]; then echo "[i24] skip $s ($left s left)"; continue; fi
  t0=$(date +%s); n=${s#*:}
  case $s in
    flce|flce-dense) sfx=${s#flce}
      timeout $((left - 5)) $V bench --preset flce-8k$sfx --preset flce-16k$sfx --preset flce-32k$sfx --op cross_entropy \
        --rep-ms 100 --warmup-ms 25 --quiet --json "$RES/bench-$s.json" > "$RES/bench-$s.out" 2> "$RES/bench-$s.log"
      tail -40 "$RES/bench-$s.out";;  # stdout; bench-$s.md is --json's own Markdown twin
    step:*) timeout $((left - 5)) $V train "examples/$n.yaml" --steps "$STEPS" --baseline transformers+compile --json \
        > "$RES/step-$n.json" 2> "$RES/step-$n.log"; tail -12 "$RES/step-$n.log";;
    tune:*) timeout $((left - 5)) $V tune "examples/$n.yaml" --out "$RES/lock-$n.json" --json \
        > "$RES/tune-$n.json" 2> "$RES/tune-$n.log"; tail -25 "$RES/tune-$n.log";;
    lockstep:*) timeout $((left - 5)) $V train "examples/$n.yaml" --steps "$STEPS" --lock "$RES/lock-$n.json" \
        --compare "examples/$n.yaml" --json > "$RES/lockstep-$n.json" 2> "$RES/lockstep-$n.log"; tail -12 "$RES/lockstep-$n.log";;
    prof:*) timeout $((left - 5)) python3 benchmarks/gpu/par_profile.py "examples/$n.yaml" --steps 14 --out "$RES" \
        > "$RES/prof-$n.log" 2>&1; grep "tok/s |" "$RES/prof-$n.log" || tail -5 "$RES/prof-$n.log";;
    mem:*) mt=${MEM_TIMEOUT:-90}; [ $((2 * mt + 30)) -gt $left ] && mt=$(( (left - 30) / 2 ))
      timeout $((left - 5)) python3 benchmarks/gpu/step_memory.py "examples/$n.yaml" --out "$RES/mem-$n" --warmup 3 \
        --timeout "$mt" --json "$RES/mem-$n.json" > "$RES/mem-$n.log" 2>&1; grep -E "^$n |^\| " "$RES/mem-$n.log" | head -60;;
    moe) timeout $((left - 5)) $V bench --preset moe-30b-a3b --op moe_experts --quiet --json "$RES/bench-moe.json" \
        > "$RES/bench-moe.out" 2> "$RES/bench-moe.log"; grep -E "fwd\+bwd" "$RES/bench-moe.out" | head;;
    *) echo "unknown step $s";;
  esac
  echo "[i24]   ($s took $(( $(date +%s) - t0 )) s)"
done
