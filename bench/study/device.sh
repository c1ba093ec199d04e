#!/usr/bin/env bash
# One device call: bench study run over results/study_h200/candidates.json (checks, times next to the libraries,
# profiles of the training configurations), with the cubins compiled beforehand on the CPU
# (`PTSOLVE_CACHE_DIR=.cubin python3 -m bench study precompile ...; tar czf .cubin.tgz -C .cubin .`) carried as
# .cubin.tgz and the mamba_ssm wheel as .whl. ONLY picks configurations. Writes $OUT/study.json and the log.
set -uo pipefail
export PYTHONUNBUFFERED=1 PTSOLVE_CACHE_DIR=/tmp/ptc
mkdir -p /tmp/ptc && tar xzf .cubin.tgz -C /tmp/ptc
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
[ -f "$OUT/study.json" ] || cp -f results/study_h200/study.json "$OUT/" 2>/dev/null || true
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout "${LIMIT:-540}" python3 -m bench study run results/study_h200/candidates.json --out "$OUT" ${ONLY:+--only $ONLY} \
  > "$OUT/study.log" 2>&1
echo "study: exit $?"
grep -v "^check\|Warning\|warn(" "$OUT/study.log" | tail -30
