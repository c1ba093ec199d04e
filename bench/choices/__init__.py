"""Which structures the solver chooses, predicted against measured gain (no solver runs).

Results: results/choices_h200.md. ``python -m bench choices [args...]`` runs ``choices_report``; ``python -m bench
choices <tool> [args...]`` another tool; ``python -m bench choices --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="choices_report")
