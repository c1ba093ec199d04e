"""How well each placement rule predicts the GPU (CPU model against the H200 round).

Results: results/placement_h200.md. ``python -m bench placement [args...]`` runs ``placement_check``; ``python -m bench
placement <tool> [args...]`` another tool; ``python -m bench placement --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="placement_check")
