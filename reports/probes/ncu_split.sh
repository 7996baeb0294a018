#!/usr/bin/env bash
# Run U of reports/h200-torch2.11/README.md: Nsight Compute on one launch of split_gluon's first configuration and
# of impls/split_accum.py's TMA kernel (`split_gluon --once`), as two ncu calls: sections, then stall reasons.
# Usage (device, repo root): bash reports/probes/ncu_split.sh "$OUT"   -> $OUT/ncu_split.txt, $OUT/ncu_stalls.txt
set -euo pipefail
out="${1:?output dir}"
export PYTHONPATH="$PWD"
ncu --launch-skip 2 --launch-count 2 -k regex:split --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
  python3 -m reports.probes.split_gluon --once > "$out/ncu_split.txt" 2>&1
metrics=""
for r in barrier long_scoreboard short_scoreboard wait mio_throttle lg_throttle math_pipe_throttle membar sleeping \
         dispatch_stall no_instruction selected not_selected branch_resolving drain misc; do
  metrics="$metrics,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
metrics="${metrics#,},smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
metrics="$metrics,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum"
ncu --launch-skip 2 --launch-count 2 -k regex:split --metrics "$metrics" \
  python3 -m reports.probes.split_gluon --once > "$out/ncu_stalls.txt" 2>&1
