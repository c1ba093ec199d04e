"""The vector tasks' costs fitted from profiler timelines.

Results: results/task_costs/. ``python -m bench task_costs [args...]`` runs ``train``; ``python -m bench task_costs
<tool> [args...]`` another tool; ``python -m bench task_costs --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="train")
