#!/usr/bin/env bash
# One device call for the models study (issue 37) and the torch face it rests on: unpack the cubins, run the GPU tests
# of ptsolve.torch (the decode and attention families, the kv-cache features, softcap decode), Mamba2's (the SSD
# forward, state passing, the decode step, the Mamba2 model) and the rows: the SSD and the decode step next to
# mamba_ssm, paged against unpaged decode, the host-time tools (decode_host, prefill_host), the prefill profile, the
# Llama rows and the Mamba2 model rows, writing everything under $OUT and printing a short table last. Make the pack on
# the CPU machine (`bash bench/models/pack.sh`) and carry it with mamba_ssm's wheel: run(..., carry=[".cubin_dev_pack",
# ".whl_mamba"]) (.whl_mamba: `bash baselines/build_mamba_wheel.sh`).
# Environment: PACK (default .cubin_dev_pack), TEST_S (each test step's timeout, default 240), ROUNDS (Llama decode
# segments, default 5), ROWS (Llama rows, default all), SSD_ROWS (the SSD rows, default all), M2_ROWS / M2_LAYERS
# (the Mamba2 model rows, default all; layers kept, default 8), M2_FLAGS (more flags of its command, default
# --torch-step: the decode rows also time the PyTorch recurrent step; M2_FLAGS= for none), SKIP (words among tests,
# ssd, paged, host, profile, llama, mamba2), COMMIT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PTSOLVE_EXACT=off
OUT=${OUT:-/tmp/models_out}
mkdir -p "$OUT" .cubin_dev
tar xJf "${PACK:-.cubin_dev_pack}/cache.tar.xz" -C . || { echo "no cubin pack: carry ${PACK:-.cubin_dev_pack}"; exit 2; }
export PTSOLVE_CACHE_DIR=$PWD/.cubin_dev
if ls .whl_mamba/*.whl > /dev/null 2>&1; then  # mamba_ssm's Python files (baselines.mamba2 loads its Triton kernels)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_mamba/*.whl > /dev/null 2>&1
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
S="$OUT/summary.txt"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit ${COMMIT:-?}"; } > "$S" 2>&1
skip() { [[ " ${SKIP:-} " == *" $1 "* ]]; }
if ! skip tests; then
  timeout "${TEST_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_torch_gpu.py \
    tests/gpu/test_torch_decode_gpu.py tests/gpu/test_attention_features_gpu.py tests/gpu/test_decode_softcap_gpu.py \
    > "$OUT/tests.log" 2>&1
  echo "gpu tests: exit $? $(tail -1 "$OUT/tests.log")" >> "$S"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20 >> "$S"
fi
if ! skip ssd; then  # Mamba2's SSD forward and model: their GPU tests, then the SSD rows next to mamba_ssm
  timeout "${TEST_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/gpu/test_ssd_gpu.py \
    tests/gpu/test_state_passing_gpu.py tests/gpu/test_ssm_step_gpu.py tests/gpu/test_mamba2_model_gpu.py \
    > "$OUT/ssd_tests.log" 2>&1
  echo "ssd tests: exit $? $(tail -1 "$OUT/ssd_tests.log")" >> "$S"
  grep -E "^(FAILED|ERROR)" "$OUT/ssd_tests.log" | head -20 >> "$S"
  timeout 300 python3 -m bench models ssd --commit "${COMMIT:-}" ${SSD_ROWS:+--rows "$SSD_ROWS"} \
    --out "$OUT/ssd_h200.json" > "$OUT/ssd.log" 2>&1
  echo "ssd bench: exit $?" >> "$S"
  for g in "" "--graphs"; do  # the decode step alone: host time in, then the GPU's time
    timeout 150 python3 -m bench models ssm_step --commit "${COMMIT:-}" $g \
      --out "$OUT/ssm_step${g:+_graphs}_h200.json" >> "$OUT/ssm_step.log" 2>&1
    echo "ssm_step bench ${g:-eager}: exit $?" >> "$S"
  done
fi
if ! skip paged; then
  timeout 90 python3 -m bench torch_decode paged --commit "${COMMIT:-}" --out "$OUT/paged.json" > "$OUT/paged.log" 2>&1
  echo "paged: exit $?" >> "$S"
fi
if ! skip host; then
  timeout 150 python3 -m bench models decode_host --out "$OUT" > "$OUT/decode_host.log" 2>&1
  timeout 90 python3 -m bench models prefill_host --out "$OUT" > "$OUT/prefill_host.log" 2>&1
fi
skip profile || timeout 150 python3 -m bench models prefill_profile --out "$OUT" > "$OUT/prefill_profile.log" 2>&1
if ! skip llama; then
  timeout 400 python3 -m bench models llama --rounds "${ROUNDS:-5}" ${ROWS:+--rows "$ROWS"} --commit "${COMMIT:-}" \
    --out "$OUT/h200.json" > "$OUT/llama.log" 2>&1
  echo "llama: exit $?" >> "$S"
fi
if ! skip mamba2; then
  timeout 300 python3 -m bench models mamba2 --layers "${M2_LAYERS:-8}" --commit "${COMMIT:-}" \
    ${M2_ROWS:+--rows "$M2_ROWS"} ${M2_FLAGS---torch-step} --out "$OUT/mamba2_h200.json" > "$OUT/mamba2.log" 2>&1
  echo "mamba2: exit $?" >> "$S"
fi
cat "$S"
for f in decode_host prefill_host; do [ -f "$OUT/$f.log" ] && grep "^|" "$OUT/$f.log" | tail -12; done
[ -f "$OUT/prefill_profile.log" ] && grep "prefill ms" "$OUT/prefill_profile.log"
[ -f "$OUT/ssd.log" ] && tail -12 "$OUT/ssd.log"
[ -f "$OUT/ssm_step.log" ] && tail -30 "$OUT/ssm_step.log"
[ -f "$OUT/paged.log" ] && tail -12 "$OUT/paged.log"
[ -f "$OUT/llama.log" ] && tail -16 "$OUT/llama.log"
[ -f "$OUT/mamba2.log" ] && tail -12 "$OUT/mamba2.log"
