#!/usr/bin/env bash
# The device call of the peers study: install FlashAttention-4's wheels, unpack the cubins, run every row, report.
#
# `bash bench/peers/device.sh stage`: only keep the first wheel part (.whl/a, carried alone by a first call) for the
# next call. `bash bench/peers/device.sh`: join the wheel parts that are there (.whl/a, .whl/b, or loose .whl/*.whl),
# install them into /tmp/site (once per machine), unpack .cubin_peers_pack/cache.tar.xz (prepare's cubins and
# plans) and run `python -m bench peers run`, writing $OUT/h200.json and h200.md (copy them to results/peers/), the
# run's log and the install's. Without the wheels the run goes on and the fa4 key is absent from every row.
# Environment: STUDY (fa_interface: that study instead; PACK / CACHE: its cubin pack and cache folder), ONLY, LIMIT (a smoke run: LIMIT=2), BUDGET_S (start no row after this, default 470), RUN_S (the
# run's timeout, default 540), ROUNDS, SKIP (candidates not to run, e.g. fa4), COMMIT (the commit the report names).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/peers_out}
mkdir -p "$OUT" /tmp/peers_parts
if [ "${1:-}" = stage ]; then
  cp -f .whl/a/wheels.tar.* /tmp/peers_parts/ 2>/dev/null && ls -la /tmp/peers_parts || echo "no .whl/a here"
  exit 0
fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; echo "commit ${COMMIT:-?}"; } \
  > "$OUT/gpu.txt" 2>&1
if [ ! -d /tmp/site/flash_attn ]; then
  cp -f .whl/a/wheels.tar.* .whl/b/wheels.tar.* /tmp/peers_parts/ 2>/dev/null
  rm -rf /tmp/peers_whl && mkdir -p /tmp/peers_whl
  if ls .whl/*.whl >/dev/null 2>&1; then
    cp .whl/*.whl /tmp/peers_whl/
  elif [ -f /tmp/peers_parts/wheels.tar.00 ] && [ -f /tmp/peers_parts/wheels.tar.01 ]; then
    cat /tmp/peers_parts/wheels.tar.* | tar xf - -C /tmp/peers_whl || echo "the wheel parts do not join"
  fi
  if ls /tmp/peers_whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      /tmp/peers_whl/*.whl > "$OUT/install.log" 2>&1
    echo "wheels: pip install exit $?" | tee -a "$OUT/install.log"
  else
    echo "wheels: none here (carry .whl/a, then .whl/b): FlashAttention-4 will be absent" | tee "$OUT/install.log"
  fi
fi
if [ -d /tmp/site ]; then
  export PYTHONPATH="/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PACK=${PACK:-.cubin_peers_pack} CACHE=${CACHE:-.cubin_peers}
if [ -f "$PACK/cache.tar.xz" ]; then
  python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall('.')" "$PACK/cache.tar.xz"
fi
export PTSOLVE_CACHE_DIR="$PWD/$CACHE"
# FA4's compiled kernels on disk: a second call on the same machine (a run in parts) compiles none again
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4_cache
ls "$PTSOLVE_CACHE_DIR/cubin" 2>/dev/null | grep -c cubin | sed 's/^/cubins carried: /'
if ! python3 -c "import flash_attn.cute as f, importlib.metadata as m; print('fa4', m.version('flash-attn-4'))" \
  >> "$OUT/install.log" 2>&1; then
  echo "flash_attn.cute does not import (install.log): running without it"
  export PYTHONPATH="$PWD"  # a failed import (a crash even) stays out of the run: fa4 is absent, the report says why
fi
export PEERS_COMMAND="bash bench/peers/device.sh (STUDY=${STUDY:-peers} ONLY=${ONLY:-} LIMIT=${LIMIT:-} BUDGET_S=${BUDGET_S:-470})"
if [ "${STUDY:-peers}" = fa_interface ]; then  # issue 36's feature x head_dim study, on the same install
  timeout "${RUN_S:-540}" python3 -m bench fa_interface run --out "$OUT/h200.json" --only "${ONLY:-}" \
    --budget-s "${BUDGET_S:-470}" --rounds "${ROUNDS:-15}" > "$OUT/run.log" 2>&1
  echo "run: exit $?"; tail -"${TAIL:-30}" "$OUT/run.log" | cut -c1-300
  exit 0
fi
timeout "${RUN_S:-540}" python3 -m bench peers run --plans .cubin_peers/plans.json --out "$OUT/h200.json" \
  --only "${ONLY:-}" --limit "${LIMIT:-0}" --budget-s "${BUDGET_S:-470}" --rounds "${ROUNDS:-15}" --skip "${SKIP:-}" \
  > "$OUT/run.log" 2>&1
echo "run: exit $?"
grep -v -e Warning -e warn "$OUT/run.log" | tail -"${TAIL:-40}" | cut -c1-300
[ -f "$OUT/h200.md" ] && sed -n '/## Done when/,/## Absent/p' "$OUT/h200.md"
