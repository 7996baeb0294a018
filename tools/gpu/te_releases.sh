#!/usr/bin/env bash
# TransformerEngine's fused cross-entropy judged compiled on CUDA, one release per call: the CPU versions
# table (docs/evidence/te_releases.txt) runs TE's Triton kernels under the interpreter; this runs them compiled.
#
# On the device machine (torch + triton, no internet), from the repo root:
#   bash tools/gpu/te_releases.sh OUT RELEASE
# with the release's wheel carried in .wheels/te/ (ignored; a subfolder, so tools/gpu/run.sh, which installs
# .wheels/*.whl onto the path, never puts TE's incomplete package where liger-kernel's import would trip on it):
#   .wheels/te/transformer_engine-2.20.2-py3-none-any.whl   (and 2.14.0, 2.8.0 for the two older releases)
# Fetch them on a machine with internet: pip download --no-deps -d .wheels/te transformer-engine==2.20.2 ...
#
# Per call (RELEASE, default 2.20.2), each step capped so the call fits the device's 10 minutes:
#   1. the wheel's files into /tmp/te/RELEASE (pip --no-deps --no-index --target; not on sys.path), NUMCHECK_TE_DIR
#      pointing there: numcheck loads the fused CE from the files, as on the CPU;
#   2. numcheck list of the TE impls on cuda (release, loading path, declaration: on CUDA bf16 'none' is declared
#      for 2.5-2.17 too, the interpreter artifact does not apply) -> OUT/list.txt;
#   3. the property suite on the TE impls, both faces, on CUDA (the distributed tests under nccl, one GPU per rank:
#      world sizes above the GPU count are skipped with the reason; on nvidia-h200-x4 all of 1, 2, 4 run), and the
#      adapter's own tests and TE's known-divergence strict checks -> OUT/suite.txt, OUT/junit.xml (SUITE_S, 480 s).
# Commit OUT as results/te/h200-<torch>-te<RELEASE>/ (suite.txt, list.txt, junit.xml, gpu.txt).
set -uo pipefail
out="${1:?output dir}"
release="${2:-2.20.2}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PWD}"
source tools/gpu/install.sh
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.triton-cache}"
wheel=$(ls .wheels/te/transformer_engine-"$release"-py3-none-any.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  echo "no .wheels/te/transformer_engine-$release-py3-none-any.whl (pip download --no-deps -d .wheels/te" \
       "transformer-engine==$release)" | tee "$out/suite.txt"
  exit 2
fi
target="/tmp/te/$release"
rm -rf "$target"
python3 -m pip install -q --no-deps --no-index --target "$target" "$wheel" > "$out/install.txt" 2>&1 || {
  cat "$out/install.txt"; exit 2; }
export NUMCHECK_TE_DIR="$target"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "transformer-engine $release from $wheel into $target"; } > "$out/gpu.txt" 2>&1
impls=(--impl "te_parallel_ce[mean]" --impl "te_parallel_ce[none]" --impl "te_parallel_ce[mean,overwrite_input]"
       --impl "te_vocab_parallel[mean]" --impl "te_vocab_parallel[none]")
python3 -m numcheck.reports.cli list --device cuda "${impls[@]}" > "$out/list.txt" 2>&1
start=$(date +%s)
# -v: each verdict as it finishes, so a run cut short still names its failures.
NUMCHECK_DEVICE=cuda NUMCHECK_DIST_BACKEND=nccl timeout -s INT -k 15 "${SUITE_S:-480}" python3 -m pytest \
  tests/suite tests/adapters/test_transformer_engine.py \
  tests/adapters/test_known_divergences.py -k "te_parallel_ce or te_vocab_parallel or transformer_engine" \
  "${impls[@]}" -v -rs -n "${WORKERS:-8}" -p no:cacheprovider -p no:benchmark \
  --junitxml="$out/junit.xml" > "$out/suite.txt" 2>&1
echo "pytest exit $? after $(( $(date +%s) - start )) s on $(nvidia-smi -L | wc -l) GPU(s)" >> "$out/suite.txt"
head -3 "$out/list.txt"; grep -E "FAILED|ERROR" "$out/suite.txt" | tail -30; tail -3 "$out/suite.txt"
