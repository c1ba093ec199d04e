#!/usr/bin/env bash
# One device call: GEMM's measured selection (ptsolve tune --per pingpong -k 3's candidates, results/depth_tie/
# cands_tune.json) timed next to the first choice and cuBLAS, the pick re-timed in a run of its own; then CP-SAT's
# polish A/B (bench/polish/polish_ab.py). Cubins compiled on the CPU into .cubin_gt (the candidates' cubins of .cubin_gemm) and .cubin_pol.
set -uo pipefail
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
  date -u '+%Y-%m-%d %H:%M:%SZ'; echo "commit ${COMMIT:-unknown}"; } > "$OUT/device.txt"
mkdir -p "$OUT/select" "$OUT/confirm"
export PTSOLVE_CACHE_DIR=$PWD/.cubin_gt
timeout 150 python3 -m bench gemm_space run results/depth_tie/cands_tie.json results/depth_tie/cands_tune.json \
    --out "$OUT/select" > "$OUT/select/run.log" 2>&1
echo "select: exit $?" >> "$OUT/device.txt"
python3 -m bench depth_tie tune_pick "$OUT/select/gemm_space.json" results/depth_tie/cands_tune.json \
    "$OUT/cands_pick.json" > "$OUT/pick.log" 2>&1
timeout 120 python3 -m bench gemm_space run results/depth_tie/cands_tie.json "$OUT/cands_pick.json" \
    --out "$OUT/confirm" > "$OUT/confirm/run.log" 2>&1
echo "confirm: exit $?" >> "$OUT/device.txt"
PTSOLVE_CACHE_DIR=$PWD/.cubin_pol timeout 200 python3 -m bench polish polish_ab > "$OUT/polish.log" 2>&1
echo "polish: exit $?" >> "$OUT/device.txt"
cat "$OUT/device.txt"; tail -3 "$OUT/confirm/run.log"; tail -16 "$OUT/polish.log"
