#!/usr/bin/env bash
# Mutation testing of ptsolve's core modules with mutmut ([tool.mutmut] in pyproject.toml lists the modules and
# the tests). Not part of .ci/run: about 1-2 hours on 2 cores. Hypothesis tests run 6 examples each under
# PTSOLVE_MUTATION=1 (tests/strategies.py: examples()) so every mutant gets the same, shorter, deterministic run.
# Writes results/mutation.md: score per module, date and commit.
# Usage: python3 -m bench mutation [--sample] [--max-children N]
#   --sample: only the mutants whose number ends in 0 (1 in 10 of every function's mutants; about 20 minutes on
#   2 cores); the full run takes several hours on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
python3 -m pip install -q "mutmut>=3.8,<3.9"
export PTSOLVE_MUTATION=1
pattern=()
if [[ "${1:-}" == "--sample" ]]; then pattern=("*__mutmut_*0"); shift; fi
rm -rf mutants
python3 -m mutmut run "$@" "${pattern[@]}" || true   # a non-zero exit only means survivors
python3 -m bench mutation mutation_report ${pattern:+--sample} > results/mutation.md
echo "wrote results/mutation.md"
