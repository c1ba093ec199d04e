"""The FA3 order as a schedule the exact solver returns, next to the hand plan.

Results: results/orders_ab/. ``python -m bench orders_ab [args...]`` runs ``orders_ab``; ``python -m bench orders_ab
<tool> [args...]`` another tool; ``python -m bench orders_ab --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="orders_ab")
