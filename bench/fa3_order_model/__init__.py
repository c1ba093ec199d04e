"""How the cost model ranks the hand FA3 order against its free optimum (CPU).

Results: results/fa3_order_model.md. ``python -m bench fa3_order_model [args...]`` runs ``fa3_order_model``; ``python -m
bench fa3_order_model <tool> [args...]`` another tool; ``python -m bench fa3_order_model --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="fa3_order_model")
