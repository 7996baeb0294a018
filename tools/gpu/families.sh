#!/usr/bin/env bash
# The fused linear + distillation and preference families on CUDA, as run on the device machine (one GPU, the torch
# installed there; nothing can be fetched): their shipped suite and Liger-Kernel's adapters' tests with
# NUMCHECK_DEVICE=cuda — Liger's fused JSD as compiled Triton, its chunked JSD and preference losses both eager
# (compiled=False) and as Liger runs them by default (compiled=True: the *_compiled twins, CUDA-only). Liger-Kernel
# comes as a carried wheel (.wheels/liger_kernel-*.whl, installed --no-deps into /tmp/carried).
#
# Three runs side by side, each with its own cap, so the compiles of the twins (each new shape compiles) cannot
# starve the rest, as they did in the first H100 run (its pytest stopped at the cap inside the preference suite):
#   suite.txt           the two suite modules, the twins left out (-k "not _compiled": the impl name is the test id)
#   adapters.txt        then Liger's two adapter test modules (their own tests of the twins included)
#   suite-compiled.txt  the two suite modules on the twins alone (-k _compiled)
#   twins.txt           tools/gpu/compiled_twins.py: each twin's accuracy on fixed cases, with what torch.compile did
#                       (frames, graphs, graph breaks), so every twin gets a verdict even if its drawn tests are cut
# plus gpu.txt (device, torch, triton), list.txt (numcheck list --device cuda for the two families) and junit.tgz.
# Usage (repo root, on the device; carry .wheels): bash tools/gpu/families.sh "$OUT"
#   SUITE_S (default 300), ADAPTERS_S (120), COMPILED_S (420) and TWINS_S (300) cap the runs: about 60 s of set-up
#   and 420 s of runs, inside one 600 s device call.
set -uo pipefail
out="${1:?output dir}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${NUMCHECK_SETUP_DONE:-}" ]; then
  source tools/gpu/install.sh  # numcheck, and the wheels carried in .wheels/ (into /tmp/carried)
  export NUMCHECK_SETUP_DONE=1
fi
[ -d /tmp/carried ] && export PYTHONPATH="$PYTHONPATH:/tmp/carried"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.triton-cache}"
export NUMCHECK_DEVICE="${NUMCHECK_DEVICE:-cuda}"  # cpu: a dry run of the plumbing off the device
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/gpu.txt" 2>&1
python3 -c "import liger_kernel, importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))" >> "$out/gpu.txt" 2>&1
python3 -m numcheck.reports.cli list --device cuda --probes 2>&1 \
  | grep -E "^(liger_jsd|liger_preference|linear_distill|linear_preference)" -A3 | grep -E "^[a-z]|here:" > "$out/list.txt"

SUITES="tests/suite/test_linear_distill.py tests/suite/test_linear_preference.py"
ADAPTERS="tests/adapters/test_liger_distill.py tests/adapters/test_liger_preference.py"
run_pytest() {  # name cap workers -k-expression test-files...   (an empty expression selects every test)
  local name=$1 cap=$2 workers=$3 expr=$4
  shift 4
  timeout -s INT -k 15 "$cap" python3 -m pytest "$@" ${expr:+-k "$expr"} -v -rs -n "$workers" -p no:cacheprovider \
    -p no:benchmark --junitxml="$out/junit-$name.xml" --maxfail=200 > "$out/$name.txt" 2>&1
  echo "pytest exit $?" >> "$out/$name.txt"
}
{ run_pytest suite "${SUITE_S:-300}" 6 "not _compiled" $SUITES; run_pytest adapters "${ADAPTERS_S:-120}" 4 "" $ADAPTERS; } &
run_pytest suite-compiled "${COMPILED_S:-420}" 6 "_compiled" $SUITES &
timeout -s INT -k 15 "${TWINS_S:-300}" python3 tools/gpu/compiled_twins.py > "$out/twins.txt" 2>&1
echo "compiled_twins exit $?" >> "$out/twins.txt"
wait
tar czf "$out/junit.tgz" -C "$out" $(cd "$out" && ls junit-*.xml) 2>/dev/null && rm -f "$out"/junit-*.xml
for f in suite adapters suite-compiled; do
  echo "=== $f"; grep -E "(FAILED|ERROR) " "$out/$f.txt" | head -25; tail -2 "$out/$f.txt"
done
echo "=== twins"; grep -vE "^  (Preference|Distill)Case" "$out/twins.txt" | tail -30
