#!/usr/bin/env bash
# The HIP backend's compile checks (tests/codegen/test_hip.py) need Debian's clang-19 (HIP front end for gfx942 and the
# host compiler of the CPU emulation), lld-19 (links the gfx942 code object) and llvm-19 (llvm-objdump-19 for the
# ISA). Installs them when one is missing; quiet and idempotent. No ROCm is needed.
set -euo pipefail
need=0
for tool in clang-19 clang++-19 ld.lld-19 llvm-objdump-19; do
  command -v "$tool" >/dev/null 2>&1 || need=1
done
if [ "$need" = 1 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends clang-19 lld-19 llvm-19 >/dev/null
fi
