"""Measured selection for the paper attention configurations, FA3 order among the candidates.

Results: results/fa_tune/. ``python -m bench fa_tune [args...]`` runs ``fa_tune``; ``python -m bench fa_tune <tool>
[args...]`` another tool; ``python -m bench fa_tune --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="fa_tune")
