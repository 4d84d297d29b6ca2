#!/usr/bin/env bash
# Build this backend into a wheel, install it into the CURRENT environment beside an installed
# veomni-ops, and prove it works as a third-party backend:
#   1. its own tests (conformance base class + discovery/resolution/compile tests),
#   2. `pytest --veomni-ops-backend template` (the kit's plugin, no test file needed),
#   3. `veomni-ops plugins` lists it, `veomni-ops resolve` picks it by name from a config,
#   4. `veomni-ops check --backend template` passes.
# Uninstalls what it installed afterwards (KEEP_INSTALLED=1 keeps it), and nothing else: where
# veomni-backend-template is installed already, it stops before any work, and says so.
# PYTHON selects the interpreter. Needs: veomni-ops (+ torch) and pytest installed in that
# environment; network only if setuptools/wheel are missing there (then pip builds in an
# isolated environment).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python}"
DIST="veomni-backend-template"
WORK="$(mktemp -d)"
INSTALLED=0

cleanup() {
    if [[ "$INSTALLED" == "1" && "${KEEP_INSTALLED:-0}" != "1" ]]; then
        "$PY" -m pip uninstall -y -q "$DIST" >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

command -v "$PY" >/dev/null || { echo "ci.sh: no interpreter $PY; set PYTHON=/path/to/python" >&2; exit 1; }
# Everything needed, checked before any work; every problem named at once, with its fix.
PROBLEMS="$("$PY" - "$DIST" <<'PYEOF'
import importlib.metadata as md
import importlib.util
import sys

dist, py = sys.argv[1], sys.executable
if importlib.util.find_spec("veomni_ops") is None:
    print(f"veomni-ops is not installed for {py}: install the core first ({py} -m pip install veomni-ops; "
          "from a checkout of veomni-ops: pip install -e core)")
if importlib.util.find_spec("pytest") is None:
    print(f"pytest is not installed for {py}: {py} -m pip install 'pytest>=8'")
try:
    found = md.distribution(dist)
except md.PackageNotFoundError:
    pass
else:
    print(f"{dist} {found.version} is installed for {py} already (in {found.locate_file('')}): ci.sh installs "
          f"the wheel it builds and uninstalls it afterwards, so it would replace yours and then remove it; "
          f"run ci.sh in another environment, or uninstall it first: {py} -m pip uninstall {dist}")
PYEOF
)"
if [[ -n "$PROBLEMS" ]]; then
    while IFS= read -r line; do echo "ci.sh: $line" >&2; done <<< "$PROBLEMS"
    exit 1
fi

step "build the wheel"
# From a copy, so that the build leaves nothing (build/, *.egg-info) in the source tree.
mkdir -p "$WORK/src"
(cd "$HERE" && tar --exclude=build --exclude='*.egg-info' --exclude=__pycache__ -cf - .) | tar -xf - -C "$WORK/src"
# Build offline when the environment can: setuptools >= 77 (the SPDX `license = "Apache-2.0"` form) builds wheels itself.
if "$PY" -c "
import importlib.util, setuptools
from packaging.version import Version
ok = Version(setuptools.__version__) >= Version('77')
raise SystemExit(0 if ok else 1)" 2>/dev/null; then
    "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src"
else
    "$PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
fi
WHEEL="$(ls "$WORK"/dist/veomni_backend_template-*.whl)"
echo "$WHEEL"
"$PY" - "$WHEEL" <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
eps = [n for n in names if n.endswith("entry_points.txt")]
assert eps, f"no entry_points.txt in the wheel: {names}"
text = zipfile.ZipFile(sys.argv[1]).read(eps[0]).decode()
assert "[veomni_ops.backends]" in text and "template = veomni_backend_template.specs" in text, text
print("wheel declares:", " ".join(text.split()))
PYEOF

step "install it beside veomni-ops (no dependencies pulled)"
INSTALLED=1  # from here on, what is installed is ours (it was not installed before: checked above)
"$PY" -m pip install -q --no-deps "$WHEEL"

# Everything below runs outside the source tree: the INSTALLED package is what gets imported.
cd "$WORK"

step "its own tests"
"$PY" -m pytest "$HERE/tests" -q -p no:cacheprovider --rootdir "$HERE"

step "pytest --veomni-ops-backend template (the kit's plugin)"
mkdir -p "$WORK/empty" && cd "$WORK/empty"
PLUGIN_ARGS=()
if ! "$PY" -c "
from importlib import metadata
import sys
sys.exit(0 if any(e.value == 'veomni_ops.testing.pytest_plugin' for e in metadata.entry_points(group='pytest11')) else 1)
"; then
    PLUGIN_ARGS=(-p veomni_ops.testing.pytest_plugin)
fi
"$PY" -m pytest -q -p no:cacheprovider "${PLUGIN_ARGS[@]}" --veomni-ops-backend template

step "discovered, and resolved by name from a config"
"$PY" -m veomni_ops.cli plugins | tee "$WORK/plugins.txt"
grep -q "template .*veomni-backend-template 0.1.0: loaded" "$WORK/plugins.txt"
"$PY" -m veomni_ops.cli resolve "$HERE/example-config.yaml" --json > "$WORK/plan.json"
"$PY" - "$WORK/plan.json" <<'PYEOF'
import json, sys
plan = json.load(open(sys.argv[1]))
(e,) = [e for e in plan["entries"] if e["op"] == "swiglu"]
assert (e["kernel"], e["distribution"], e["reason"]) == ("template", "veomni-backend-template", "requested by name"), e
print("swiglu ->", e["kernel"], "from", e["distribution"], e["version"], f"({e['reason']})")
PYEOF

step "veomni-ops check --backend template"
"$PY" -m veomni_ops.cli check --backend template

step "ok: veomni-backend-template builds, installs, is discovered, resolves by name and conforms"
