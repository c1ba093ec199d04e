#!/usr/bin/env bash
# Mutation testing of ptsolve's core modules with mutmut ([tool.mutmut] in pyproject.toml lists the modules and
# the tests). Not part of .ci/run: about 1-2 hours on 2 cores. Hypothesis tests run 6 examples each under
# PTSOLVE_MUTATION=1 (tests/strategies.py: examples()) so every mutant gets the same, shorter, deterministic run.
# Writes results/mutation.md: score per module, date and commit.  Usage: scripts/mutate.sh [--max-children N]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "mutmut>=3.8,<3.9"
export PTSOLVE_MUTATION=1
rm -rf mutants
python3 -m mutmut run "$@" || true   # a non-zero exit only means survivors
python3 scripts/mutation_report.py > results/mutation.md
echo "wrote results/mutation.md"
