"""One validation layer for what a user hands ptsolve: API arguments, CLI options, environment variables and
the size of a shape. Every refusal is a PtsolveError naming the value and the fix; callers run these checks
before any cache lookup or solve. This module imports nothing of ptsolve but its errors, so the IR, the cost
model and the operator builders can all use it.
"""
from __future__ import annotations

import math
import os
from typing import Any

from .errors import ConfigError, ShapeError, SolverError

SOLVER_NAMES = ("greedy", "cpsat", "milp", "milp-highs", "milp-cbc", "exhaustive", "cpsat-orders")
EXECUTORS = ("process", "serial", "ray")
PLACEMENTS = ("even", "lpt", "exact", "dynamic")
GRAIN_DEFAULT = 8     # cycles
GRAIN_MAX = 1024      # cycles; a coarser grain rounds every task of a kernel to the same length
# Size guard: the placement keeps a few int64 arrays of one entry per CTA, and simulate() replays every distinct
# trip count instance by instance; past these a replay takes gigabytes and minutes, not what a 2-core,
# 24 GB machine (or a time limit) can give it.
MAX_CTAS = 1 << 24        # CTAs of one kernel (a few hundred MB of placement arrays)
MAX_EVENTS = 1 << 22      # task instances simulate() replays over all distinct trip counts


def env_grain(raw: str | None) -> int:
    """The cost model's grain in cycles from ``PTSOLVE_GRAIN`` (unset: 8); ConfigError when not an integer in
    [1, GRAIN_MAX]."""
    if raw is None or raw.strip() == "":
        return GRAIN_DEFAULT
    try:
        v = int(raw)
    except ValueError:
        v = 0
    if not 1 <= v <= GRAIN_MAX:
        raise ConfigError(f"PTSOLVE_GRAIN={raw!r} is not a whole number of cycles in [1, {GRAIN_MAX}]; unset it "
                          f"(default {GRAIN_DEFAULT}) or set e.g. PTSOLVE_GRAIN=8")
    return v


def env_flag(name: str, default: bool) -> bool:
    """A boolean environment variable: 1/true/yes/on or 0/false/no/off (any case); ConfigError otherwise."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use {name}=0 or {name}=1")


def solver(name: Any) -> str:
    if name not in SOLVER_NAMES:
        raise SolverError(f"unknown solver {name!r}; use one of {', '.join(SOLVER_NAMES)} (milp = milp-highs)")
    return name


def time_limit(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise SolverError(f"time_limit must be a finite number of seconds > 0, got {v!r}; e.g. time_limit=30")
    return float(v)


def jobs(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SolverError(f"jobs must be a whole number >= 1 of parallel solves (or None: all cores), got {v!r}")
    return v


def choice(what: str, v: Any, allowed: tuple[str, ...]) -> str:
    if v not in allowed:
        raise SolverError(f"unknown {what} {v!r}; use one of {', '.join(allowed)}")
    return v


def fix(v: Any) -> dict[str, int] | None:
    if v is None:
        return None
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, int) and not isinstance(x, bool)
                                          for k, x in v.items()):
        raise SolverError(f"fix must map tiling keys to integers, e.g. {{'ctas': 1}}; got {v!r}")
    return dict(v)


def hw_spec(v: Any) -> None:
    """A hardware argument is a table, a built-in name or a path: refuse anything else before loading it."""
    from .errors import HardwareError
    from .hw import Hardware

    if not isinstance(v, (str, os.PathLike, Hardware)) or (isinstance(v, str) and not v.strip()):
        raise HardwareError(f"hw must be a hardware name (h100, h200, a100, mi300x), the path of a .json table or a "
                            f"ptsolve.hw.Hardware, got {v!r}")


def size(what: str, ctas: int, ctas_from: str, events: int, events_from: str) -> None:
    """Refuse a shape whose kernel has more than MAX_CTAS CTAs or whose replay has more than MAX_EVENTS task
    instances; ``*_from`` names the dimensions that set each number."""
    if ctas > MAX_CTAS:
        raise ShapeError(f"{what}: {ctas:,} CTAs (from {ctas_from}) exceed the {MAX_CTAS:,} that the placement and "
                         f"replay hold in memory; reduce {ctas_from}")
    if events > MAX_EVENTS:
        raise ShapeError(f"{what}: replaying its CTAs takes {events:,} task instances (from {events_from}), more than "
                         f"the {MAX_EVENTS:,} simulate() can hold in memory; reduce {events_from}")
