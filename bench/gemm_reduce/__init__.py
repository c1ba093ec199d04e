"""Split-K GEMM's reduce CTAs against the last split alone.

Results: results/gemm_reduce/. ``python -m bench gemm_reduce [args...]`` runs ``reduce_ab``; ``python -m bench
gemm_reduce <tool> [args...]`` another tool; ``python -m bench gemm_reduce --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="reduce_ab")
