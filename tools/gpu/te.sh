#!/usr/bin/env bash
# TransformerEngine's fused cross-entropy compiled on CUDA, one release after another, from release folders made
# with `pip install --no-deps --target DIR/<release> transformer-engine==<release>` (TE's Python files only, never
# on sys.path: the adapter reads them through NUMCHECK_TE_DIR). For each release: what `numcheck list` says of the
# TE impls there, and the linear+CE face's suite on CUDA (the vocab-parallel face needs several GPUs for P > 1).
# Usage (repo root, on the device): bash tools/gpu/te.sh RELEASES_DIR OUT [RELEASE ...]   (SUITE_S: seconds each)
set -uo pipefail
dir="${1:?folder of release folders}"; out="${2:?output dir}"; shift 2
releases=("$@"); [ ${#releases[@]} -gt 0 ] || releases=($(ls "$dir"))
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source tools/gpu/install.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/gpu.txt"
for rel in "${releases[@]}"; do
  log="$out/te-$rel.txt"
  echo "== transformer-engine $rel" | tee "$log"
  NUMCHECK_TE_DIR="$dir/$rel" python3 -m numcheck.reports.cli list --device cuda >> "$log" 2>&1
  NUMCHECK_TE_DIR="$dir/$rel" NUMCHECK_DEVICE=cuda timeout -s INT -k 10 "${SUITE_S:-100}" \
    python3 -m pytest --pyargs numcheck.tests.suite -q -p no:cacheprovider \
    --impl 'te_parallel_ce[mean]' --impl 'te_parallel_ce[none]' -k "not distributed" >> "$log" 2>&1
  echo "pytest exit $?" >> "$log"
  grep -E "passed|failed|FAILED|exit" "$log" | tail -4
done
