#!/bin/bash
# GEMM on held-out shapes (bench gemm_space HELDOUT): the model's 3 best (c0 = optimize's answer) next to cuBLAS.
# Carry .cubin_gh (python3 -m bench gemm_space precompile results/gemm_heldout/cands.json on the CPU).
set -u
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tree: $(git rev-parse HEAD)"; date -u; } \
  > $OUT/gpu.txt
H=$(python3 -c "from bench.gemm_space.gemm_space import HELDOUT; print(','.join(h[0] for h in HELDOUT))")
PTSOLVE_CACHE_DIR=$PWD/.cubin_gh python3 -m bench gemm_space run results/gemm_heldout/cands.json --only $H \
  --out $OUT > $OUT/run.log 2>&1
echo "rc=$?"
tail -14 $OUT/run.log
