"""GEMM on the shapes furthest from cuBLAS: sweeps, clusters, ring deepening, A's box rows.

Results: results/gemm_skinny/. ``python -m bench gemm_skinny <tool> [args...]``; ``python -m bench gemm_skinny --help``
lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default=None)
