#!/usr/bin/env bash
# The grouped FP8 linear on CUDA, as run on the device machine (one H200, torch as installed there):
# the capability probes (scaled_grouped_mm[2d_3d], scaled_grouped_mm[2d_2d] among them), one direct call of every
# grouped built-in against the float64 oracle, the grouped suite with every problem on CUDA — the
# torch._scaled_grouped_mm built-in included wherever its probe passes on the GPU — with the grouped mutants, and the
# quick report's grouped rows. Everything it writes goes to OUT; it exits 0 whatever the verdicts (read the files).
# Usage (from the repo root on the device, inside one 10-minute call): bash tools/gpu/grouped.sh "$OUT"
# Time caps (seconds): SUITE_S (default 330) for the suite and the mutants, REPORT_S (default 150) for the report.
set -uo pipefail
out="${1:?output dir}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source tools/gpu/install.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$out/gpu.txt" 2>&1
impls=(--impl 'grouped_fp8_linear[loop]' --impl 'grouped_fp8_linear[fused]'
       --impl 'grouped_fp8_linear[scaled_grouped_mm]')

# 1. what this GPU runs: every impl's status here and every probe
python3 -m numcheck.reports.cli list --device cuda --probes > "$out/list.txt" 2>&1
grep -E "grouped_fp8_linear|scaled_grouped_mm|scaled_mm\[" "$out/list.txt"

# 2. one direct call per built-in and recipe: per output, error/bound against both references (a quick look that
#    does not depend on hypothesis' draws); a raising impl prints its error and the others go on
timeout 120 python3 - > "$out/direct.txt" 2>&1 <<'EOF'
import torch
from numcheck.impls.builtin.grouped_fp8_linear import grouped_fp8_linear_impls
from numcheck.properties.fp8.grouped.cases import GroupedCase, fitted, refusal
from numcheck.properties.fp8.grouped.props import measure_case

for impl in grouped_fp8_linear_impls():
    why = impl.support.unavailable_reason()
    if why:
        print(f"{impl.name}: unavailable: {why}")
        continue
    for recipe in impl.support.recipes:
        case = fitted(impl.support, GroupedCase(recipe, (32, 0, 48, 16), 64, 48, dtype="bfloat16", bias=True,
                                                seed=1, steps=2 if recipe.kind == "delayed" else 1, device="cuda"))
        if refusal(impl.support, case):
            continue
        try:
            r = measure_case(impl, case)
        except Exception as exc:  # noqa: BLE001 - reported, the next one runs
            print(f"{impl.name} {recipe.name}: raised {type(exc).__name__}: {exc}")
            continue
        ratios = ", ".join(f"{k} {m.dq.ratio:.3g}/{m.true.ratio:.3g}" for k, m in r.outputs.items())
        print(f"{impl.name} {recipe.name} {case.m_splits}: {'pass' if r.ok else 'FAIL'}; error/bound vs "
              f"dequantized/original: {ratios}" + (f"; notes {r.notes}" if r.notes else ""))
EOF
echo "direct exit $?" >> "$out/direct.txt"
cat "$out/direct.txt"

# 3. the grouped suite on CUDA (the three built-ins) and the grouped mutants; -v so a run cut short names what ran.
NUMCHECK_DEVICE=cuda timeout -s INT -k 15 "${SUITE_S:-330}" python3 -m pytest tests/suite/test_grouped_fp8.py \
  tests/self/mutants/test_grouped_fp8_mutants.py -v -n 8 -p no:cacheprovider -p no:benchmark \
  "${impls[@]}" --junitxml="$out/junit.xml" --maxfail=100 > "$out/suite.txt" 2>&1
echo "pytest exit $?" >> "$out/suite.txt"
grep -E "PASSED|FAILED|ERROR|SKIPPED" "$out/suite.txt" | sed 's/ \[ *[0-9]*%\]//' | sort | uniq -c | sort -rn | head -60
tail -3 "$out/suite.txt"

# 4. the quick report's grouped rows on CUDA
timeout "${REPORT_S:-150}" python3 -m numcheck.reports.cli report --grid quick --device cuda --no-plots --no-progress \
  "${impls[@]}" --out "$out/report" > "$out/report.txt" 2>&1
echo "numcheck report exit $?" >> "$out/report.txt"
tail -8 "$out/report.txt"
exit 0
