#!/usr/bin/env bash
# Build FlashAttention-3 (flash-attn-3, `hopper/` of the flash-attention repository) into a wheel on
# a CUDA machine, trimmed to what a bf16 Hopper training run calls, so that it fits short jobs.
# No network is needed. NOT YET RUN TO THE END: see benchmarks/results/h100-2026-11-26-flash/README.md.
#
#   git -C flash-attention archive -o fa3-hopper.tar COMMIT hopper              # anywhere, from clones
#   git -C cutlass archive COMMIT_OF_csrc/cutlass include | tar x -C cutlass-src   # the submodule's pin
#   plugins/veomni-flash/gpu/build_fa3.sh fa3-hopper.tar cutlass-src [WORK_DIR] [WHEEL_DIR]
#   pip install --no-deps WHEEL_DIR/flash_attn_3-*.whl
#
# CUTLASS_DIR must hold include/ of CUTLASS at the commit flash-attention pins as csrc/cutlass (v2.8.3:
# dc48179; main 0251105a, FA3 3.0.0: 7127592) with its *.inl files: the flash-attn 2.x sdist's
# csrc/cutlass does NOT do (its MANIFEST.in takes .h/.hpp/.cuh only, and FA3's mainloops include
# cutlass/gemm/collective/builders/sm90_common.inl: the 2026-11-26 attempt stopped there). veomni-flash
# requires flash-attn-3>=3.0.0: hopper/ of v2.8.3 is 3.0.0b1 (refused), main's is 3.0.0.
# WORK_DIR (default build/fa3) keeps ninja's objects: rerunning resumes (FA3_BUILD_SECONDS stops
# early with SIGINT). WHEEL_DIR defaults to build/wheels.
#
# hopper/setup.py's own switches (environment variables) choose what is built; this recipe keeps
# hdim 128, bf16, sm90a, forward and backward, causal, sliding window (local), softcap, varlen and
# the cluster kernels, and leaves out (each then refused by flash_api.cpp with a "does not support"
# error, not run wrongly): fp16 and fp8, head dims 64/96/192/256, split-KV, paged KV, append-KV
# (kv-cache decoding), PackGQA (a decoding heuristic) and the sm80 kernels. Other settings:
#   FLASH_ATTENTION_OFFLINE_BUILD=TRUE  no downloads; v2.8.3's setup.py also switches to a downloaded
#                                       nvcc 12.6 / ptxas 12.8 unless nvcc is 12.8: patched to keep the
#                                       machine's nvcc when offline (main's setup.py already does for 13.x)
#   --split-compile=$NVCC_SPLIT (4)     setup.py's own commented-out flag: the backward file is one
#                                       long nvcc, split so that it finishes inside a job
set -euo pipefail
HOPPER_TAR=$(realpath "${1:?usage: build_fa3.sh fa3-hopper.tar CUTLASS_DIR [WORK_DIR] [WHEEL_DIR]}")
CUTLASS_DIR=$(realpath "${2:?CUTLASS_DIR: CUTLASS at the pinned commit, with include/}")
WORK=${3:-build/fa3}
OUT=${4:-build/wheels}
mkdir -p "$WORK" "$OUT"
WORK=$(realpath "$WORK")
OUT=$(realpath "$OUT")
test -f "$CUTLASS_DIR/include/cutlass/cutlass.h" || { echo "no include/cutlass in $CUTLASS_DIR" >&2; exit 2; }
test -f "$CUTLASS_DIR/include/cutlass/gemm/collective/builders/sm90_common.inl" || {
  echo "$CUTLASS_DIR has no .inl headers (a flash-attn sdist's csrc/cutlass?): FA3 needs CUTLASS's own include/" >&2
  exit 2; }
if [ ! -d "$WORK/hopper" ]; then
  tar xf "$HOPPER_TAR" -C "$WORK"
  mkdir -p "$WORK/csrc"
  ln -sfn "$CUTLASS_DIR" "$WORK/csrc/cutlass"
  echo "FlashAttention-3 (hopper/ of flash-attention), built by veomni-flash's build_fa3.sh" >"$WORK/README.md"
fi
cd "$WORK/hopper"
NVCC_SPLIT=${NVCC_SPLIT:-4}
# the offline switch skips the downloads but not the PATH/PYTORCH_NVCC switch to them: keep the machine's nvcc
sed -i 's|    if bare_metal_version != Version("12.8"):|    if bare_metal_version != Version("12.8") and not is_offline_build():|' setup.py
sed -i "s|# f\"--split-compile={os.getenv('NVCC_THREADS', '4')}\",|f\"--split-compile=$NVCC_SPLIT\",|" setup.py
export FLASH_ATTENTION_OFFLINE_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE
export FLASH_ATTENTION_DISABLE_FP16=TRUE FLASH_ATTENTION_DISABLE_FP8=TRUE
export FLASH_ATTENTION_DISABLE_HDIM64=TRUE FLASH_ATTENTION_DISABLE_HDIM96=TRUE
export FLASH_ATTENTION_DISABLE_HDIM192=TRUE FLASH_ATTENTION_DISABLE_HDIM256=TRUE
export FLASH_ATTENTION_DISABLE_SPLIT=TRUE FLASH_ATTENTION_DISABLE_PAGEDKV=TRUE FLASH_ATTENTION_DISABLE_APPENDKV=TRUE
export FLASH_ATTENTION_DISABLE_PACKGQA=TRUE FLASH_ATTENTION_DISABLE_SM80=TRUE
export MAX_JOBS=${MAX_JOBS:-8} NVCC_THREADS=${NVCC_THREADS:-1}
echo "build_fa3: $(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'); $(nvcc --version | tail -1)"
echo "build_fa3: version $(grep __version__ __init__.py), MAX_JOBS $MAX_JOBS, split-compile $NVCC_SPLIT, in $PWD"
start=$(date +%s)
set +e
timeout -s INT "${FA3_BUILD_SECONDS:-0}" python3 setup.py bdist_wheel -d "$OUT"
rc=$?
set -e
echo "build_fa3: exit $rc after $(( $(date +%s) - start )) s; objects: $(find build -name '*.o' 2>/dev/null | wc -l)"
ls -la "$OUT"/flash_attn_3-*.whl 2>/dev/null || true
exit $rc
