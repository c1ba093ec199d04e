#!/bin/bash
# One device call: decode measured selection (select, pick, confirm) and the FA3-order profile
# (bench/fa_tune/profile_orders.py). Carry .cubin_dt, .cubin_po, results/decode_tune/sources.json and
# results/fa_tune/profile_sources.json (compiled / written on the CPU).
set -u
D=results/decode_tune
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tree: $(git rev-parse HEAD) + uncommitted"
  date -u; } > $OUT/gpu.txt
export PTSOLVE_CACHE_DIR=$PWD/.cubin_dt
python3 $D/decode_tune.py select --out $OUT/select > $OUT/select.log 2>&1 \
  && python3 $D/decode_tune.py pick $OUT/select/select.json > $OUT/pick.log 2>&1 && cp $D/picks.json $OUT/ \
  && python3 $D/decode_tune.py confirm --out $OUT/confirm > $OUT/confirm.log 2>&1
echo "decode rc=$?"
[ -n "${FA_PROFILE:-}" ] && PTSOLVE_CACHE_DIR=$PWD/.cubin_po python3 -m bench fa_tune profile_orders run --out $OUT/fa_profile > $OUT/fa_profile.log 2>&1
echo "fa profile rc=$?"
grep -v -e Warning -e "return F" $OUT/select.log | tail -22
cat $OUT/pick.log
grep -v -e Warning -e "return F" $OUT/confirm.log | tail -22
tail -4 $OUT/fa_profile.log | cut -c1-1500
