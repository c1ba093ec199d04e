#!/usr/bin/env bash
# One device call for results/gemm_space_h200.md (run from the repository root on the GPU machine, $OUT set):
# every carried schedule of results/gemm_space_h200/cands_*.json checked at its full shape and timed next to cuBLAS
# (python3 -m bench gemm_space run), then the GPU correctness tests of the GEMM kernels (split-K, odd N included).
# Cubins come from $PTSOLVE_CACHE_DIR (compiled beforehand on the CPU: `python3 -m bench gemm_space precompile`).
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$OUT/device.txt"
date -u '+%Y-%m-%d %H:%M:%SZ' >> "$OUT/device.txt"
timeout ${RUN_S:-300} python3 -m bench gemm_space run results/gemm_space_h200/cands_*.json --out "$OUT" > "$OUT/run.log" 2>&1
echo "gemm_space run: exit $?" >> "$OUT/device.txt"
timeout ${TESTS_S:-200} python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k "gemm" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log")" >> "$OUT/device.txt"
cat "$OUT/device.txt"; tail -50 "$OUT/run.log"
