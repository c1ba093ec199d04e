"""Measured selection for decode shapes (select, pick, confirm).

Results: results/decode_tune/. ``python -m bench decode_tune [args...]`` runs ``decode_tune``; ``python -m bench
decode_tune <tool> [args...]`` another tool; ``python -m bench decode_tune --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="decode_tune")
