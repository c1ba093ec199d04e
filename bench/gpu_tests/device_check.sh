#!/usr/bin/env bash
# One device call: the GPU tests (every operator through lower + skeleton), the profiler on a few schedules, and
# compute-sanitizer (memcheck, racecheck, synccheck) on small launches of every operator. Needs the mamba_ssm wheel
# in .whl (baselines/build_mamba_wheel.sh) carried along. Writes logs under $OUT, prints a summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=/tmp/ptsolve_cache
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
t0=$(date +%s)
timeout 300 python3 -m pytest -q -m gpu tests/ -n 8 -p no:cacheprovider -rs > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log") ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"
mkdir -p /tmp/prof
timeout 150 python3 -m codegen.profile --schedules "${SCHED:-results/sched_new}" --only "${PROFILE:-FA3_cpsat,FA3_greedy}" \
  --out /tmp/prof > "$OUT/profile.log" 2>&1; tar czf "$OUT/profile.tgz" -C /tmp prof
tail -8 "$OUT/profile.log" >> "$OUT/summary.txt"
for tool in memcheck racecheck synccheck; do
  t1=$(date +%s)
  # memcheck: --report-api-errors no, since cuda-python probes driver entry points with cuGetProcAddress and the
  # misses count as API errors (host side, not the kernels)
  flags=$([ $tool = memcheck ] && echo "--report-api-errors no")
  timeout 150 compute-sanitizer --tool $tool $flags --error-exitcode 9 python3 -m bench sanitize >> "$OUT/sanitizer.log" 2>&1
  echo "sanitizer $tool: exit $? ($(( $(date +%s) - t1 )) s), $(grep -c 'ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitizer.log") clean summaries so far" | tee -a "$OUT/summary.txt"
done
grep -E "FAILED|ERROR" "$OUT/gpu_tests.log" | head -20 >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
