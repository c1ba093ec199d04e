#!/usr/bin/env bash
# One device call for ptsolve.torch (issue 11): the GPU tests of the custom ops (tests/gpu/test_torch_gpu.py: the shape
# matrix, varlen, torch.compile, CUDA graphs, opcheck) and bench/torch_ops/torch_bench.py (host overhead, a second process's
# first call, attention beside SDPA cuDNN, a transformers Llama with ptsolve attention, a LLaMA3-8B decoder layer).
# Run from a checkout whose $PTSOLVE_CACHE_DIR holds the class kernels' cubins (python3 -m ptsolve.serve
# precompile, on the CPU machine), so no nvcc runs here; writes everything under $OUT. QUICK=1: fewer shapes.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout, installed or not
: "${PTSOLVE_CACHE_DIR:?set PTSOLVE_CACHE_DIR to the carried cubin cache}"
S="$OUT/summary.txt"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  python3 -c "import mamba_ssm" 2>&1 | tail -1; echo "commit ${COMMIT:-?}"; } > "$S" 2>&1
timeout "${TEST_S:-200}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_torch_gpu.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit $? $(tail -1 "$OUT/gpu_tests.log")" >> "$S"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20 >> "$S"
timeout "${BENCH_S:-300}" python3 -m bench torch_ops --out "$OUT" ${QUICK:+--quick} ${SKIP:+--skip "$SKIP"} \
  > "$OUT/bench.log" 2>&1
echo "bench: exit $?" >> "$S"
cat "$S"
python3 - "$OUT/torch_bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k, v in d.items():
    print(k, json.dumps(v)[:600])
PY
