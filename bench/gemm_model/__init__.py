"""GEMM's own cost-model constants fitted on measured kernels.

Results: results/gemm_model/. ``python -m bench gemm_model [args...]`` runs ``fit``; ``python -m bench gemm_model <tool>
[args...]`` another tool; ``python -m bench gemm_model --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="fit")
