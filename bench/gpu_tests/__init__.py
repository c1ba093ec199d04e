"""One device call validating main: every GPU test, compute-sanitizer, the profiler.

Results: results/gpu_tests_h200.md, results/sanitizer/. ``python -m bench gpu_tests [args...]`` runs ``device_final``;
``python -m bench gpu_tests <tool> [args...]`` another tool; ``python -m bench gpu_tests --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="device_final")
