#!/usr/bin/env bash
# FlashAttention-4's wheels for the GPU machine (no network there): download into .whl/, split in two when over a call.
#
# Exactly what flash-attn-4 needs beyond what the device has (Python 3.12, torch 2.11.0+cu130, cuda-bindings, einops,
# protobuf, typing-extensions): the CUDA 13 flavour of the CuTe DSL's libraries (the device's driver 580 is CUDA 13.0),
# never torch or nvidia-* CUDA 12 libraries. Each wheel's Requires-Dist is checked against this list and the device's.
# Over LIMIT_MIB (54: a call carries 64 MiB with the ~8 MiB working tree) the wheels are also written as one tar
# split in two, .whl/a (the first SPLIT_MIB, default 50) and .whl/b (the rest), for two device calls
# (bench/peers/__init__.py; device.sh joins them). Run from the repository root: bash bench/peers/wheels.sh
set -euo pipefail
D=${WHL_DIR:-.whl}
SPLIT_MIB=${SPLIT_MIB:-50}
LIMIT_MIB=${LIMIT_MIB:-54}
WHEELS=(flash-attn-4==4.0.0b40 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
        apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5)
# on the device already, or not needed there (libs-cu12: the cu13 flavour stands in; strenum: Python < 3.11 only)
DEVICE_HAS="torch einops typing-extensions cuda-bindings protobuf nvidia-cutlass-dsl-libs-cu12 backports-strenum"
mkdir -p "$D"
rm -rf "$D/a" "$D/b"
for w in "${WHEELS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$D" "$w"
done
norm() { tr 'A-Z_.' 'a-z--'; }
have=$(for w in "$D"/*.whl; do basename "$w" | cut -d- -f1 | norm; done; for n in $DEVICE_HAS; do echo "$n"; done)
missing=0
for w in "$D"/*.whl; do
  reqs=$(unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' |
         sed -E 's/^Requires-Dist: *([A-Za-z0-9_.-]+).*/\1/' | norm)
  for r in $reqs; do
    if ! grep -qx "$r" <<<"$have"; then echo "MISSING: $(basename "$w") requires $r"; missing=1; fi
  done
done
n=0; total=0
for w in "$D"/*.whl; do
  s=$(stat -c %s "$w"); total=$((total + s)); n=$((n + 1))
  printf '%8.1f MiB  %s\n' "$(echo "$s / 1048576" | bc -l)" "$(basename "$w")"
done
printf '%8.1f MiB  total, %d wheels\n' "$(echo "$total / 1048576" | bc -l)" "$n"
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  mkdir -p "$D/a" "$D/b"
  (cd "$D" && tar cf - ./*.whl) | split -b "${SPLIT_MIB}m" -d -a 2 - "$D/a/wheels.tar."
  for p in "$D"/a/wheels.tar.*; do [ "$(basename "$p")" = wheels.tar.00 ] || mv "$p" "$D/b/"; done
  du -sh "$D/a" "$D/b"
  echo "over ${LIMIT_MIB} MiB: carry .whl/a in one device call and .whl/b in the next (bench/peers/device.sh joins them)"
fi
exit $missing
