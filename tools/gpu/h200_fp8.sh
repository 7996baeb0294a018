#!/usr/bin/env bash
# Issue 47's FP8 half on one GPU in one device call (about 9 minutes; an H200 or H100, torch 2.11, triton 3.6, 16
# cores, no pip index): torchao's FP8 training paths judged where they really run, and mmaemu's CPU model of Hopper's
# FP8 GEMMs against the device. Five stages, each capped in seconds and logged under OUT, in two phases side by side:
#   phase 1  (a) suite     the FP8 suite (tests/suite/test_fp8_impls.py) on torchao's Float8Linear, real path
#                          (torch._scaled_mm: the adapter picks emulate=False on capability 8.9+), the three recipes
#            (c) report    numcheck report --quick on those three and the grouped GEMM
#            warm-up       the grouped GEMM run once (forward, backward, judged) on each shape the CUDA draws take (the
#                          fixed set of properties/fp8/grouped/strategies.py, CUDA_SPLITS), so that its Triton kernels
#                          and autotune results (TRITON_CACHE_AUTOTUNING=1) are on disk before phase 2's workers start:
#                          on the H200 each worker's first call took 105 s and every new token count autotuned again
#            (e) mmaemu    docs/evidence/mmaemu_h200.py: mmaemu's reference backend on the CPU against
#                          torch._scaled_mm, written as OUT/mmaemu_h200.txt (commit it as docs/evidence/mmaemu_h200.txt;
#                          247 s of one CPU core on the H100), running on through phase 2
#   phase 2  (b) grouped   the grouped suite (tests/suite/test_grouped_fp8.py) on MoE training's FP8 rowwise grouped GEMM
#            (d) premerge  numcheck premerge on torchao_float8[tensorwise] (the suite inside it too: as a user runs it)
#            (f) known     the strict examples of torchao's known divergences on this device (tests/adapters/
#                          test_torchao.py and test_torchao_prototype.py, -k known)
# Usage (repo root, on the device; carry .wheels: its top level as for every GPU script, torchao/ and mmaemu/):
#   bash tools/gpu/h200_fp8.sh "$OUT"
# Writes OUT/gpu.txt (first: the GPU, torch, triton, what was installed), OUT/summary.txt (one line per stage: exit
# status, seconds, cap; then each stage's verdict lines), OUT/mmaemu_h200.txt (OUT/mmaemu_selftest.txt without CUDA),
# and OUT/h200_fp8.tgz (logs/, the JUnit files, report/, premerge/): the device returns a few files, not folders.
# Caps (seconds; each is cut further to what is left of TOTAL_S, default 540, less RESERVE_S, default 20, for packing):
# SUITE_S 190, REPORT_S 210, GROUPED_WARM_S 200, MMAEMU_S 420, GROUPED_S 220, PREMERGE_S 220, KNOWN_S
# 120 (a cap of 0 leaves the stage out) (setup about 40 s, phase 1
# 210 s, phase 2 220 s: about 480 s); JOBS pytest workers per suite (default 6: two suites or a suite and a report
# side by side on 16 cores). The wheels as tools/gpu/torchao.sh and
# tools/gpu/mmaemu.sh take them (.wheels/torchao/torchao-*.whl, the newest that imports; .wheels/mmaemu/mmaemu-0.1.0-*.whl);
# where none is carried, a torchao or mmaemu already importable is used and said so.
# Without CUDA every GPU stage says so and is skipped, and the mmaemu stage runs the script's --cpu-selftest (checks the
# script, not the device); DEVICE=cpu runs the stages' plumbing on the CPU instead (torchao emulated, the grouped GEMM
# unavailable with its reason), e.g. a dry run with small caps:
#   DEVICE=cpu JOBS=2 SUITE_S=60 REPORT_S=60 MMAEMU_S=90 GROUPED_S=30 PREMERGE_S=60 bash tools/gpu/h200_fp8.sh OUT
set -uo pipefail
out="${1:?output dir}"
start=$SECONDS
mkdir -p "$out/logs"
: > "$out/summary.txt"

# 0. the GPU, first
if command -v nvidia-smi > /dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)
else
  gpu="no NVIDIA GPU here (nvidia-smi not found)"
