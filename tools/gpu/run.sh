#!/usr/bin/env bash
# The GPU tier, as run on the device machine (H200, torch 2.11, triton 3.6; nothing can be fetched there):
# the property suite on CUDA, the tolerance report on CUDA, then the benchmark. Third-party impls come as
# carried wheels (.wheels/: Liger-Kernel, cut-cross-entropy, allpairspy — a dependency the device lacks), installed --no-deps into /tmp/carried; numcheck
# itself is installed editable from the checkout (tools/gpu/install.sh).
# Usage (from the repo root on the device): bash tools/gpu/run.sh suite|report|numerics|evidence|sweep|dist|bench|premerge|scale|all "$OUT"
# "numerics" runs the suite and the report side by side (neither is timed; 16 cores, one GPU), capped at 480 s
# and 400 s, and packs the report folder into report.tgz (the device tool returns files, not folders).
# "all" fits suite, report and bench in one 10-minute call: suite capped at 250 s, report at 110 s, bench 180 s.
# bench is timed: run it alone. The suite is every test module under tests (the shipped suite, numcheck's own
# tests and the adapter tests: all of them take NUMCHECK_DEVICE); SUITE_TESTS="tests/suite ..." runs part of it.
# The report is written without plots (no matplotlib there); render them afterwards on a machine that has it:
#   numcheck report --render results/reports/h200-torch2.11/report.json
set -uo pipefail
what="${1:?suite, report, bench or all}"
out="${2:?output dir}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PWD}"
if [ -z "${NUMCHECK_SETUP_DONE:-}" ]; then  # once per call, not once per mode (numerics runs two at once)
  source tools/gpu/install.sh  # numcheck, and the wheels carried in .wheels/ (into /tmp/carried)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/gpu.txt"
  export NUMCHECK_SETUP_DONE=1
