"""Correctness and timing of the HIP kernels on an AMD MI300X (never run: no AMD GPU).

Results: (none yet). ``python -m bench mi300x [args...]`` runs ``mi300x_check``; ``python -m bench mi300x <tool>
[args...]`` another tool; ``python -m bench mi300x --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="mi300x_check")
