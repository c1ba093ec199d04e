"""Split-KV decode attention next to SDPA: prepare (CPU), run (GPU), report.

Results: results/decode_h200/, results/decode_h200.md. ``python -m bench decode [args...]`` runs ``decode_bench``;
``python -m bench decode <tool> [args...]`` another tool; ``python -m bench decode --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="decode_bench")
