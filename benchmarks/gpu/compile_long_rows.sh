#!/usr/bin/env bash
# Issue 35, compile at long rows, on one CUDA GPU: the job examples/qwen3-30b-a3b-4layers-auto-compile.yaml
# (Qwen3-30B-A3B shapes, 4 layers, bf16, every op auto) at a given batch x seq_len, eager and compiled,
# with this checkout's veomni-ops ("new") and, where OLD_CORE names one, another checkout's core/
# ("old": the code before a change), each with plugins/veomni-triton. From a checkout's root:
#   OLD_CORE=path/to/old/core bash benchmarks/gpu/compile_long_rows.sh RUN...
# RUN (each a `veomni-ops train JOB --json` of its own, JOB the example with batch_size B, seq_len S):
#   eager:B:S      train.compile false, new code
#   new:B:S        train.compile true, new code          old:B:S   the same with the old code
#   prof-new:S     benchmarks/gpu/par_profile.py on the same job with 1 layer, batch 1, seq_len S,
#                  compiled (3 timed steps, 1 profiled: the profiler's top-kernel table names the
#                  attention kernels: flash or efficient attention)        prof-old:S   old code
# Results go to $OUT/clr/ (default OUT=./gpu-results): per run NAME.json (stdout), NAME.log (stderr);
# summary.md at the end (tok/s and peak memory of each run, as each job's own report gives them).
# A run is skipped once fewer than 75 s are left of DEADLINE (epoch seconds; default now + 560).
# STEPS (default 8): training steps of each train run.
set -u
OUT=${OUT:-$PWD/gpu-results}; RES=$OUT/clr; mkdir -p "$RES"
DEADLINE=${DEADLINE:-$(( $(date +%s) + 560 ))}
STEPS=${STEPS:-8}
OLD_CORE=${OLD_CORE:-}
export PYTHONUNBUFFERED=1
install() {  # install DIR CORE: CORE and plugins/veomni-triton, --no-deps (the machine's torch, transformers, triton stay)
  [ -f "$1/.done" ] && return 0
  local src=/tmp/src-$(basename "$1"); rm -rf "$src"; mkdir -p "$src"; cp -r "$2" plugins/veomni-triton "$src/"
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$1" \
    "$src/$(basename "$2")" "$src/veomni-triton" > "$RES/install-$(basename "$1").log" 2>&1 \
    || { echo "install $1 failed:"; tail -20 "$RES/install-$(basename "$1").log"; exit 1; }
  touch "$1/.done"
}
install /tmp/clr-new core
[ -n "$OLD_CORE" ] && install /tmp/clr-old "$OLD_CORE"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RES/gpu.txt" 2>&1
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" >> "$RES/gpu.txt" 2>&1
job() {  # job NAME B S COMPILE LAYERS: examples/NAME.yaml, a variant of the example (its config_file beside it)
  python3 - "$@" <<'EOF'
import sys, yaml
name, b, s, comp, layers = sys.argv[1:6]
job = yaml.safe_load(open("examples/qwen3-30b-a3b-4layers-auto-compile.yaml"))
job["train"].update(batch_size=int(b), seq_len=int(s), compile=comp == "1")
if layers != "-":
    job["model"]["config"]["num_hidden_layers"] = int(layers)
yaml.safe_dump(job, open(f"examples/{name}.yaml", "w"))
EOF
}
for r in "$@"; do
  left=$(( DEADLINE - $(date +%s) ))
  if [ $left -lt 75 ]; then echo "[clr] skip $r ($left s left)"; continue; fi
  t0=$(date +%s); IFS=: read -r kind b s <<< "$r"
  case $kind in
    eager|new) site=/tmp/clr-new;; old|prof-old) site=/tmp/clr-old;; prof-new) site=/tmp/clr-new;;
    *) echo "unknown run $r"; continue;;
  esac
  [ -f "$site/.done" ] || { echo "[clr] skip $r: no $site (OLD_CORE unset?)"; continue; }
  case $kind in
    prof-*) s=$b; name=$kind-$s; job "clr-$name" 1 "$s" 1 1
      PYTHONPATH=$site timeout $((left - 5)) python3 benchmarks/gpu/par_profile.py "examples/clr-$name.yaml" --steps 3 \
        --profile-steps 1 --out "$RES" --name "$name" > "$RES/$name.log" 2>&1
      grep "tok/s |" "$RES/$name.log" || tail -5 "$RES/$name.log"
      grep -iE "flash|fmha|efficient|attention|sdpa" "$RES/$name.r0.table.txt" 2>/dev/null | head -6;;
    *) name=$kind-$b-$s; job "clr-$name" "$b" "$s" "$([ "$kind" = eager ] && echo 0 || echo 1)" -
      PYTHONPATH=$site PATH=$site/bin:$PATH timeout $((left - 5)) python3 -m veomni_ops.cli train "examples/clr-$name.yaml" \
        --steps "$STEPS" --json > "$RES/$name.json" 2> "$RES/$name.log"
      grep -E "^torch.compile|^done:|Error|error:" "$RES/$name.log" | tail -4;;
  esac
  echo "[clr]   ($r took $(( $(date +%s) - t0 )) s)"
done
python3 - "$RES" > "$RES/summary.md" <<'EOF'
import glob, json, os, sys
print("| run | batch x seq | tok/s (median, steady steps) | p25..p75 | peak GiB | compiled |")
print("|---|---|---|---|---|---|")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try:
        r = json.load(open(f))
    except ValueError:
        continue
    if "tokens_per_s_p25" not in r:
        continue
    print(f"| {os.path.basename(f)[:-5]} | {r['batch_size']} x {r['seq_len']} | {r['tokens_per_s']:.0f} | "
          f"{r['tokens_per_s_p25']:.0f}..{r['tokens_per_s_p75']:.0f} | {r['peak_gib']:.2f} | "
          f"{(r.get('compile') or {}).get('what', 'whole model') if r['compiled'] else 'no'} |")
EOF
cat "$RES/summary.md"
