#!/usr/bin/env bash
# The fused linear + distillation and preference families on CUDA, as run on the device machine (one H200, the torch
# installed there; nothing can be fetched): their shipped suite and Liger-Kernel's adapters' tests with
# NUMCHECK_DEVICE=cuda — Liger's fused JSD as compiled Triton, its chunked JSD and preference losses both eager
# (compiled=False) and as Liger runs them by default (compiled=True: the *_compiled impls, CUDA-only). Liger-Kernel
# comes as a carried wheel (.wheels/liger_kernel-*.whl, installed --no-deps by tools/gpu/run.sh).
# Usage (repo root, on the device): bash tools/gpu/families.sh "$OUT"   (SUITE_S caps the pytest run, default 420 s)
set -uo pipefail
out="${1:?output dir}"
mkdir -p "$out"
SUITE_TESTS="tests/suite/test_linear_distill.py tests/suite/test_linear_preference.py tests/adapters/test_liger_distill.py \
tests/adapters/test_liger_preference.py" SUITE_S="${SUITE_S:-420}" bash tools/gpu/run.sh suite "$out"
grep -E "^(liger_jsd|liger_preference|linear_distill|linear_preference)" -A3 "$out/list.txt" | grep -E "^[a-z]|here:" \
  > "$out/families-list.txt"
