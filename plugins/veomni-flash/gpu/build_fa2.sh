#!/usr/bin/env bash
# Build FlashAttention-2 (flash-attn 2.8.3.post2, the PyPI sdist) into a wheel on a CUDA machine,
# for Hopper (sm90) only, against the torch that `python3` imports. No network is needed.
#
#   pip download --no-deps --no-build-isolation --no-binary=:all: flash-attn==2.8.3.post2 -d .   # anywhere
#   # (with FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE where the metadata step has no CUDA)
#   plugins/veomni-flash/gpu/build_fa2.sh flash_attn-2.8.3.post2.tar.gz [WORK_DIR] [WHEEL_DIR]
#   pip install --no-deps WHEEL_DIR/flash_attn-2.8.3.post2-*.whl
#
# WORK_DIR (default build/fa2) keeps the unpacked sources and ninja's objects: stopped early
# (FA2_BUILD_SECONDS, default no limit, sends SIGINT; ninja keeps every finished object), the same
# command resumes where it stopped. WHEEL_DIR defaults to build/wheels.
#
# What differs from a plain `pip install flash-attn`:
#   FLASH_ATTN_CUDA_ARCHS=90     sm90 only (default: 80;90;100;120, four times the work)
#   -DFLASHATTENTION_DISABLE_ALIBI  one of setup.py's own commented-out switches: no ALiBi kernels
#                                (veomni-flash never passes alibi_slopes; the library then refuses
#                                them with "This flash attention build does not support alibi.")
#   MAX_JOBS=16 NVCC_THREADS=1   one nvcc per core (--threads only splits work across archs)
#   FLASH_ATTENTION_FORCE_BUILD=TRUE  no attempt to download a prebuilt wheel
# Everything else (dropout, causal, sliding window, softcap, uneven head dims, split-KV, every head
# dim 32..256, fp16 and bf16, backward) is built as released.
# Measured on one H100 machine (16 cores, nvcc 13.0, torch 2.11.0+cu130): see
# benchmarks/results/h100-2026-11-26-flash/README.md.
set -euo pipefail
SDIST=$(realpath "${1:?usage: build_fa2.sh flash_attn-VERSION.tar.gz [WORK_DIR] [WHEEL_DIR]}")
WORK=${2:-build/fa2}
OUT=${3:-build/wheels}
mkdir -p "$WORK" "$OUT"
WORK=$(realpath "$WORK")
OUT=$(realpath "$OUT")
SRC="$WORK/$(basename "$SDIST" .tar.gz)"
if [ ! -d "$SRC" ]; then
  tar xzf "$SDIST" -C "$WORK"
fi
cd "$SRC"
sed -i 's|# "-DFLASHATTENTION_DISABLE_ALIBI",|"-DFLASHATTENTION_DISABLE_ALIBI",|' setup.py
grep -q '^ *"-DFLASHATTENTION_DISABLE_ALIBI",' setup.py || { echo "setup.py: ALiBi switch not found" >&2; exit 2; }
export FLASH_ATTN_CUDA_ARCHS=${FLASH_ATTN_CUDA_ARCHS:-90}
export MAX_JOBS=${MAX_JOBS:-16}
export NVCC_THREADS=${NVCC_THREADS:-1}
export FLASH_ATTENTION_FORCE_BUILD=TRUE
echo "build_fa2: $(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'); $(nvcc --version | tail -1)"
echo "build_fa2: archs $FLASH_ATTN_CUDA_ARCHS, MAX_JOBS $MAX_JOBS, NVCC_THREADS $NVCC_THREADS, in $SRC"
start=$(date +%s)
set +e
timeout -s INT "${FA2_BUILD_SECONDS:-0}" python3 setup.py bdist_wheel -d "$OUT"
rc=$?
set -e
echo "build_fa2: exit $rc after $(( $(date +%s) - start )) s; objects: $(find build -name '*.o' 2>/dev/null | wc -l)"
ls -la "$OUT"/flash_attn-*.whl 2>/dev/null || true
exit $rc
