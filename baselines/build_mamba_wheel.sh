#!/usr/bin/env bash
# Build a pure-Python wheel of mamba-ssm (only its Python files: no CUDA extensions) into ./.whl,
# so that the GPU machine, which has no internet, can install it with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#
# Why not `MAMBA_SKIP_CUDA_BUILD=TRUE pip wheel mamba-ssm==...`: the sdist's setup.py imports torch at
# the top even when the CUDA build is skipped, and this (CPU) machine has no torch. So we fetch the
# sdist (pip download saves it before it fails to read the metadata, hence the fallback via the URL pip
# prints), replace setup.py with a 3-line pure-Python one, and build that. The package's own files are
# unchanged; baselines/mamba2.py imports only mamba_ssm.ops.triton.* without running mamba_ssm/__init__.py.
#
# Usage (from the repository root): bash baselines/build_mamba_wheel.sh
set -euo pipefail
VERSION=2.3.2.post1
ROOT=$(pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
# Find the sdist's URL through pip's ordinary resolver, then fetch that one file.
url=$(pip download -vvv --no-deps --no-binary :all: "mamba-ssm==$VERSION" -d . 2>&1 \
      | grep -oE "https://[^ \"]*mamba_ssm-$VERSION\.tar\.gz" | head -1 || true)
[ -f "mamba_ssm-$VERSION.tar.gz" ] || curl -sSLO "$url"
tar xzf "mamba_ssm-$VERSION.tar.gz"
cd "mamba_ssm-$VERSION"
cat > setup.py <<EOF
from setuptools import find_packages, setup

setup(version="$VERSION", packages=find_packages(include=["mamba_ssm", "mamba_ssm.*"]))
EOF
rm -rf csrc
mkdir -p "$ROOT/.whl"
pip wheel --no-deps -w "$ROOT/.whl" . >/dev/null
ls -la "$ROOT/.whl"
