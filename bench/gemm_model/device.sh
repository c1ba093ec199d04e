#!/usr/bin/env bash
# One device call for results/gemm_model (run from the repository root on the GPU machine, $OUT set): the model's
# first choices before (results/gemm_space_h200/cands_pp2.json, label pp2, with that file's other candidates) and after
# GEMM's own fitted constants (results/gemm_model/cands_fit.json, label fit) checked at full shape and timed next to
# cuBLAS in one process (python3 -m bench gemm_space run); then the GEMM and Mamba2 GPU tests, whose plans the changed model
# now chooses. Cubins come from $PTSOLVE_CACHE_DIR (compiled beforehand on the CPU).
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$OUT/device.txt"
date -u '+%Y-%m-%d %H:%M:%SZ' >> "$OUT/device.txt"
echo "commit ${COMMIT:-unknown}" >> "$OUT/device.txt"
timeout ${RUN_S:-300} python3 -m bench gemm_space run results/gemm_space_h200/cands_pp2.json \
    results/gemm_model/cands_fit.json --out "$OUT" > "$OUT/run.log" 2>&1
echo "gemm_space run: exit $?" >> "$OUT/device.txt"
timeout ${TESTS_S:-200} python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kernels_gpu.py \
    -k "gemm or chunk or mamba" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log")" >> "$OUT/device.txt"
cat "$OUT/device.txt"; tail -50 "$OUT/run.log"
