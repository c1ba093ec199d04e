"""Decode through ptsolve.torch next to SDPA, and the A/Bs of its binary choices.

Results: results/torch_decode/. ``python -m bench torch_decode [args...]`` runs ``torch_decode``; ``python -m bench
torch_decode <tool> [args...]`` another tool; ``python -m bench torch_decode --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="torch_decode")
