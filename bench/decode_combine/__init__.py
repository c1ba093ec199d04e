"""Split-KV decode's merge CTAs against the last piece merging alone.

Results: results/decode_combine/. ``python -m bench decode_combine [args...]`` runs ``combine_ab``; ``python -m bench
decode_combine <tool> [args...]`` another tool; ``python -m bench decode_combine --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="combine_ab")
