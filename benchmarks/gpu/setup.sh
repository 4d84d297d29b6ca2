#!/usr/bin/env bash
# Source on a CUDA machine from the repo root: installs the carried wheels (.whl/: liger-kernel,
# einops, quack, FA4 and our own distributions built by benchmarks/gpu/build_wheels.sh) into
# /tmp/site, and the cutlass-dsl stack (one pip call, so the cu13 libs land in the same package
# folder) into /tmp/cutlass once the joined cu13 wheel is in /tmp/cu13.
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    $(ls .whl/*.whl | grep -v nvidia_cutlass) .whl/ours/*.whl || return 1
  touch /tmp/site/.done
else
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/ours/*.whl || return 1
fi
CU13=/tmp/cu13/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
if [ -f "$CU13" ] && [ ! -f /tmp/cutlass/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cutlass .whl/nvidia_cutlass*.whl "$CU13" \
    && touch /tmp/cutlass/.done
fi
export PYTHONPATH=/tmp/site:/tmp/cutlass:/tmp/cutlass/nvidia_cutlass_dsl/python_packages:/tmp/cutlass/nvidia_cutlass_dsl/dsl_packages
export PATH=/tmp/site/bin:$PATH
