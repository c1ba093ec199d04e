"""A/B in one process: the one lowering against the old per-op emitters, single fixes, turns, ring depths.

Results: results/ab/, results/skeleton_h200.md. ``python -m bench ab <tool> [args...]``; ``python -m bench ab --help``
lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default=None)
