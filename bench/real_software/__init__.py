"""Real software: the wall times a newcomer meets (a cached answer, head_dim 96/256, --time-limit on every command,
the main job), measured on this machine.

Results: results/real_software/. ``python -m bench real_software [args...]`` runs ``timings``; ``python -m bench
real_software --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="timings")
