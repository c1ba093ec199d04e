#!/usr/bin/env bash
# One device call for issue 8's acceptance (results/skeleton_h200.md): the old round's exact kernels next to the
# library's now, in one process (bench/ab/round_ab.py; CS9, whose 16 GiB inputs want the memory to themselves, in
# a process of its own), then the paper round on the current schedules (codegen.round run --schedules
# results/sched_new). Carry .whl (mamba_ssm) and $PTSOLVE_CACHE_DIR with the cubins compiled on the CPU
# (`round_ab.py compile`, `codegen.round compile --schedules results/sched_new`). Logs under $OUT, summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_COMPILE_CHECK=0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
S="$OUT/summary.txt"
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
  echo "commit ${COMMIT:-?}"; } > "$S"
rest=$(python3 -c "from bench.ab import round_ab
print(','.join(c for c in round_ab.CONFIGS if c != 'CS9'))")
AB_ONLY=$rest timeout "${AB_S:-240}" python3 -m bench ab round_ab > "$OUT/round_ab.log" 2>&1
echo "round_ab: exit $?" >> "$S"
AB_ONLY=CS9 timeout 120 python3 -m bench ab round_ab > "$OUT/round_ab_cs9.log" 2>&1
echo "round_ab CS9: exit $?" >> "$S"
timeout "${ROUND_S:-400}" python3 -m bench round run --schedules results/sched_new --out "$OUT" > "$OUT/round.log" 2>&1
echo "round: exit $?" >> "$S"
tail -25 "$OUT/round_ab.log"; tail -2 "$OUT/round_ab_cs9.log"; tail -24 "$OUT/round.log"; cat "$S"
