#!/usr/bin/env bash
# The TransformerEngine versions table (docs/evidence/te_releases.py) on the GPU machine's CPUs: the GPU hidden, TE's
# Triton kernels under Triton's interpreter exactly as on a CPU machine, several releases at once on its cores.
#
# On the device machine, from the repo root:
#   bash tools/gpu/te_table.sh OUT
# with every release's wheel carried in .wheels/te/ (pip download --no-deps -d .wheels/te transformer-engine==X for
# each release from 2.2.0) and allpairspy in .wheels/ (the report's grid needs it). A kept work folder carried in
# .te-work/ (an earlier call's OUT/work) resumes: releases already judged are not judged again (TABLE_ARGS=--keep-stale
# keeps records of other numcheck code too). PARALLEL releases at once, JOBS xdist workers each, TABLE_S the cap.
# Copy OUT/work back and render locally: python docs/evidence/te_releases.py DIR --work OUT/work --keep-stale --out ...
set -uo pipefail
out="${1:?output dir}"
mkdir -p "$out/work"
[ -d .te-work ] && cp -r .te-work/. "$out/work"/
export PYTHONPATH="$PWD${PYTHONPATH:+:$PWD}"
if ls .wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/carried .wheels/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/carried"
fi
for w in .wheels/te/transformer_engine-*-py3-none-any.whl; do
  v=$(basename "$w" | sed 's/^transformer_engine-\(.*\)-py3-none-any.whl$/\1/')
  python3 -m pip install -q --no-deps --no-index --target "/tmp/te/$v" "$w" >> "$out/install.txt" 2>&1
done
export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
timeout -s INT -k 15 "${TABLE_S:-560}" python3 docs/evidence/te_releases.py /tmp/te --work "$out/work" --report \
  --parallel "${PARALLEL:-5}" -n "${JOBS:-3}" ${TABLE_ARGS:-} --out "$out/te_releases.txt" > "$out/table.txt" 2>&1
echo "te_releases exit $?" >> "$out/table.txt"
grep -E "judging|suite |kept|exit" "$out/table.txt" | tail -40
