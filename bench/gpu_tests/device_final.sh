#!/usr/bin/env bash
# One device call that validates main on the H200: every GPU test (all operators through lower + skeleton, split-K
# GEMM, flash_decode, ptsolve.torch, profiler, tune runner), compute-sanitizer (memcheck, racecheck, synccheck) on
# small launches of every operator (bench sanitize), and the profiler on freshly solved schedules
# (results/sched_new). Needs the mamba_ssm wheel in .whl carried along; PTSOLVE_CACHE_DIR may hold precompiled cubins.
# Logs under $OUT, a summary printed last.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=${PTSOLVE_CACHE_DIR:-/tmp/ptsolve_cache}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
S="$OUT/summary.txt"
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
  echo "commit ${COMMIT:-?}"; } > "$S"
t0=$(date +%s)
timeout "${TEST_S:-330}" python3 -m pytest -q -m gpu tests/ -n 8 -p no:cacheprovider -rs --durations=15 \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit $? $(tail -1 "$OUT/gpu_tests.log") ($(( $(date +%s) - t0 )) s)" >> "$S"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20 >> "$S"
for tool in memcheck racecheck synccheck; do
  t1=$(date +%s)
  # memcheck: cuda-python probes driver entry points with cuGetProcAddress; those misses are host API errors
  flags=$([ $tool = memcheck ] && echo "--report-api-errors no")
  timeout "${SAN_S:-70}" compute-sanitizer --tool $tool $flags --error-exitcode 9 python3 -m bench sanitize \
    >> "$OUT/sanitizer.log" 2>&1
  echo "sanitizer $tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1) ($(( $(date +%s) - t1 )) s)" >> "$S"
done
if [ -n "${PROFILE:-}" ]; then
  mkdir -p /tmp/prof
  timeout 90 python3 -m codegen.profile --schedules results/sched_new --only "$PROFILE" --out /tmp/prof \
    > "$OUT/profile.log" 2>&1; echo "profile: exit $?" >> "$S"; tar czf "$OUT/profile.tgz" -C /tmp prof
  tail -6 "$OUT/profile.log" >> "$S"
fi
cat "$S"
