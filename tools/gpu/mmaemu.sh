#!/usr/bin/env bash
# mmaemu's CPU model of Hopper's FP8 GEMMs against this device's torch._scaled_mm (docs/evidence/mmaemu_h200.py), as
# run on the device machine (one H200, torch 2.11, nothing fetched there). mmaemu 0.1.0's wheel (pure Python, 2 MB)
# is carried in .wheels/mmaemu/ (ignored; a subfolder, so tools/gpu/run.sh's .wheels/*.whl never picks it up). Fetch
# it on a machine with the index:
#   pip download --no-deps -d .wheels/mmaemu mmaemu==0.1.0
# It is unpacked with Python's zipfile (no pip needed) into a folder put first on PYTHONPATH; mmaemu needs numpy.
# Usage (repo root, on the device, one call of a few minutes): bash tools/gpu/mmaemu.sh "$OUT"
# Writes OUT/gpu.txt and OUT/mmaemu_h200.txt (commit it as docs/evidence/mmaemu_h200.txt); exits with the script's
# status.
set -uo pipefail
out="${1:?output dir}"
mkdir -p "$out"
wheel=$(ls .wheels/mmaemu/mmaemu-0.1.0-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  echo "no .wheels/mmaemu/mmaemu-0.1.0-*.whl: pip download --no-deps -d .wheels/mmaemu mmaemu==0.1.0" | tee "$out/gpu.txt"
  exit 2
fi
pkg=$(mktemp -d)
python3 -m zipfile -e "$wheel" "$pkg"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
PYTHONPATH="$pkg" python3 -c "import torch, numpy, mmaemu; print('torch', torch.__version__, 'cuda', torch.version.cuda,
  'numpy', numpy.__version__, 'mmaemu', mmaemu.__version__)" >> "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
PYTHONPATH="$pkg" python3 docs/evidence/mmaemu_h200.py > "$out/mmaemu_h200.txt"
rc=$?
cat "$out/mmaemu_h200.txt"
exit $rc
