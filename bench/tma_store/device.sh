#!/usr/bin/env bash
# One device call (issue 13, TMA-store epilogue): every candidate of results/tma_store/cands*.json (the A/B pairs and
# the model's first choices) and of the earlier first choice and tuned pick (results/depth_tie/cands_tie.json,
# cands_pick.json) checked at its full shape and timed next to cuBLAS in one process (python3 -m bench gemm_space run); the
# profiler on the schedules of results/tma_store/sched (the store tasks' cycles for bench/tma_store/store_fit.py);
# the PyTorch path's GEMM before / after its class was re-solved (bench/tma_store/torch_gemm_ab.py); then the GEMM
# GPU tests. Carry .cubin_tsz (the prepare steps' PTSOLVE_CACHE_DIR .cubin_ts as c.tgz, .cubin_gen as g.tgz) and .whl.
# Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
if [ -f .cubin_tsz/c.tgz ]; then mkdir -p .cubin_ts && tar xzf .cubin_tsz/c.tgz -C .cubin_ts; fi  # carried compressed
if [ -f .cubin_tsz/g.tgz ]; then mkdir -p .cubin_gen && tar xzf .cubin_tsz/g.tgz -C .cubin_gen; fi  # generic kernels
export PYTHONPATH=/tmp/site:$PWD PTSOLVE_CACHE_DIR=$PWD/.cubin_ts
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
git rev-parse --short HEAD >> "$OUT/summary.txt"; date -u +%FT%TZ >> "$OUT/summary.txt"
t0=$(date +%s)
timeout 300 python3 -m bench gemm_space run results/tma_store/cands.json results/tma_store/cands_model.json \
  results/depth_tie/cands_tie.json results/depth_tie/cands_pick.json --out "$OUT" > "$OUT/run.log" 2>&1
echo "run: exit $? ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"
held=$(python3 -c "from bench.gemm_space.gemm_space import HELDOUT; print(','.join(h[0] for h in HELDOUT))")
timeout 200 python3 -m bench gemm_space run results/tma_store/cands_heldout.json results/gemm_heldout/cands.json \
  results/gemm_heldout/cands_misaligned.json --only "$held" --out "$OUT/heldout" > "$OUT/heldout.log" 2>&1
echo "held-out run: exit $? ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"
t1=$(date +%s)
only=$(ls results/tma_store/sched/*.json | xargs -n1 basename | sed 's/\.json$//' | paste -sd, -)
timeout 120 python3 -m codegen.profile --schedules results/tma_store/sched --only "$only" --out /tmp/prof \
  > "$OUT/profile.log" 2>&1
echo "profile: exit $? ($(( $(date +%s) - t1 )) s)" | tee -a "$OUT/summary.txt"
(cd /tmp/prof && tar czf "$OUT/prof.tgz" *.profile.json)
t3=$(date +%s)
PTSOLVE_CACHE_DIR=$PWD/.cubin_gen timeout 150 python3 -m bench tma_store torch_gemm_ab run --out "$OUT" \
  > "$OUT/torch_gemm_ab.log" 2>&1
echo "torch gemm A/B: exit $? ($(( $(date +%s) - t3 )) s)" | tee -a "$OUT/summary.txt"
t2=$(date +%s)
PTSOLVE_CACHE_DIR=$PWD/.cubin_gen timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_kernels_gpu.py \
  tests/gpu/test_torch_gpu.py tests/serve/test_shape_classes.py -k "gemm" -n 8 -p no:cacheprovider -rs > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log") ($(( $(date +%s) - t2 )) s)" | tee -a "$OUT/summary.txt"
grep -E "FAILED|ERROR" "$OUT/gpu_tests.log" | head -20 >> "$OUT/summary.txt"
grep -i "failed" "$OUT/run.log" | head >> "$OUT/summary.txt"
python3 -m bench tma_store report results/tma_store/cands.json "$OUT/gemm_space.json" > "$OUT/table.md" 2>&1
python3 -m bench tma_store report-model "$OUT/gemm_space.json" model tie pick coop_reg ping_reg coop_tma \
  ping_tma > "$OUT/model.md" 2>&1
python3 -m bench tma_store report-model "$OUT/heldout/gemm_space.json" model heldout_c0 heldout_c1 heldout_c2 mis \
  > "$OUT/heldout.md" 2>&1
tail -5 "$OUT/table.md"; head -11 "$OUT/model.md"; head -11 "$OUT/heldout.md"; tail -3 "$OUT/torch_gemm_ab.log"
cat "$OUT/summary.txt"
