"""The issue order chosen by the asap replay, next to the formula's and the hand plan.

Results: results/replay_orders/. ``python -m bench replay_orders [args...]`` runs ``replay_orders_ab``; ``python -m
bench replay_orders <tool> [args...]`` another tool; ``python -m bench replay_orders --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="replay_orders_ab")
