#!/usr/bin/env bash
# One device call: sweep.py's timing of the model's 10 best GEMM schedules per shape next to cuBLAS (cubins compiled
# on the CPU machine, carried in .cubin_sk). Logs under $OUT/skinny.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=$PWD/.cubin_sk
O=$OUT/skinny; mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$O/gpu.txt"
date -u +"%Y-%m-%d %H:%M UTC" >> "$O/gpu.txt"; echo "commit ${COMMIT:-?}" >> "$O/gpu.txt"
timeout "${RUN_S:-400}" python3 -m bench gemm_skinny sweep run --out "$O/sweep.json" > "$O/sweep.log" 2>&1
echo "sweep: exit $?" >> "$O/gpu.txt"
cat "$O/gpu.txt"; grep -E "not timed|Error" "$O/sweep.log" | head
python3 -m bench gemm_skinny sweep report "$O/sweep.json"
