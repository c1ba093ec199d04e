"""GEMM's TMA-store epilogue against the register store.

Results: results/tma_store/. ``python -m bench tma_store [args...]`` runs ``tma_store_ab``; ``python -m bench tma_store
<tool> [args...]`` another tool; ``python -m bench tma_store --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="tma_store_ab")
