"""The paper-suite GPU round: the schedules as kernels next to the libraries (prepare, compile, run).

Results: results/schedules_h200/, results/sched_new/, results/sched_polish/, results/profile_h200/,
results/round_*_h200.md, results/mamba_h200.md, results/turns_h200.md. ``python -m bench round [args...]`` runs
``round``; ``python -m bench round <tool> [args...]`` another tool; ``python -m bench round --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="round")
