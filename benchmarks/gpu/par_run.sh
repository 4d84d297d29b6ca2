#!/usr/bin/env bash
# Issue 23 on a machine with NPROC GPUs (default 2; run from a checkout's root, which holds benchmarks/):
#   bash benchmarks/gpu/par_run.sh CODE_DIR TAG STEP...
# installs CODE_DIR's core/ and plugins/veomni-triton/ (the code to measure) into /tmp/site-TAG and
# runs each STEP with it, writing into $OUT/TAG/ (default OUT=./gpu-results). Steps:
#   cli:NAME[:FLAG...]  veomni-ops train CONFIGS/NAME.yaml --json [FLAGS joined by ':'] (torchrun over NPROC
#                     GPUs if it has parallel:), e.g. cli:dp2:--baseline:transformers+fsdp2
#   prof:NAME         benchmarks/gpu/par_profile.py CONFIGS/NAME.yaml (timed steps, then 3 profiled)
#   script[:NAME:FLAGS...]  benchmarks/gpu/fsdp2_script.py on NPROC GPUs (FLAGS joined by ':'), e.g. script:fused:--fused
#   profscript        the script, profiled
# A step is skipped once fewer than 75 s are left of DEADLINE (epoch seconds; default: now + 540).
# MASTER_PORT (default 29500): torchrun's rendezvous port.
# STEPS (default 14): training steps of every run (the median is over all but the first).
# CODE_DIR is installed once per TAG (a second call with the same TAG reuses it).
set -u
CODE=$1; TAG=$2; shift 2
OUT=${OUT:-$PWD/gpu-results}; RES=$OUT/$TAG; mkdir -p "$RES"
CFG=${CFG:-benchmarks/results/h200x2-2026-11-26-parallel/configs}   # the job YAMLs (NAME.yaml)
NPROC=${NPROC:-2}
DEADLINE=${DEADLINE:-$(( $(date +%s) + 540 ))}
SITE=/tmp/site-$TAG
STEPS=${STEPS:-14}
if [ ! -f "$SITE/.done" ]; then
  # built from a copy: setuptools writes build/ into the source, and two installs at once collide there
  SRC=/tmp/src-$TAG; rm -rf "$SRC"; mkdir -p "$SRC"; cp -r "$CODE/core" "$CODE/plugins/veomni-triton" "$SRC/"
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" \
    "$SRC/core" "$SRC/veomni-triton" > "$RES/install.log" 2>&1 || { echo "install failed"; cat "$RES/install.log"; exit 1; }
  touch "$SITE/.done"
fi
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# MASTER_PORT: two par_run.sh at once on one host need two ports (torchrun's default 29500 collides)
TR="python3 -m torch.distributed.run --nproc-per-node $NPROC --master-port ${MASTER_PORT:-29500}"
for s in "$@"; do
  left=$(( DEADLINE - $(date +%s) ))
  if [ $left -lt 75 ]; then echo "[$TAG] skip $s ($left s left)"; continue; fi
  t0=$(date +%s)
  case $s in
    cli:*) IFS=: read -r _ n flags <<< "$s"; flags=${flags//:/ }; key=$n${flags:+_${flags//[^a-z0-9]/}}
           if grep -q '^parallel:' "$CFG/$n.yaml"; then run="$TR -m veomni_ops.cli"; else run="python3 -m veomni_ops.cli"; fi
           timeout $((left - 10)) $run train "$CFG/$n.yaml" --steps "$STEPS" --json $flags > "$RES/cli-$key.json" 2> "$RES/cli-$key.log"
           # one run: its fields; with --baseline/--compare: a "runs" list, one line each
           python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(f\"[$TAG] cli:$key {r.get('run')}: {r['tokens_per_s']:.0f} tok/s, peak {r['peak_gib']:.2f} GiB, final loss {r['final_loss']:.4f}\") for r in d.get('runs', [d])]" "$RES/cli-$key.json" || tail -5 "$RES/cli-$key.log";;
    prof:*) n=${s#prof:}; if grep -q '^parallel:' "$CFG/$n.yaml"; then run=$TR; else run=python3; fi
           timeout $((left - 10)) $run benchmarks/gpu/par_profile.py "$CFG/$n.yaml" --steps "$STEPS" --out "$RES" > "$RES/prof-$n.log" 2>&1
           grep "tok/s |" "$RES/prof-$n.log" | sed "s/^/[$TAG] prof:/" || tail -5 "$RES/prof-$n.log";;
    script*) IFS=: read -r _ n flags <<< "$s"; n=${n:-script}; flags=${flags//:/ }
           timeout $((left - 10)) $TR benchmarks/gpu/fsdp2_script.py --steps "$STEPS" --name "$n" $flags > "$RES/$n.json" 2> "$RES/$n.log"
           python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(f\"[$TAG] $n {d['tokens_per_s']:.0f} tok/s, peak {d['peak_gib']:.2f} GiB\")" "$RES/$n.json" || tail -5 "$RES/$n.log";;
    profscript) timeout $((left - 10)) $TR benchmarks/gpu/fsdp2_script.py --steps "$STEPS" --name script --profile "$RES" > "$RES/prof-script.log" 2>&1
           tail -1 "$RES/prof-script.log" | cut -c1-200 | sed "s/^/[$TAG] profscript: /";;
    *) echo "unknown step $s";;
  esac
  echo "[$TAG]   ($s took $(( $(date +%s) - t0 )) s)"
done
