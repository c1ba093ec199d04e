"""CP-SAT's polish A/B against the hand plan.

Results: results/polish/. ``python -m bench polish [args...]`` runs ``polish_ab``; ``python -m bench polish <tool>
[args...]`` another tool; ``python -m bench polish --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="polish_ab")
