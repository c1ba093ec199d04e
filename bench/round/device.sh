#!/usr/bin/env bash
# One device call: the paper-suite GPU round on the committed schedules (codegen.round run; SCHED, ONLY to choose),
# then the profiler on PROFILE schedules of PSCHED. Needs the mamba_ssm wheel in .whl carried along. Logs and
# tables under $OUT; prints the round's table last.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=${PTSOLVE_CACHE_DIR:-/tmp/ptsolve_cache}  # precompiled cubins, if carried
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$OUT/summary.txt"
if [ -n "${PROFILE:-}" ]; then
  mkdir -p /tmp/prof
  timeout 200 python3 -m codegen.profile --schedules "${PSCHED:-results/sched_new}" --only "$PROFILE" --out /tmp/prof \
    > "$OUT/profile.log" 2>&1; tar czf "$OUT/profile.tgz" -C /tmp prof
  tail -12 "$OUT/profile.log" >> "$OUT/summary.txt"
fi
if [ -n "${TESTS:-}" ]; then
  timeout 200 python3 -m pytest -q -m gpu $TESTS -n 8 -p no:cacheprovider -rs > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests ($TESTS): $(tail -1 "$OUT/gpu_tests.log")" >> "$OUT/summary.txt"
fi
if [ -n "${SANITIZE:-}" ]; then
  for tool in memcheck racecheck synccheck; do
    # memcheck: cuda-python probes driver entry points with cuGetProcAddress; those misses are host API errors
    flags=$([ $tool = memcheck ] && echo "--report-api-errors no")
    timeout 120 compute-sanitizer --tool $tool $flags --error-exitcode 9 python3 -m bench sanitize \
      >> "$OUT/sanitizer.log" 2>&1
    echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)" >> "$OUT/summary.txt"
  done
fi
if [ -n "${SCHED:-}" ]; then
  timeout 420 python3 -m bench round run --schedules "$SCHED" --out "$OUT" ${ONLY:+--only $ONLY} > "$OUT/round.log" 2>&1
  echo "round: exit $?" >> "$OUT/summary.txt"
  tail -25 "$OUT/round.log"
fi
cat "$OUT/summary.txt"
