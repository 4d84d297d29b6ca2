#!/usr/bin/env bash
# Build our distributions into .whl/ours (carried to the GPU machine by benchmarks/gpu/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl/ours && mkdir -p .whl/ours
for d in ./core ./plugins/*/; do
  python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl/ours "$d" >/dev/null
done
ls .whl/ours
