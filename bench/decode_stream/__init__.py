"""Long-cache decode: how much K/V ring per CTA streams fastest.

Results: results/decode_stream/. ``python -m bench decode_stream [args...]`` runs ``stream``; ``python -m bench
decode_stream <tool> [args...]`` another tool; ``python -m bench decode_stream --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="stream")
