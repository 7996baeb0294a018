#!/usr/bin/env bash
# torchao's FP8 training paths on CUDA, as run on the device machine (one H200, the torch installed there): its
# Float8Linear recipes on the real path (torch._scaled_mm, emulate=False: the adapter picks it on capability 8.9+),
# judged by the FP8 suite and the quick report; what the adapter declares there (read from the release: the output
# dtypes of its GEMMs, fast accumulation); and whether MoE training's FP8 rowwise grouped GEMM and the emulated
# MXFP8 linear run there. Nothing is installed from the network: torchao's wheels are carried in .wheels/torchao/
# (ignored; a subfolder, so tools/gpu/run.sh's .wheels/*.whl never picks them up), the newest that imports beside
# the device's torch is used, and every try is written down. torchao 0.18.0's wheel is 3.4 MB (0.17.0 3.2 MB,
# 0.16.0 3.2 MB). Fetch them on a machine with the index:
#   pip download --no-deps -d .wheels/torchao torchao==0.18.0 torchao==0.17.0 torchao==0.16.0
# Usage (repo root, on the device): bash tools/gpu/torchao.sh "$OUT" [STAGE ...], STAGE one of declared, suite,
# grouped, report, premerge (default: all five, over 10 minutes: run it as two calls, "declared suite grouped" and
# "report premerge", each within one 10-minute call). suite: the FP8 suite (tests/suite/test_fp8_impls.py) with
# NUMCHECK_DEVICE=cuda on Float8Linear's real path and the emulated MXFP8 linear, each in the shapes it declares there
# (dim_multiple: 16 for torch._scaled_mm's operands, 32 for MXFP8's blocks); grouped: the grouped suite
# (tests/suite/test_grouped_fp8.py) on MoE training's FP8 rowwise grouped GEMM; report: numcheck report --quick on all
# of them; premerge: numcheck premerge on them (--skip-tests: the suites are the stages above; its quick report,
# memory table and known divergences; PREMERGE_TESTS=1 runs the suite inside it too).
# Time caps (seconds): SUITE_S (default 270), KNOWN_S (default 60: the known divergences' strict examples on CUDA,
# tests/adapters/test_torchao.py, after the suite), GROUPED_WARM_S (default 90), GROUPED_S (default 200), REPORT_S (default
# 200), PREMERGE_S (default 300).
# The grouped stage first runs the release's grouped GEMM once in one process (the adapter's probe) so that Triton's
# compiled kernels and autotune results (TRITON_CACHE_AUTOTUNING=1) are on disk before the 8 pytest workers start:
# in the first H100 run every worker paid ~47 s for them at once (its first test took 47 s even when it then
# skipped), and each draw of a new (tokens, K, N, experts) autotunes torchao's jagged-scale kernels again (36
# configurations each, keyed on M or K and the number of experts), which no cap short of minutes covers.
# REPORT_BESIDE=1 runs the report stage beside the grouped one (started after the warm-up), so both get their caps
# in one call. One 10-minute call for the torchao impls (caps 540 s in all, the setup besides):
#   SUITE_S=140 KNOWN_S=40 GROUPED_WARM_S=60 GROUPED_S=300 REPORT_S=290 REPORT_BESIDE=1 \
#     bash tools/gpu/torchao.sh OUT suite grouped report
set -uo pipefail
out="${1:?output dir}"
shift
stages="${*:-declared suite grouped report premerge}"
has() { case " $stages " in *" $1 "*) return 0 ;; esac; return 1; }
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -n "${NUMCHECK_SETUP_DONE:-}" ] || source tools/gpu/install.sh  # once per call (run.sh sets it likewise)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

# 1. the newest carried torchao whose torchao.float8 imports here, unpacked into a folder put first on the path
work=$(mktemp -d)
chosen=""
for wheel in $(ls .wheels/torchao/torchao-*.whl 2>/dev/null | sort -t- -k2 -V -r); do
  rel=$(basename "$wheel" | cut -d- -f2)
  python3 -m pip install -q --no-deps --no-index --target "$work/$rel" "$wheel" > "$out/install-$rel.txt" 2>&1
  if PYTHONPATH="$work/$rel:$PYTHONPATH" python3 -c \
      "import torchao.float8 as f; f.Float8LinearConfig.from_recipe_name" >> "$out/install-$rel.txt" 2>&1; then
    echo "torchao $rel: imports" | tee -a "$out/import.txt"
    chosen="$work/$rel"
    break
  fi
  echo "torchao $rel: does not import ($(tail -1 "$out/install-$rel.txt"))" | tee -a "$out/import.txt"
done
if [ -z "$chosen" ]; then
  echo "no carried torchao wheel imports here (.wheels/torchao/: $(ls .wheels/torchao 2>/dev/null | tr '\n' ' '))" \
    | tee -a "$out/import.txt"
  exit 0
fi
export PYTHONPATH="$chosen:$PYTHONPATH"
impls=(--impl 'torchao_float8[tensorwise]' --impl 'torchao_float8[rowwise]' --impl 'torchao_float8[rowwise_with_gw_hp]'
  --impl 'torchao_mxfp8[rceil]' --impl 'torchao_mxfp8[floor]')
