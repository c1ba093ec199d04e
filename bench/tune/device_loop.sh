#!/usr/bin/env bash
# One device call closing the loop from a checkout: install (entry points for the `ptsolve profile` / tune plugins),
# the profiler and tune-runner GPU tests, `python3 -m codegen.tune_runner` on carried candidates (TUNE, default
# results/tune_h200/cands.json), `ptsolve profile` on one committed schedule (PROFILE, default FA3_cpsat) and,
# where AB names a script, that A/B. Carried cubin caches (.cubin*.tgz) are unpacked first so nvcc rarely runs.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=/tmp/ptc
mkdir -p $PTSOLVE_CACHE_DIR
for t in .cubin*.tgz; do [ -f "$t" ] && tar xzf "$t" -C $PTSOLVE_CACHE_DIR; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$OUT/summary.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1
echo "install: exit $? ($(command -v ptsolve))" >> "$OUT/summary.txt"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kernels_gpu.py \
  -k "profile_measures or tune_runner" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log")" >> "$OUT/summary.txt"
timeout 150 python3 -m codegen.tune_runner "${TUNE:-results/tune_h200/cands.json}" --out "$OUT/timed.json" > "$OUT/tune.log" 2>&1
echo "codegen.tune_runner: exit $?" >> "$OUT/summary.txt"; cat "$OUT/tune.log" >> "$OUT/summary.txt"
prof=(ptsolve profile); command -v ptsolve > /dev/null || prof=(python3 -m codegen.profile)  # no install: same code
timeout 120 "${prof[@]}" --schedules results/sched_new --only "${PROFILE:-FA3_cpsat}" --hw h200 \
  --out "$OUT/profile" > "$OUT/profile.log" 2>&1
echo "ptsolve profile: exit $?" >> "$OUT/summary.txt"; tail -4 "$OUT/profile.log" >> "$OUT/summary.txt"
if [ -n "${AB:-}" ]; then
  timeout 300 python3 "$AB" > "$OUT/ab.log" 2>&1
  echo "A/B $AB: exit $?" >> "$OUT/summary.txt"; tail -15 "$OUT/ab.log" >> "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
