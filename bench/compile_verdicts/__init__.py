"""What ptxas says about each policy's schedules: greedy's, CP-SAT's and the declared (FA3) issue order's.

Results: results/compile_verdicts/README.md. ``python -m bench compile_verdicts [--hw h100] [--out DIR]`` runs
``verdicts`` (CPU with nvcc; no GPU).
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="verdicts")
