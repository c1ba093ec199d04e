"""The GEMM schedule space on 45 shapes timed next to cuBLAS (prepare, precompile, run, report).

Results: results/gemm_space_h200/, results/gemm_space_h200.md. ``python -m bench gemm_space [args...]`` runs
``gemm_space``; ``python -m bench gemm_space <tool> [args...]`` another tool; ``python -m bench gemm_space --help``
lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="gemm_space")
