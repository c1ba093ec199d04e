#!/usr/bin/env bash
# One device call: split-K GEMM's GPU tests and compute-sanitizer on the reduce CTAs (and flash_decode's merge CTAs),
# then reduce_ab.py's comparison (cubins compiled on the CPU machine, carried in .cubin_gr). Logs under $OUT/gemm.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=$PWD/.cubin_gr
O=$OUT/gemm; mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$O/gpu.txt"
date -u +"%Y-%m-%d %H:%M UTC" >> "$O/gpu.txt"
timeout "${TESTS_S:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k split_k \
  > "$O/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$O/gpu_tests.log")" >> "$O/gpu.txt"
for tool in memcheck racecheck synccheck; do
  timeout "${SAN_S:-90}" compute-sanitizer --tool $tool --error-exitcode 9 $([ $tool = memcheck ] && echo --report-api-errors no) \
    python3 -m bench sanitize split > "$O/sanitize_$tool.log" 2>&1
  echo "sanitizer $tool (split-K): exit $? $(grep -c PASS "$O/sanitize_$tool.log") PASS" >> "$O/gpu.txt"
done
timeout "${AB_S:-200}" python3 -m bench gemm_reduce reduce_ab run --out "$O/ab.json" > "$O/ab.log" 2>&1
echo "ab: exit $?" >> "$O/gpu.txt"
cat "$O/gpu.txt"; grep -E "failed|Error|assert" "$O/gpu_tests.log" | head -5; grep -E "not timed|Error" "$O/ab.log" | head
sed -n '/^| shape/,$p' "$O/ab.log"
