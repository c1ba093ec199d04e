"""The ring-depth tie-break per operator, and GEMM's measured selection.

Results: results/depth_tie/, results/polish/ (device_tune_polish). ``python -m bench depth_tie <tool> [args...]``;
``python -m bench depth_tie --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default=None)
