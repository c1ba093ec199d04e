"""The exact solver's first choice against the hand FA3-order plan.

Results: results/first_choice/. ``python -m bench first_choice [args...]`` runs ``first_choice_ab``; ``python -m bench
first_choice <tool> [args...]`` another tool; ``python -m bench first_choice --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="first_choice_ab")
