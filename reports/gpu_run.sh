#!/usr/bin/env bash
# The GPU tier, as run on the device machine (H200, torch 2.11, triton 3.6; nothing installable there):
# the property suite on CUDA, then the benchmark. Liger-Kernel comes as a carried wheel (.wheels/).
# Usage (from the repo root on the device): bash reports/gpu_run.sh suite|bench|all "$OUT"
# ("all" fits both in one 10-minute call: suite capped at 300 s, bench at 260 s).
set -uo pipefail
what="${1:?suite or bench}"
out="${2:?output dir}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PWD}"
if ls .wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/carried .wheels/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/carried"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/gpu.txt"
case "$what" in
  suite)
    python3 -m reports.cli list --device cuda --probes > "$out/list.txt" 2>&1
    NUMCHECK_DEVICE=cuda timeout "${SUITE_S:-540}" python3 -m pytest tests -q -n 8 -p no:cacheprovider \
      --junitxml="$out/junit.xml" --maxfail=200 > "$out/suite.txt" 2>&1
    echo "pytest exit $?" >> "$out/suite.txt"
    tail -40 "$out/suite.txt"
    ;;
  bench)
    timeout "${BENCH_S:-560}" python3 -m reports.cli bench --rep-ms "${REP_MS:-400}" --out "$out" 2>&1 | tee "$out/bench.txt" | tail -40
    ;;
  all)
    SUITE_S=300 bash "$0" suite "$out" > /dev/null 2>&1
    BENCH_S=260 REP_MS=150 bash "$0" bench "$out" > /dev/null 2>&1
    tail -12 "$out/suite.txt"; tail -25 "$out/bench.txt"
    ;;
esac
