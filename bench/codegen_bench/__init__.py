"""The generated GEMM and FlashAttention kernels checked and timed next to cuBLAS and SDPA.

Results: results/codegen_h200.md. ``python -m bench codegen_bench [args...]`` runs ``codegen_bench``; ``python -m bench
codegen_bench <tool> [args...]`` another tool; ``python -m bench codegen_bench --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="codegen_bench")
