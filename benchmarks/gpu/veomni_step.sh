#!/usr/bin/env bash
# Issue 25: the training step of a VeOmni-built model beside VeOmni's own kernel selection, on one
# GPU (benchmarks/gpu/veomni_step.py; benchmarks/gpu/README.md says what to carry). From a
# checkout's root on a CUDA machine, with veomni and liger-kernel wheels carried in $WHL:
#   bash benchmarks/gpu/veomni_step.sh [veomni_step.py flags, e.g. --steps 30 --runs a,e,b,c,d]
# installs those wheels and the checkout's core/ and plugins/*/ (all --no-deps: the machine's own
# torch, transformers, triton and psutil stay) into /tmp/site-veomni-step, runs the script with
# --device cuda --size small, and leaves runs.jsonl, table.md and the logs in $OUT/veomni-step/,
# also packed as $OUT/veomni-step.tgz. Exit status: the script's (1: a run failed, or b's loss
# check against VeOmni's eager path did not pass).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-results}; RES=$OUT/veomni-step; mkdir -p "$RES"
WHL=${WHL:-.whl/veomni}
SITE=/tmp/site-veomni-step
if [ ! -f "$SITE/.done" ]; then
  for w in veomni-0.1.12 liger_kernel; do
    ls "$WHL"/$w-*.whl >/dev/null 2>&1 || { echo "no $w wheel in $WHL: download it as benchmarks/gpu/README.md says and carry $WHL"; exit 2; }
  done
  SRC=/tmp/src-veomni-step; rm -rf "$SRC"; mkdir -p "$SRC"; cp -r core plugins "$SRC/"  # see par_run.sh
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" \
    "$WHL"/*.whl "$SRC/core" "$SRC"/plugins/*/ > "$RES/install.log" 2>&1 || { echo "install failed:"; tail -20 "$RES/install.log"; exit 1; }
  touch "$SITE/.done"
fi
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1 LIGER_FUSED_MOE_AUTOTUNE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RES/gpu.txt" 2>&1
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" >> "$RES/gpu.txt" 2>&1
# Each run gets 110 s (five runs fit a 10-minute call); a later --timeout overrides it.
python3 benchmarks/gpu/veomni_step.py --device cuda --size small --timeout 110 --out "$RES" "$@" 2> "$RES/stderr.log"
rc=$?
cat "$RES/gpu.txt"; grep -E "^run .*: (SKIPPED|FAILED)|^failed runs" "$RES/stderr.log"
tar -czf "$OUT/veomni-step.tgz" -C "$OUT" veomni-step
exit $rc
