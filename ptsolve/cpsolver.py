"""The CP-SAT solver with ptsolve's settings, shared by the schedule model (ptsolve.policies.cpsat) and the exact
CTA placement (ptsolve.placement). It sits below both so that the placement, which the model imports, needs
nothing from the policies."""
from __future__ import annotations

from typing import Any


def cp_solver(cp_model: Any, workers: int, seed: int = 0, time_limit: float | None = None,
              det_time: float | None = None) -> Any:
    """A CP-SAT solver with ptsolve's settings: ``workers`` threads, ``seed``, a wall-clock ``time_limit`` (s) or a
    reproducible ``det_time`` (CP-SAT's deterministic time). With ``det_time`` alone the solve is a function of the
    model, ``seed`` and ``det_time`` only, whatever the machine's load: one worker runs CP-SAT's sequential loop;
    several interleave their strategies in fixed batches (``interleave_search``; without it the portfolio races its
    threads and the answer depends on which finishes first, deterministic budget or not). It leaves SIGINT to
    Python: OR-Tools' own handler otherwise stays behind as SIG_DFL after the solve, and a later Ctrl-C kills the
    process without its cleanup."""
    sv = cp_model.CpSolver()
    sv.parameters.catch_sigint_signal = False
    sv.parameters.num_workers = int(workers)
    sv.parameters.random_seed = int(seed)
    if time_limit is not None:
        sv.parameters.max_time_in_seconds = float(time_limit)
    if det_time is not None:
        sv.parameters.max_deterministic_time = float(det_time)
        if time_limit is None and workers > 1:
            sv.parameters.interleave_search = True
    return sv
