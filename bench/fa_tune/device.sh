#!/usr/bin/env bash
# One device call: fa_tune.py's select run (every candidate, the committed exact schedule and the hand plan), the
# pick, then the confirm run (pick vs exact vs hand, a second time). Cubins carried in .cubin_fat. Logs under $OUT/fa.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=$PWD/.cubin_fat
O=$OUT/fa; mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader > "$O/gpu.txt"
date -u +"%Y-%m-%d %H:%M UTC" >> "$O/gpu.txt"
timeout "${SELECT_S:-280}" python3 -m bench fa_tune fa_tune > "$O/select.log" 2>&1
echo "select: exit $?" >> "$O/gpu.txt"
python3 -m bench fa_tune fa_tune pick "$O/select.log" > "$O/pick.log" 2>&1 && cp results/fa_tune/picks.json "$O/"
FA_TUNE=confirm timeout "${CONFIRM_S:-200}" python3 -m bench fa_tune fa_tune > "$O/confirm.log" 2>&1
echo "confirm: exit $?" >> "$O/gpu.txt"
cat "$O/gpu.txt" "$O/pick.log"; sed -n '/^| schedule/,$p' "$O/select.log"; sed -n '/^| schedule/,$p' "$O/confirm.log"
