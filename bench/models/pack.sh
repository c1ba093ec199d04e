#!/usr/bin/env bash
# The cubins a device call of bench/models/device.sh loads, compiled here (nvcc, sm_90a) so the GPU machine only checks
# and times: every serving class kernel and variant (python -m ptsolve.serve precompile) and the exact-shape kernels
# of the state-passing and decode-step GPU tests, packed as .cubin_dev_pack/cache.tar.xz (entries
# .cubin_dev/cubin/<key>.*; the whole cache folder, so a kernel compiled here for any other GPU test travels too).
# Carry .cubin_dev_pack.
set -euo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PTSOLVE_CACHE_DIR=$PWD/.cubin_dev
python3 -m ptsolve.serve precompile > /dev/null
python3 -c "import sys; sys.path[:0] = ['tests', 'tests/gpu']; import test_state_passing_gpu as t; \
import test_ssm_step_gpu as s; from codegen.harness import precompile; precompile(t.plans() + s.plans())"
mkdir -p .cubin_dev_pack
tar cJf .cubin_dev_pack/cache.tar.xz .cubin_dev/cubin
size=$(stat -c %s .cubin_dev_pack/cache.tar.xz)
echo "$(ls .cubin_dev/cubin | grep -c '\.cubin$') cubins, $((size / 1000000)) MB in .cubin_dev_pack/cache.tar.xz"
[ "$size" -lt 60000000 ] || { echo "over the 64 MiB a device call carries: clear .cubin_dev and run again"; exit 1; }
