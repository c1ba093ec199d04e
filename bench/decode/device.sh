#!/usr/bin/env bash
# One device call for split-KV attention (issue 13), from a stage folder carrying the worktree and the cubins
# compiled on the CPU machine (.cache): the GPU tests of flash_decode (FA19's 2^32-element run is left to the
# bench), then bench/decode/decode_bench.py run on the committed plans. Logs and JSON under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=${PTSOLVE_CACHE_DIR:-$PWD/.cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$OUT/gpu.txt"
date -u +"%Y-%m-%d %H:%M UTC" >> "$OUT/gpu.txt"
timeout "${TESTS_S:-60}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_decode_gpu.py -k "not fa19" \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log")" >> "$OUT/gpu.txt"
timeout "${BENCH_S:-150}" python3 -m bench decode run --plans results/decode_h200/plans.json \
  --out "$OUT/decode.json" > "$OUT/decode.log" 2>&1
echo "bench: exit $?" >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"; tail -25 "$OUT/gpu_tests.log" | grep -E "passed|failed|Error|assert" | head -12; tail -8 "$OUT/decode.log"
