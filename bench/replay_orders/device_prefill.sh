#!/usr/bin/env bash
# One device call: prefill attention through the generic kernels of two schedule tables in one process
# (bench/torch_prefill/variants_ab.py --as-tabled: the table before the replay-chosen orders and the shipped one),
# then the GPU tests on the shipped table. Carry .cubin_pf (variants), .cubin_gen (the shipped table's generic
# kernels), .whl (pytest) and the old table (results/replay_orders/table_before.json). Logs under $OUT, summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
t0=$(date +%s)
PTSOLVE_CACHE_DIR=$PWD/.cubin_pf timeout 300 python3 -m bench torch_prefill variants_ab run --as-tabled \
  --tables results/replay_orders/table_before.json ptsolve/serve/schedule_table.json --out "$OUT/prefill_ab.json" \
  > "$OUT/prefill_ab.log" 2>&1
echo "prefill A/B: exit $? ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"
tail -4 "$OUT/prefill_ab.log" | tee -a "$OUT/summary.txt"
t1=$(date +%s)
PTSOLVE_CACHE_DIR=$PWD/.cubin_gen timeout 240 python3 -m pytest -q -m gpu tests/ -n 8 -p no:cacheprovider -rs \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log") ($(( $(date +%s) - t1 )) s)" | tee -a "$OUT/summary.txt"
grep -E "FAILED|ERROR" "$OUT/gpu_tests.log" | head -20 >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
