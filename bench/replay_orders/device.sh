#!/usr/bin/env bash
# One device call: bench/replay_orders/replay_orders_ab.py's A/B (the solver's answer with the replay-chosen order, the formula's
# pick, the hand FA3-order plan) from cubins compiled on the CPU (carry .cubin_replay). Log under $OUT, table last.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=$PWD/.cubin_replay
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
t0=$(date +%s)
timeout 480 python3 -m bench replay_orders > "$OUT/replay_orders_h200.log" 2>&1
echo "replay_orders_ab: exit $? ($(( $(date +%s) - t0 )) s)" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"; tail -16 "$OUT/replay_orders_h200.log"
