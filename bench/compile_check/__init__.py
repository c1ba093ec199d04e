"""How often the compiler in the loop moves on from the model's first tiling.

Results: results/compile_check_h200.md. ``python -m bench compile_check [args...]`` runs ``compile_check_suite``;
``python -m bench compile_check <tool> [args...]`` another tool; ``python -m bench compile_check --help`` lists the
tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="compile_check_suite")