fi
[ -d /tmp/carried ] && export PYTHONPATH="$PYTHONPATH:/tmp/carried"
# Triton's compiled kernels in an ignored folder of the tree, which the device keeps between the calls of one lease,
# so a second call (the next sweep seed) does not compile them again.
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.triton-cache}"
case "$what" in
  suite)
    python3 -m numcheck.reports.cli list --device cuda --probes > "$out/list.txt" 2>&1
    # -v: each result is printed as it finishes, so a run cut short by the time limit still names its failures.
    NUMCHECK_DEVICE=cuda timeout -s INT -k 15 "${SUITE_S:-540}" python3 -m pytest ${SUITE_TESTS:-tests} -v -n 8 -p no:cacheprovider -p no:benchmark \
      --junitxml="$out/junit.xml" --maxfail=200 > "$out/suite.txt" 2>&1
    echo "pytest exit $?" >> "$out/suite.txt"
    tail -40 "$out/suite.txt"
    ;;
  report)
    timeout "${REPORT_S:-540}" python3 -m numcheck.reports.cli report --grid "${GRID:-quick}" --device cuda --no-plots --no-progress \
      --out "$out/report" > "$out/report.txt" 2>&1
    echo "numcheck report exit $?" >> "$out/report.txt"
    tail -20 "$out/report.txt"
    ;;
  numerics)
    REPORT_S="${REPORT_S:-400}" bash "$0" report "$out" > /dev/null 2>&1 &
    SUITE_S="${SUITE_S:-480}" bash "$0" suite "$out" > /dev/null 2>&1
    wait
    tar czf "$out/report.tgz" -C "$out" report && rm -rf "$out/report"
    grep -E "FAILED|ERROR" "$out/suite.txt" | tail -40; tail -3 "$out/suite.txt"; tail -8 "$out/report.txt"
    ;;
  evidence)
    # CUDA evidence: the elementary functions' accuracy against their declared budgets, and the CUDA
    # false alarms of 7d1b306 re-judged by the current model.
    for f in elementary_accuracy cuda_false_alarms; do
      timeout 240 python3 docs/evidence/$f.py > "$out/$f.txt" 2>&1; echo "exit $?" >> "$out/$f.txt"; tail -25 "$out/$f.txt"
    done
    ;;
  sweep)
    # numcheck sweep on CUDA: SEEDS (default 0-9), WORKERS xdist workers per seed (pytest loads the plugin through
    # numcheck's entry point: tools/gpu/install.sh). SWEEP_FROM: a committed sweep folder whose kept seeds
    # (seeds/seed-<S>.json.gz) are taken instead of run again, so one sweep is assembled over several calls (each
    # call packs its folder as sweep.tgz: unpack it into the folder the next call takes); KEEP_STALE=1 keeps those
    # that ran on other code too (marked stale in sweep.md with their code hash).
    if [ -n "${SWEEP_FROM:-}" ]; then mkdir -p "$out/sweep" && cp -r "$SWEEP_FROM"/. "$out/sweep"/; fi
    # SWEEP_DEVICE=cpu runs it on the host's CPUs with the GPU hidden (Triton's interpreter for the Triton impls),
    # NUMCHECK_TE_DIR (e.g. .te/2.20.2, carried) adds TransformerEngine's impls.
    if [ "${SWEEP_DEVICE:-cuda}" = cpu ]; then export CUDA_VISIBLE_DEVICES=""; fi
    timeout -s INT -k 15 "${SWEEP_S:-560}" python3 -m numcheck.reports.cli sweep \
      --seeds "${SEEDS:-0-9}" -n "${WORKERS:-12}" --device "${SWEEP_DEVICE:-cuda}" --out "$out/sweep" --per-impl ${KEEP_STALE:+--keep-stale} > "$out/sweep.txt" 2>"$out/sweep-progress.txt"
    echo "numcheck sweep exit $?" >> "$out/sweep.txt"
    # The device returns at most 8 files a call: the folder (one record per seed) travels as one archive.
    tar czf "$out/sweep.tgz" -C "$out" sweep && rm -rf "$out/sweep"
    tail -60 "$out/sweep.txt"; grep "numcheck sweep: seed" "$out/sweep-progress.txt" | tail -12
    ;;
  scale)
    # The production-shape tier: every registered linear+CE impl plus the int32-offset mutant, at the
    # three production shapes, bf16 then AMP. numcheck production runs the items in a worker it restarts after a crash
    # or hang, writes progress.jsonl as it goes and production.json/production.md at the end; SCALE_BUDGET_S stops starting
    # new items (those left are recorded not_run), SCALE_CAP_S caps one (case, impl) item, and the outer timeout
    # is the last resort (progress.jsonl still holds what finished: numcheck production --assemble --out DIR writes the report from it).
    # SCALE_RESUME=path/to/progress.jsonl (a committed earlier run) resumes it: its finished items of the same numcheck
    # code and torch are not rerun (SCALE_ARGS=--keep-stale keeps those of other code too).
    mkdir -p "$out/scale"
    [ -n "${SCALE_RESUME:-}" ] && cp "$SCALE_RESUME" "$out/scale/progress.jsonl"
    NUMCHECK_IMPLS="${NUMCHECK_IMPLS:+$NUMCHECK_IMPLS,}numcheck.tests.self.helpers.production_mutants:int32_offsets" \
      timeout -s KILL "${SCALE_S:-315}" python3 -m numcheck.reports.cli production --device cuda --out "$out/scale" \
      --budget-s "${SCALE_BUDGET_S:-240}" --time-cap-s "${SCALE_CAP_S:-90}" ${SCALE_ARGS:-} > "$out/scale.txt" 2>&1
    echo "numcheck production exit $?" >> "$out/scale.txt"
    tail -30 "$out/scale.txt"; grep -E "^\| " "$out/scale/production.md" 2>/dev/null | head -80
    ;;
  dist)
    # the distributed tier under nccl (one GPU per rank: world sizes above the visible GPU count are
    # skipped with the reason), the suite's two distributed modules and the distributed mutant self tests, with
    # megatron-core carried in .wheels (installed --no-deps above). -v names each verdict as it finishes; the
    # summary line and the wall time end the log.
    start=$(date +%s)
    NUMCHECK_DEVICE=cuda NUMCHECK_DIST_BACKEND=nccl timeout -s INT -k 15 "${DIST_S:-540}" python3 -m pytest \
      tests/suite/test_distributed.py tests/suite/test_distributed_fp8.py \
      tests/self/mutants/test_dist_mutants.py tests/self/mutants/test_dist_fp8_mutants.py \
      tests/self/properties/test_dist_harness.py -v -rs -p no:cacheprovider -p no:benchmark \
      --hypothesis-profile=numcheck-ci --junitxml="$out/junit-dist.xml" > "$out/dist.txt" 2>&1
    echo "pytest exit $? after $(( $(date +%s) - start )) s on $(nvidia-smi -L | wc -l) GPU(s)" >> "$out/dist.txt"
    grep -E "PASSED|FAILED|ERROR|SKIPPED" "$out/dist.txt" | tail -60; tail -3 "$out/dist.txt"
    ;;
  bench)
    timeout "${BENCH_S:-560}" python3 -m numcheck.reports.cli bench --rep-ms "${REP_MS:-400}" --out "$out" 2>&1 | tee "$out/bench.txt" | tail -40
    ;;
  premerge)
    # the example A/B pair (examples/accumulation_change.py) and its claims on CUDA: the addmm(out_dtype=) path
    # is live here, so the "3072 MiB -> 0 MiB" claim is measured where it holds; about 1-2 minutes (accuracy on the
    # quick grid, memory and 5 interleaved timing repeats at the seed's shapes). Writes premerge-ab/ab.md and ab.json.
    PYTHONPATH="$PYTHONPATH:$PWD/examples" timeout "${PREMERGE_S:-170}" python3 -m numcheck.reports.cli premerge \
      --impl accumulation_change:new --base accumulation_change:old --claims examples/numcheck-claims.toml \
      --device cuda --no-convergence --out "$out/premerge-ab" > "$out/premerge.txt" 2>&1
    echo "numcheck premerge exit $? (1 expected only if a claim is false or the comparison fails)" >> "$out/premerge.txt"
    tail -60 "$out/premerge.txt"
    ;;
  all)
    SUITE_S=250 bash "$0" suite "$out" > /dev/null 2>&1
    REPORT_S=110 bash "$0" report "$out" > /dev/null 2>&1
    BENCH_S=180 REP_MS=50 bash "$0" bench "$out" > /dev/null 2>&1
    grep -E "FAILED|ERROR" "$out/suite.txt" | tail -30; tail -3 "$out/suite.txt"; tail -6 "$out/report.txt"; tail -40 "$out/bench.txt"
    ;;
esac
