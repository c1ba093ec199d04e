#!/usr/bin/env bash
# One device call: flash_decode's GPU tests and compute-sanitizer on the merge CTAs, then combine_ab.py's comparison (cubins compiled on
# the CPU machine and carried in .cubin_dc). Logs and JSON under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=$PWD/.cubin_dc
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$OUT/gpu.txt"
date -u +"%Y-%m-%d %H:%M UTC" >> "$OUT/gpu.txt"
echo "commit ${COMMIT:-unknown}" >> "$OUT/gpu.txt"  # the device copy's own git HEAD is not this tree's
timeout "${TESTS_S:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_decode_gpu.py -k "not fa19" \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log")" >> "$OUT/gpu.txt"
for tool in memcheck racecheck synccheck; do  # the merge CTAs' protocol under the sanitizer (small shapes)
  timeout "${SAN_S:-120}" compute-sanitizer --tool $tool --error-exitcode 9 $([ $tool = memcheck ] && echo --report-api-errors no) python3 -m bench sanitize decode \
    > "$OUT/sanitize_$tool.log" 2>&1
  echo "sanitizer $tool: exit $? $(grep -c PASS "$OUT/sanitize_$tool.log") PASS" >> "$OUT/gpu.txt"
done
timeout "${AB_S:-400}" python3 -m bench decode_combine combine_ab run --out "$OUT/ab.json" > "$OUT/ab.log" 2>&1
echo "ab: exit $?" >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"; grep -E "passed|failed|Error|assert" "$OUT/gpu_tests.log" | head -8; grep -E "not timed|Error" "$OUT/ab.log" | head; sed -n '/^done in/,$p' "$OUT/ab.log"
