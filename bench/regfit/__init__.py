"""The register model against ptxas.

Results: results/regfit_h100.md. ``python -m bench regfit [args...]`` runs ``regfit``; ``python -m bench regfit <tool>
[args...]`` another tool; ``python -m bench regfit --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="regfit")
