#!/usr/bin/env bash
# Run transformers' own model test suites (ModelTesterMixin / CausalLMModelTest) plain and with
# every model bound by veomni-ops (`veomni_ops.apply(model, {}, device="cpu")`), and compare.
# Not part of CI: see README.md beside this file.
#
#   tools/hf_suites/run.sh --git-dir DIR [--ref REF] [--sdist VERSION|none] [--work DIR] [--out DIR]
#                          [--models "qwen3 qwen3_moe llama mixtral"] [--modes "plain bound"]
#                          [--timeout SECONDS] [--python PY] [--veomni REF] [--no-assemble] [-- PYTEST_ARGS...]
#
# --git-dir  a transformers git directory (a clone's .git, or a bare mirror): tests/ come from --ref
# --ref      default: the tag v<installed transformers version>, else HEAD of --git-dir
# --sdist    overlay tests/*.py (the common mixins: test_modeling_common.py, ...) from the PyPI sdist
#            of this transformers release (default: the installed version; `none`: use --ref's only).
#            The sdist ships those files exactly as released, but not tests/models/ nor
#            tests/causal_lm_tester.py nor tests/generation/: those always come from --ref.
# --work     scratch folder the tree is assembled in (default /work/scratch/hf); never this repo
# --out      where JUnit XML, logs and binding logs go (default WORK/results-<date>)
# --veomni   bind with veomni-ops as committed at this ref of this repository (its core/src and
#            plugins/*/src exported to WORK/veomni-<sha>, put first on PYTHONPATH); default: the
#            veomni_ops that --python imports (an editable install follows its work tree as it changes)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
GIT_DIR_ARG="" REF="" VEOMNI_REF="" SDIST="installed" WORK="/work/scratch/hf" OUT="" ASSEMBLE=1
MODELS="qwen3 qwen3_moe llama mixtral" MODES="plain bound" TIMEOUT=300
PY="${VEOMNI_HF_PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python)"
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --git-dir) GIT_DIR_ARG="$2"; shift 2 ;;
    --ref) REF="$2"; shift 2 ;;
    --sdist) SDIST="$2"; shift 2 ;;
    --work) WORK="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --modes) MODES="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --veomni) VEOMNI_REF="$2"; shift 2 ;;
    --no-assemble) ASSEMBLE=0; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "run.sh: unknown argument $1 (see the head of this script)" >&2; exit 2 ;;
  esac