grouped=(--impl 'torchao_grouped_fp8[rowwise]')

# 2. what the adapters declare here (the real path's dtypes, accumulation and shapes; why the grouped GEMM is
#    unavailable, or that it runs)
if has declared; then
timeout 180 python3 - > "$out/declared.txt" 2>&1 <<'EOF'
from numcheck.impls.adapters import torchao, torchao_prototype

print("placement", torchao.placement())
for impl in torchao.torchao_impls() + torchao_prototype.torchao_mx_impls() + torchao_prototype.torchao_grouped_impls():
    s = impl.support
    print(f"{impl.name}: {s.unavailable_reason() or 'runs'}\n  {impl.description}\n  devices {sorted(s.devices)} "
          f"dtypes {sorted(map(str, s.dtypes))} accum {s.accum_unit_roundoff} chunk {s.accum_chunk} "
          f"dim_multiple {dict(getattr(s, 'dim_multiples', {}))}")
print("grouped GEMM on cuda:", torchao_prototype.grouped_refusal("cuda") or "runs")
EOF
echo "exit $?" >> "$out/declared.txt"
cat "$out/declared.txt"
fi

# 3. the FP8 suite on the real path (and MXFP8 emulated); -v -rs so a run cut short names what ran and every skip
#    says why (a shape regime the declared dim_multiple rules out among them)
if has suite; then
NUMCHECK_DEVICE=cuda timeout -s INT -k 15 "${SUITE_S:-270}" python3 -m pytest tests/suite/test_fp8_impls.py -v -rs -n 8 \
  -p no:cacheprovider -p no:benchmark "${impls[@]}" --junitxml="$out/junit.xml" --maxfail=200 > "$out/suite.txt" 2>&1
echo "pytest exit $?" >> "$out/suite.txt"
grep -E "FAILED|ERROR" "$out/suite.txt" | head -40
tail -3 "$out/suite.txt"
# the known divergences' strict examples on CUDA (the CUDA entries run, the CPU ones skip naming their device)
NUMCHECK_DEVICE=cuda timeout -s INT -k 10 "${KNOWN_S:-60}" python3 -m pytest tests/adapters/test_torchao.py -rs -v \
  -p no:cacheprovider -p no:benchmark -k "known_divergence or h100" > "$out/known.txt" 2>&1
echo "pytest exit $?" >> "$out/known.txt"
tail -12 "$out/known.txt"
fi

# 4. the quick report on the real path (a function: REPORT_BESIDE=1 starts it beside the grouped stage)
run_report() {
  timeout "${REPORT_S:-200}" python3 -m numcheck.reports.cli report --quick --device cuda --no-plots --no-progress \
    "${impls[@]}" "${grouped[@]}" --out "$out/report" > "$out/report.txt" 2>&1
  echo "numcheck report exit $?" >> "$out/report.txt"
}
report_pid=""

# 3b. the grouped suite on MoE training's FP8 rowwise grouped GEMM, after one process has filled Triton's caches
if has grouped; then
export TRITON_CACHE_AUTOTUNING=1
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.triton-cache}"
warm_start=$SECONDS
NUMCHECK_DEVICE=cuda timeout "${GROUPED_WARM_S:-90}" python3 -c "
from numcheck.impls.adapters.torchao_prototype import grouped_refusal
print('grouped GEMM probe on cuda:', grouped_refusal('cuda') or 'runs')" > "$out/grouped-warm.txt" 2>&1
echo "warm-up exit $? after $((SECONDS - warm_start)) s" >> "$out/grouped-warm.txt"
cat "$out/grouped-warm.txt"
if has report && [ -n "${REPORT_BESIDE:-}" ]; then run_report & report_pid=$!; fi
NUMCHECK_DEVICE=cuda timeout -s INT -k 15 "${GROUPED_S:-200}" python3 -m pytest tests/suite/test_grouped_fp8.py -v -rs \
  -n 8 -p no:cacheprovider -p no:benchmark --durations=0 "${grouped[@]}" --junitxml="$out/grouped-junit.xml" \
  --maxfail=200 > "$out/grouped.txt" 2>&1
echo "pytest exit $?" >> "$out/grouped.txt"
grep -E "FAILED|ERROR" "$out/grouped.txt" | head -40
tail -3 "$out/grouped.txt"
fi

if has report; then
if [ -n "$report_pid" ]; then wait "$report_pid"; else run_report; fi
tail -6 "$out/report.txt"
fi

# 5. premerge on the same impls (its quick report, memory table, known divergences; the suite only with
#    PREMERGE_TESTS=1, else stage "suite" is it)
if has premerge; then
skip=(--skip-tests)
[ -n "${PREMERGE_TESTS:-}" ] && skip=(--jobs 8)
timeout "${PREMERGE_S:-300}" python3 -m numcheck.reports.cli premerge --device cuda "${skip[@]}" "${impls[@]}" "${grouped[@]}" \
  --out "$out/premerge" > "$out/premerge.txt" 2>&1
echo "numcheck premerge exit $?" >> "$out/premerge.txt"
tail -25 "$out/premerge.txt"
fi
rm -rf "$work"
exit 0
