"""`ptsolve tune` end to end on the GPU, and the profiler plugin.

Results: results/tune_h200/. ``python -m bench tune [args...]`` runs ``device_loop``; ``python -m bench tune <tool>
[args...]`` another tool; ``python -m bench tune --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="device_loop")
