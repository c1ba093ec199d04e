"""The measured-selection and fidelity study (prepare, precompile, run, report).

Results: results/study_h200/. ``python -m bench study [args...]`` runs ``study``; ``python -m bench study <tool>
[args...]`` another tool; ``python -m bench study --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="study")
