"""GEMM on held-out shapes; misaligned K rows.

Results: results/gemm_heldout/. ``python -m bench gemm_heldout <tool> [args...]``; ``python -m bench gemm_heldout
--help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default=None)
