#!/usr/bin/env bash
# One device call: the paper-suite GPU round on the committed schedules (codegen.round run; SCHED, ONLY to choose),
# then the profiler on PROFILE schedules of PSCHED. Needs the mamba_ssm wheel in .whl carried along. Logs and
# tables under $OUT; prints the round's table last.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=/tmp/ptsolve_cache
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$OUT/summary.txt"
if [ -n "${PROFILE:-}" ]; then
  mkdir -p /tmp/prof
  timeout 200 python3 -m codegen.profile --schedules "${PSCHED:-results/sched_new}" --only "$PROFILE" --out /tmp/prof \
    > "$OUT/profile.log" 2>&1; tar czf "$OUT/profile.tgz" -C /tmp prof
  tail -12 "$OUT/profile.log" >> "$OUT/summary.txt"
fi
if [ -n "${TESTS:-}" ]; then
  timeout 200 python3 -m pytest -q -m gpu $TESTS -p no:cacheprovider -rs > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests ($TESTS): $(tail -1 "$OUT/gpu_tests.log")" >> "$OUT/summary.txt"
fi
if [ -n "${SANITIZE:-}" ]; then
  timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m codegen.sanitize \
    > "$OUT/sanitizer.log" 2>&1; echo "memcheck: exit $? $(grep 'ERROR SUMMARY' "$OUT/sanitizer.log")" >> "$OUT/summary.txt"
fi
if [ -n "${SCHED:-}" ]; then
  timeout 420 python3 -m codegen.round run --schedules "$SCHED" --out "$OUT" ${ONLY:+--only $ONLY} > "$OUT/round.log" 2>&1
  echo "round: exit $?" >> "$OUT/summary.txt"
  tail -25 "$OUT/round.log"
fi
cat "$OUT/summary.txt"