fi
echo "GPU: $gpu" | tee "$out/gpu.txt"

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${NUMCHECK_SETUP_DONE:-}" ]; then
  source tools/gpu/install.sh  # numcheck editable from this checkout, .wheels/*.whl into /tmp/carried
  export NUMCHECK_SETUP_DONE=1
fi
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.triton-cache}" TRITON_CACHE_AUTOTUNING=1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'CUDA available:',
  torch.cuda.is_available())" >> "$out/gpu.txt" 2>&1
python3 -c "import triton; print('triton', triton.__version__)" >> "$out/gpu.txt" 2>&1
device="${DEVICE:-cuda}"
cuda_ok=0
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && cuda_ok=1
no_cuda="CUDA absent (torch.cuda.is_available() is False here): this stage needs the GPU; DEVICE=cpu runs its plumbing"
work=$(mktemp -d)

# the newest carried torchao that imports beside this torch, else one already installed
ao=""
for wheel in $(ls .wheels/torchao/torchao-*.whl 2>/dev/null | sort -t- -k2 -V -r); do
  rel=$(basename "$wheel" | cut -d- -f2)
  python3 -m pip install -q --no-deps --no-index --target "$work/ao-$rel" "$wheel" > "$out/logs/install-torchao-$rel.txt" 2>&1
  if PYTHONPATH="$work/ao-$rel:$PYTHONPATH" python3 -c "import torchao.float8 as f; f.Float8LinearConfig.from_recipe_name" \
      >> "$out/logs/install-torchao-$rel.txt" 2>&1; then
    ao="$work/ao-$rel"; echo "torchao $rel: carried wheel, imports" >> "$out/gpu.txt"; break
  fi
  echo "torchao $rel: carried wheel does not import ($(tail -1 "$out/logs/install-torchao-$rel.txt"))" >> "$out/gpu.txt"
done
if [ -n "$ao" ]; then
  export PYTHONPATH="$ao:$PYTHONPATH"
elif python3 -c "import torchao.float8" > /dev/null 2>&1; then
  echo "torchao $(python3 -c 'import torchao; print(torchao.__version__)' 2>/dev/null): installed here (no carried wheel imports)" >> "$out/gpu.txt"
  ao=installed
else
  echo "torchao: none (no .wheels/torchao/torchao-*.whl imports, none installed): the torchao stages are skipped" >> "$out/gpu.txt"
