#!/usr/bin/env bash
# One device call for the ping-pong section of results/gemm_space_h200.md (run from the repository root on the GPU
# machine, $OUT set): the ping-pong candidates (results/gemm_space_h200/cands_pp*.json: the model's choice in the
# whole space, its cooperative and ping-pong parts, the ping-pong top 3, the probes) checked at full shape and timed
# next to cuBLAS (python3 -m bench gemm_space run), then the GEMM GPU tests (ping-pong, split-K, cooperative).
# Cubins come from $PTSOLVE_CACHE_DIR (compiled beforehand on the CPU: `python3 -m bench gemm_space precompile`).
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$OUT/device.txt"
date -u '+%Y-%m-%d %H:%M:%SZ' >> "$OUT/device.txt"
timeout ${RUN_S:-240} python3 -m bench gemm_space run results/gemm_space_h200/cands_pp*.json --out "$OUT" > "$OUT/run.log" 2>&1
echo "gemm_space run: exit $?" >> "$OUT/device.txt"
timeout ${TESTS_S:-150} python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k "gemm" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log")" >> "$OUT/device.txt"
cat "$OUT/device.txt"; tail -50 "$OUT/run.log"
