#!/usr/bin/env bash
# One device call: the 2-CTA cluster GEMMs' GPU tests and compute-sanitizer (memcheck, racecheck, synccheck) on the
# sanitizer's cluster case (cubins compiled on the CPU machine, carried in .cubin_cl). Logs under $OUT/cluster.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=$PWD/.cubin_cl
O=$OUT/cluster; mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$O/gpu.txt"
date -u +"%Y-%m-%d %H:%M UTC" >> "$O/gpu.txt"; echo "commit ${COMMIT:-?}" >> "$O/gpu.txt"
timeout "${TESTS_S:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k cluster \
  > "$O/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$O/gpu_tests.log")" >> "$O/gpu.txt"
for tool in memcheck racecheck synccheck; do
  timeout "${SAN_S:-90}" compute-sanitizer --tool $tool --error-exitcode 9 $([ $tool = memcheck ] && echo --report-api-errors no) \
    python3 -m bench sanitize cluster > "$O/sanitize_$tool.log" 2>&1
  echo "sanitizer $tool (cluster): exit $? $(grep -c PASS "$O/sanitize_$tool.log") PASS" >> "$O/gpu.txt"
done
cat "$O/gpu.txt"; grep -E "failed|Error|assert" "$O/gpu_tests.log" | head -5; tail -3 "$O/sanitize_racecheck.log"
