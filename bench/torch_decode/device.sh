#!/bin/bash
# One device call: the PyTorch-op GPU tests, then decode through ptsolve.torch next to SDPA (torch_decode.py).
# Carry .cubin_td (the generic kernels, compiled on the CPU: PTSOLVE_CACHE_DIR=.cubin_td python3 -m ptsolve.serve
# precompile). TESTS: the test files to run ("" for none); ONLY: torch_decode.py's --only filter.
set -u
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/gpu.txt
export PTSOLVE_CACHE_DIR=$PWD/.cubin_td
if [ -n "${TESTS:-}" ]; then
  python3 -m pytest -q -m gpu $TESTS -n 8 -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|Error|error" $OUT/gpu_tests.log | tail -15
fi
python3 -m bench torch_decode torch_decode --out $OUT/torch_decode.json --only "${ONLY:-}" > $OUT/run.log 2>&1
echo "run rc=$?"
grep -v -e Warning -e "return F" $OUT/run.log | tail -${TAIL:-30} | cut -c1-400