fi
# mmaemu 0.1.0, unpacked from its carried wheel (pure Python), else one already installed
mm=""
wheel=$(ls .wheels/mmaemu/mmaemu-0.1.0-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m zipfile -e "$wheel" "$work/mmaemu" && mm="$work/mmaemu" && echo "mmaemu: carried wheel $(basename "$wheel")" >> "$out/gpu.txt"
elif python3 -c "import mmaemu" > /dev/null 2>&1; then
  mm=installed; echo "mmaemu $(python3 -c 'import mmaemu; print(mmaemu.__version__)'): installed here" >> "$out/gpu.txt"
else
  echo "mmaemu: none (no .wheels/mmaemu/mmaemu-0.1.0-*.whl, none installed): the mmaemu stage is skipped" >> "$out/gpu.txt"
fi
tail -n +2 "$out/gpu.txt"
echo "setup: $((SECONDS - start)) s" >> "$out/summary.txt"

# stage NAME CAP CMD...: CMD capped at CAP seconds (less if TOTAL_S has less left), its output in logs/NAME.txt, one
# summary line (exit 124: it reached its cap)
stage() {
  local name=$1 cap=$2 left t0 rc
  shift 2
  if (( cap == 0 )); then
    skipped "$name" "its cap is 0 (left out of this call)"
    return 0
  fi
  left=$(( ${TOTAL_S:-540} - (SECONDS - start) - ${RESERVE_S:-20} ))
  (( cap > left )) && cap=$left
  if (( cap < 10 )); then
    echo "$name: not run, no time left of TOTAL_S=${TOTAL_S:-540}" | tee "$out/logs/$name.txt" >> "$out/summary.txt"
    return 0
  fi
  t0=$SECONDS
  timeout -s INT -k 15 "$cap" "$@" > "$out/logs/$name.txt" 2>&1
  rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s (cap $cap s$( ((rc == 124 || rc == 137)) && echo ': cut by it'))" \
    >> "$out/summary.txt"
}
# skipped NAME REASON: the stage's log and summary line say why it did not run
skipped() { echo "$1: skipped: $2" | tee "$out/logs/$1.txt" >> "$out/summary.txt"; }
# gpu_stage NAME: why stage NAME cannot run here (non-empty), or nothing
gpu_stage() {
  if [ "$device" = cuda ] && (( ! cuda_ok )); then echo "$no_cuda"; elif [ -z "$ao" ]; then echo "no torchao"; fi
}

fp8=(--impl 'torchao_float8[tensorwise]' --impl 'torchao_float8[rowwise]' --impl 'torchao_float8[rowwise_with_gw_hp]')
grouped=(--impl 'torchao_grouped_fp8[rowwise]')
njobs="${JOBS:-6}"
pyt=(python3 -m pytest -v -rs -n "$njobs" -p no:cacheprovider -p no:benchmark --maxfail=200)
phase1=()

# phase 1: (a) suite, (c) report, the grouped warm-up, (e) mmaemu (on through phase 2)
why=$(gpu_stage)
if [ -n "$why" ]; then skipped suite "$why"; else
  NUMCHECK_DEVICE=$device stage suite "${SUITE_S:-190}" "${pyt[@]}" --durations=15 tests/suite/test_fp8_impls.py \
    "${fp8[@]}" --junitxml="$out/junit-fp8.xml" &
  phase1+=($!)
fi
if [ -n "$why" ]; then skipped report "$why"; else
  stage report "${REPORT_S:-210}" python3 -m numcheck.reports.cli report --quick --device "$device" --no-plots \
    --no-progress "${fp8[@]}" "${grouped[@]}" --out "$out/report" &
  phase1+=($!)
fi
if [ -z "$mm" ]; then skipped mmaemu "no mmaemu"; else
  mm_path=$([ "$mm" = installed ] && echo "$PYTHONPATH" || echo "$mm:$PYTHONPATH")
  if (( cuda_ok )); then
    PYTHONPATH="$mm_path" stage mmaemu "${MMAEMU_S:-420}" python3 docs/evidence/mmaemu_h200.py &
  else  # the script's own check without a device: mmaemu's splitk=1 result stands in for the device's
    echo "mmaemu: CUDA absent (torch.cuda.is_available() is False here): docs/evidence/mmaemu_h200.py --cpu-selftest" \
      "instead (checks the script, not a device)" >> "$out/summary.txt"
    PYTHONPATH="$mm_path" stage mmaemu "${MMAEMU_S:-420}" python3 docs/evidence/mmaemu_h200.py --cpu-selftest &
  fi
fi
# the grouped GEMM run once on every shape the CUDA draws take, so its Triton autotune results are on disk for phase 2
if [ -n "$why" ]; then skipped grouped-warm "$why"; else
  NUMCHECK_DEVICE=$device stage grouped-warm "${GROUPED_WARM_S:-200}" python3 - <<'EOF' &
import time

from numcheck.impls.adapters.torchao_prototype import torchao_grouped_impls
from numcheck.properties.core.device import DEVICE
from numcheck.properties.fp8.grouped.cases import GroupedCase
from numcheck.properties.fp8.grouped.props import accuracy
from numcheck.properties.fp8.grouped.strategies import cuda_features, cuda_splits

impl = torchao_grouped_impls()[0]
why = impl.support.unavailable_reason()
if why:
    raise SystemExit(f"{impl.name} unavailable here: {why}")
for r in impl.support.recipes:  # every (tokens, experts, K, N) the CUDA draws take, forward and backward
    for splits in cuda_splits(impl.support, r, None):
        for K, N in cuda_features(impl.support, r):
            t0 = time.perf_counter()
            soi = r.allows_save_original_input and True in impl.support.save_original_input
            dtype = "bfloat16" if "torch.bfloat16" in map(str, impl.support.dtypes) else "float32"
            case = GroupedCase(r, splits, K, N, dtype=dtype, save_original_input=soi, device=DEVICE)
            try:
                accuracy(impl, case)
                verdict = "ran"
            except Exception as exc:  # noqa: BLE001 - the warm-up judges nothing; the suite does
                verdict = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            print(f"{r.name} m_splits={splits} K={K} N={N}: {verdict} in {time.perf_counter() - t0:.1f} s", flush=True)
EOF
  phase1+=($!)
fi
for pid in "${phase1[@]}"; do wait "$pid"; done
echo "phase 1 done at $((SECONDS - start)) s" >> "$out/summary.txt"

# phase 2: (b) grouped (its warm-up ran in phase 1) beside (d) premerge
if [ -n "$why" ]; then skipped grouped "$why"; else
  NUMCHECK_DEVICE=$device stage grouped "${GROUPED_S:-220}" "${pyt[@]}" --durations=0 tests/suite/test_grouped_fp8.py \
    "${grouped[@]}" --junitxml="$out/junit-grouped.xml" &
fi
if [ -n "$why" ]; then skipped premerge "$why"; else
  tests=(--jobs "$njobs")
  [ -n "${PREMERGE_SKIP_TESTS:-}" ] && tests=(--skip-tests)
  stage premerge "${PREMERGE_S:-220}" python3 -m numcheck.reports.cli premerge --device "$device" "${tests[@]}" \
    --impl 'torchao_float8[tensorwise]' --out "$out/premerge" &
fi
# (f) the known divergences' strict examples on this device (a CUDA entry's example must still fail there)
if [ -n "$why" ]; then skipped known "$why"; else
  NUMCHECK_DEVICE=$device stage known "${KNOWN_S:-120}" python3 -m pytest -v -rs -p no:cacheprovider -p no:benchmark \
    tests/adapters/test_torchao.py tests/adapters/test_torchao_prototype.py -k known --junitxml="$out/junit-known.xml" &
fi
wait
echo "phase 2 done at $((SECONDS - start)) s" >> "$out/summary.txt"

# what each stage says: pytest's failures and last line, the commands' verdicts
{
  for name in suite grouped known; do
    [ -f "$out/logs/$name.txt" ] || continue
    log="$out/logs/$name.txt"
    echo "== $name"; grep -E "^(FAILED|ERROR|$name: skipped)" "$log" | head -30
    grep -qE "^$name: skipped" "$log" || grep -E "^=+ .*(passed|failed|skipped|error| in [0-9.]+s)" "$log" | tail -1
    grep -qE "^$name: skipped" "$log" || echo "per test line: $(grep -c ' PASSED' "$log") passed, $(grep -c ' FAILED' "$log")" \
      "failed, $(grep -c ' SKIPPED' "$log") skipped, $(grep -c ' ERROR' "$log") errors"
  done
  [ -f "$out/logs/grouped-warm.txt" ] && { echo "== grouped-warm"; tail -15 "$out/logs/grouped-warm.txt"; }
  for name in report premerge mmaemu; do
    [ -f "$out/logs/$name.txt" ] && { echo "== $name"; tail -12 "$out/logs/$name.txt"; }
  done
} >> "$out/summary.txt" 2>&1
# the comparison's output as docs/evidence keeps it; the self-test's (no device) under another name
if [ -f "$out/logs/mmaemu.txt" ] && ! grep -q "^mmaemu: skipped" "$out/logs/mmaemu.txt"; then
  if (( cuda_ok )); then cp "$out/logs/mmaemu.txt" "$out/mmaemu_h200.txt"; else cp "$out/logs/mmaemu.txt" "$out/mmaemu_selftest.txt"; fi
fi
tar czf "$out/h200_fp8.tgz" -C "$out" logs $(cd "$out" && ls -d report premerge junit-*.xml 2>/dev/null) 2>> "$out/summary.txt"
rm -rf "$out/logs" "$out/report" "$out/premerge" "$out"/junit-*.xml "$work"
echo "packed at $((SECONDS - start)) s: $(ls "$out" | tr '\n' ' ')" >> "$out/summary.txt"
cat "$out/summary.txt"
exit 0
