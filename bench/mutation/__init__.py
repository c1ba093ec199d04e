"""Mutation testing of ptsolve's core modules (mutmut) and issue 10's listed mutations.

Results: results/mutation.md, results/mutation_baseline.md, results/listed_mutations.txt. ``python -m bench mutation
[args...]`` runs ``mutate``; ``python -m bench mutation <tool> [args...]`` another tool; ``python -m bench mutation
--help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="mutate")
