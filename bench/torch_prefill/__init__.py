"""Prefill through ptsolve.torch next to SDPA on 85 shapes.

Results: results/torch_prefill/. ``python -m bench torch_prefill [args...]`` runs ``torch_prefill``; ``python -m bench
torch_prefill <tool> [args...]`` another tool; ``python -m bench torch_prefill --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="torch_prefill")
