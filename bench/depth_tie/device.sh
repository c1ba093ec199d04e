#!/usr/bin/env bash
# One device call for results/depth_tie (the ring-depth tie-break, ptsolve.policies.model.tie_key): each operator's
# schedules before and after it, timed in one process per operator. Cubins compiled on the CPU: GEMM's in
# .cubin_gemm (python3 -m bench gemm_space precompile), ChunkState's and decode's in .cubin_tie (see results/depth_tie/README.md).
set -uo pipefail
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
  date -u '+%Y-%m-%d %H:%M:%SZ'; echo "commit ${COMMIT:-unknown}"; } > "$OUT/device.txt"
PTSOLVE_CACHE_DIR=$PWD/.cubin_gemm timeout "${GEMM_S:-120}" python3 -m bench gemm_space run \
    results/depth_tie/cands_before.json results/depth_tie/cands_tie.json --out "$OUT" > "$OUT/gemm.log" 2>&1
echo "gemm: exit $?" >> "$OUT/device.txt"
PTSOLVE_CACHE_DIR=$PWD/.cubin_tie timeout "${MAMBA_S:-150}" python3 -m bench depth_tie mamba_tie \
    > "$OUT/mamba.log" 2>&1
echo "mamba: exit $?" >> "$OUT/device.txt"
PTSOLVE_CACHE_DIR=$PWD/.cubin_tie timeout "${DECODE_S:-240}" python3 -m bench decode run \
    --plans results/depth_tie/decode_plans_ab.json --out "$OUT/decode.json" > "$OUT/decode.log" 2>&1
echo "decode: exit $?" >> "$OUT/device.txt"
cat "$OUT/device.txt"; tail -4 "$OUT/gemm.log"; tail -12 "$OUT/mamba.log"; tail -3 "$OUT/decode.log"
