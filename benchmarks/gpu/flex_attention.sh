#!/usr/bin/env bash
# The core's flex_attention kernel on a CUDA machine: its backward and compile claims, which a CPU cannot
# check (FlexAttention has no CPU backward). Run on an H100 on 2026-11-26: benchmarks/results/h100-2026-11-26-flex/.
# From the repo root; needs only torch and transformers beside what it installs from the carried
# wheels (.whl/ours: the core, built by `pip wheel --no-deps --no-build-isolation ./core`; .whl/deps:
# pytest, pluggy, iniconfig, pyyaml). Writes to $OUT (default ./gpu-results):
#   pytest.txt      core/tests/test_kernels_attention.py -k flex and the compile-claim check: forward and
#                   backward against float64, eager (compiled FlexAttention) and under torch.compile
#   check.txt       veomni-ops check --op attention --backend veomni-ops --compile -v at full shapes:
#                   flex_attention beside eager and sdpa, worst error against float64 per dtype
set -uo pipefail
R=${OUT:-gpu-results}
mkdir -p "$R"
R=$(cd "$R" && pwd)  # absolute: the pytest step runs from core/
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/ours/*.whl .whl/deps/*.whl
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} >"$R/env.txt" 2>&1
cd core
timeout "${PYTEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -rs tests/test_kernels_attention.py -k flex \
  tests/test_compile_mode.py::test_kit_verifies_the_reference_claims >"$R/pytest.txt" 2>&1
echo "pytest exit $?" >>"$R/pytest.txt"
cd ..
timeout "${CHECK_TIMEOUT:-400}" python3 -c "import sys; from veomni_ops.cli import main; sys.exit(main())" \
  check --op attention --backend veomni-ops --seed 20261126 --compile -v >"$R/check.txt" 2>&1
echo "check exit $?" >>"$R/check.txt"
