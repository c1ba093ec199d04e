"""optimize(): the one call most users need."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from . import cache as cache_mod
from .cost import check_grain
from .errors import PtsolveError
from .hw import Hardware, load
from .ir import STaskGraph
from .ops.base import Operator
from .result import Result
from .search import check_args, search


def optimize(op: Operator | STaskGraph, hw: str | Hardware = "h100", solver: str = "cpsat",
             time_limit: float = 30.0, cache: bool = True, placement: str = "even", executor: str = "process",
             jobs: int | None = None, decoupled: bool = False, fix: dict[str, int] | None = None,
             progress: Callable[[str], None] | None = None) -> Result:
    """Best pipeline schedule of ``op`` (an operator from ptsolve.ops, searched over its tilings, or one
    sTask-graph) on ``hw`` with ``solver`` ("cpsat", "milp" / "milp-highs", "milp-cbc", "greedy",
    "exhaustive"). ``time_limit``: seconds for the whole search; a time-limited search returns its best
    schedule with status TIME_LIMIT and its gap. ``fix`` pins tiling keys (e.g. ``{"ctas": 1}``: one CTA per
    SM): only the operator's tilings with those values are searched. Results are cached (see ptsolve.cache);
    a cache hit has ``cached=True`` and keeps the date and solve time of the search that produced it.
    Every argument is checked (ptsolve.checks) before the cache is looked at."""
    if not isinstance(op, (Operator, STaskGraph)):
        raise PtsolveError(f"optimize takes an operator from ptsolve.ops or an STaskGraph, not {type(op).__name__}")
    check_args(hw, solver, time_limit, placement, executor, jobs, fix)
    if not isinstance(cache, bool) or not isinstance(decoupled, bool):
        raise PtsolveError(f"cache and decoupled must be True or False, got cache={cache!r}, decoupled={decoupled!r}")
    hwt = load(hw)
    from . import __version__
    # the executor and job count are not in the key: ties are broken the same way by all of them (search._key)
    k = cache_mod.key(op.to_json(), hwt.to_dict(), solver, placement, decoupled, check_grain(), __version__,
                      *(sorted(fix.items()) if fix else ()))
    if cache:
        hit = cache_mod.get(k, time_limit)
        if hit is not None:
            return replace(hit, cached=True)
    res = search(op, hwt, solver=solver, time_limit=time_limit, placement=placement, executor=executor, jobs=jobs,
                 decoupled=decoupled, fix=fix, progress=progress)
    if cache:
        cache_mod.put(k, time_limit, res)
    return res
