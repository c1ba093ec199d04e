"""What compute-sanitizer runs: small launches of every operator's kernels (precompile first).

Results: results/sanitizer/, results/sanitizer_h200.md. ``python -m bench sanitize [args...]`` runs ``sanitize``;
``python -m bench sanitize <tool> [args...]`` another tool; ``python -m bench sanitize --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="sanitize")