done
case "$(cd "$(dirname "$WORK")" 2>/dev/null && pwd)/" in
  "$REPO"/*) echo "run.sh: --work must be outside this repository ($REPO)" >&2; exit 2 ;;
esac
TF_VERSION="$("$PY" -c 'import transformers; print(transformers.__version__)')"
[ "$SDIST" = "installed" ] && SDIST="$TF_VERSION"
OUT="${OUT:-$WORK/results-$(date +%Y%m%d-%H%M%S)}"

assemble() {
  [ -n "$GIT_DIR_ARG" ] || { echo "run.sh: --git-dir is required to assemble the test tree" >&2; exit 2; }
  local g="$GIT_DIR_ARG"
  if [ -z "$REF" ]; then
    if git --git-dir="$g" rev-parse -q --verify "refs/tags/v$TF_VERSION" >/dev/null; then REF="v$TF_VERSION"
    else REF=HEAD; echo "run.sh: no tag v$TF_VERSION in $g; using HEAD" >&2; fi
  fi
  local commit; commit="$(git --git-dir="$g" rev-parse "$REF^{commit}")"
  rm -rf "$WORK/tests" "$WORK/utils" "$WORK/conftest.py" "$WORK/pyproject.toml"
  mkdir -p "$WORK"
  local paths=(conftest.py pyproject.toml tests/__init__.py tests/causal_lm_tester.py tests/generation
               tests/utils tests/models/__init__.py
               utils/test_module)
  local p
  for p in tests/exporters tests/distributed_testing_utils.py; do  # absent from older refs
    git --git-dir="$g" cat-file -e "$commit:$p" 2>/dev/null && paths+=("$p")
  done
  for m in $MODELS; do paths+=("tests/models/$m"); done
  # the top-level tests/*.py (common mixins)
  while IFS= read -r p; do paths+=("$p"); done < <(git --git-dir="$g" ls-tree --name-only "$commit" tests/ | grep -E '^tests/[^/]+\.py$')
  git --git-dir="$g" archive "$commit" "${paths[@]}" | tar -x -C "$WORK"
  local src="ref $REF ($commit)"
  if [ "$SDIST" != "none" ]; then
    local cache="$WORK/.sdist"
    mkdir -p "$cache"
    [ -f "$cache/transformers-$SDIST.tar.gz" ] ||
      "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$cache" "transformers==$SDIST"
    tar -xzf "$cache/transformers-$SDIST.tar.gz" -C "$WORK" --strip-components=1 --wildcards "transformers-$SDIST/tests/*.py"
    src="$src; tests/*.py from the transformers-$SDIST sdist"
  fi
  # tests/test_pipeline_mixin.py imports src/transformers by path, as in a source checkout: point it at
  # the installed package, the one under test.
  mkdir -p "$WORK/src" && rm -f "$WORK/src/transformers"
  ln -s "$("$PY" -c 'import os, transformers; print(os.path.dirname(transformers.__file__))')" "$WORK/src/transformers"
  git --git-dir="$g" show "$commit:src/transformers/testing_utils.py" > "$WORK/.ref_testing_utils.py"
  "$PY" "$HERE/compat.py" names "$WORK/tests" "$WORK/.ref_testing_utils.py" "$WORK/compat.json"
  local stubs; stubs="$("$PY" "$HERE/compat.py" stubs "$WORK/tests" | tr '\n' ' ')"
  [ -z "$stubs" ] || src="$src; stand-in (skipping) modules: $stubs"
  echo "$src" > "$WORK/SOURCE"
  echo "run.sh: assembled $WORK/tests from $src" >&2
}

[ "$ASSEMBLE" = 1 ] && assemble
mkdir -p "$OUT"
cp "$WORK/SOURCE" "$OUT/SOURCE"
export TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RUN_SLOW=no
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
export VEOMNI_HF_COMPAT="$WORK/compat.json"
if [ -n "$VEOMNI_REF" ]; then
  sha="$(git -C "$REPO" rev-parse --short=12 "$VEOMNI_REF^{commit}")"
  snap="$WORK/veomni-$sha"
  if [ ! -d "$snap" ]; then
    mkdir -p "$snap.part" && git -C "$REPO" archive "$sha" core/src plugins | tar -x -C "$snap.part" && mv "$snap.part" "$snap"
  fi
  for d in "$snap"/plugins/*/src "$snap/core/src"; do PYTHONPATH="$d:$PYTHONPATH"; done
  export VEOMNI_HF_REF="$VEOMNI_REF ($sha)"
fi
echo "veomni_ops: $("$PY" -c 'import veomni_ops; print(veomni_ops.__file__)') ${VEOMNI_HF_REF:-(as installed)}" >> "$OUT/SOURCE"
status=0
for m in $MODELS; do
  for mode in $MODES; do
    bind=0; [ "$mode" = bound ] && bind=1
    cmd=("$PY" -m pytest -p no:cacheprovider -p veomni_bind_plugin --timeout="$TIMEOUT" -q -rfE
         --junitxml="$OUT/$m-$mode.xml" "tests/models/$m/test_modeling_$m.py" "${EXTRA[@]}")
    echo "VEOMNI_HF_BIND=$bind ${cmd[*]}" > "$OUT/$m-$mode.cmd"
    t0=$SECONDS
    (cd "$WORK" && VEOMNI_HF_BIND=$bind VEOMNI_HF_BIND_LOG="$OUT/$m-$mode.bind.jsonl" "${cmd[@]}") \
      > "$OUT/$m-$mode.log" 2>&1 || status=$?
    echo "run.sh: $m $mode: $(tail -n 1 "$OUT/$m-$mode.log") ($((SECONDS - t0)) s)" >&2
  done
done
"$PY" "$HERE/summarize.py" "$OUT" | tee "$OUT/SUMMARY.md"
echo "run.sh: results in $OUT" >&2
exit 0
