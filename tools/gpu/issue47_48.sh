#!/usr/bin/env bash
# One device call for issues 47 and 48: torchao's FP8 paths (tools/gpu/torchao.sh) and the distillation and
# preference families with Liger compiled (tools/gpu/families.sh), side by side (16 cores, one GPU), numcheck
# installed once; everything packed into OUT/gpu-47-48.tgz (the device returns files, not folders).
# Usage (repo root, on the device, carry .wheels: liger-kernel, cut-cross-entropy, allpairspy, torchao/):
#   bash tools/gpu/issue47_48.sh "$OUT"
set -uo pipefail
out="${1:?output dir}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source tools/gpu/install.sh
export NUMCHECK_SETUP_DONE=1
mkdir -p "$out/ao" "$out/fam"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/fam/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/fam/gpu.txt"
SUITE_S="${AO_SUITE_S:-280}" REPORT_S="${AO_REPORT_S:-120}" bash tools/gpu/torchao.sh "$out/ao" > "$out/ao/log.txt" 2>&1 &
SUITE_S="${FAM_SUITE_S:-300}" bash tools/gpu/families.sh "$out/fam" > "$out/fam/log.txt" 2>&1
wait
tar czf "$out/gpu-47-48.tgz" -C "$out" ao fam
echo "=== torchao"; tail -25 "$out/ao/log.txt"
echo "=== families"; grep -E "FAILED|ERROR" "$out/fam/suite.txt" | head -30; tail -3 "$out/fam/suite.txt"; cat "$out/fam/families-list.txt"
rm -rf "$out/ao" "$out/fam"
