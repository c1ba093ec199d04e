"""optimize(): the one call most users need."""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from . import cache as cache_mod
from .cost import check_grain
from .errors import PtsolveError
from .hw import DEFAULT_HW, Hardware, load
from .ir import STaskGraph
from .kernelcheck import Checker, KernelCheck, checker, kernel_key
from .opspec import Operator
from .result import Result
from .search import check_args, search


def optimize(op: Operator | STaskGraph, hw: str | Hardware = DEFAULT_HW, solver: str = "cpsat",
             time_limit: float = 30.0, cache: bool = True, placement: str = "even", executor: str = "process",
             jobs: int | None = None, decoupled: bool = False, fix: dict[str, int] | None = None,
             progress: Callable[[str], None] | None = None, compile_check: bool | None = None,
             deterministic: bool = False, replay: bool = True, kernel_check: Checker | None = None) -> Result:
    """Best pipeline schedule of ``op`` (an operator from ptsolve.ops, searched over its tilings, or one
    sTask-graph) on ``hw`` with ``solver`` ("cpsat", "milp" / "milp-highs", "milp-cbc", "greedy",
    "exhaustive"). ``time_limit``: wall-clock seconds for the solves; a time-limited search returns its best
    schedule with status TIME_LIMIT and its gap, after the compiler has checked it (those checks may run past it).
    ``fix`` pins tiling keys (e.g.
    ``{"ctas": 1}``: one CTA per SM): only the operator's tilings with those values are searched. Results are cached
    (see ptsolve.cache); a cache hit has ``cached=True`` and keeps the date and solve time of the search that produced
    it. ``compile_check``: the compiler in the loop (ptsolve.kernelcheck): the answer is the best schedule whose kernel
    the compiler builds without spills or a serialised tensor-core pipeline; a refused schedule gives way to its
    tiling's next one (the declared issue order, then greedy's), never dropping a tiling unasked (ptsolve.search);
    ``kernel_check`` and ``rejected`` say what happened ("not compile-checked" only where no code generator or
    compiler is installed: the time limit bounds the solves, never the answer's checks); None: on unless
    ``PTSOLVE_COMPILE_CHECK=0``. ``deterministic``: a reproducible search, ``time_limit`` then a budget of
    CP-SAT deterministic time, not seconds (ptsolve.search.search; cpsat, cpsat-orders, greedy, exhaustive only).
    An operator with declared issue orders (FlashAttention's FA3 order) gets the best schedule of those orders on the
    answer's tiling instead of CP-SAT's where the orders' ``asap`` replay is faster (_replayed_order: FEASIBLE, the
    reason in ``features``); ``replay=False`` keeps the search's own answer, the formula's optimum (what ``compare``
    studies: greedy and the exact solvers under one objective). ``kernel_check``: the compiler check to run instead of
    the one registered for the hardware's architecture (e.g. ``codegen.compile_check.check_cuda_generic``, the build
    the serving layer runs). Every argument is checked (ptsolve.arguments) before the cache is looked at."""
    if not isinstance(op, (Operator, STaskGraph)):
        raise PtsolveError(f"optimize takes an operator from ptsolve.ops or an STaskGraph, not {type(op).__name__}")
    check_args(hw, solver, time_limit, placement, executor, jobs, fix, deterministic)
    if compile_check is None:
        compile_check = compile_check_default()
    if not all(isinstance(x, bool) for x in (cache, decoupled, compile_check, replay)):
        raise PtsolveError(f"cache, decoupled, compile_check and replay must be True or False, got cache={cache!r}, "
                           f"decoupled={decoupled!r}, compile_check={compile_check!r}, replay={replay!r}")
    if kernel_check is not None and not callable(kernel_check):
        raise PtsolveError(f"kernel_check must be a function (program, hardware) -> KernelCheck, got {kernel_check!r}")
    hwt = load(hw)
    chk = (kernel_check or checker(hwt)) if compile_check else None
    from . import __version__
    # the executor and job count are not in the key: ties are broken the same way by all of them (search.answer_key).
    # A deterministic result is keyed apart, with its budget: served for a smaller or larger time_limit (as a
    # wall-clock one is, cache.get) it would not be what that search returns
    k = cache_mod.key(op.to_json(), hwt.to_dict(), solver, placement, decoupled, check_grain(), __version__,
                      f"compile_check={chk is not None}", ORDER_CHOICE if replay else "orders=formula",
                      *(sorted(fix.items()) if fix else ()),
                      *((f"deterministic={float(time_limit)!r}",) if deterministic else ()),
                      *((f"kernel_check={getattr(kernel_check, '__qualname__', repr(kernel_check))}",)
                        if kernel_check and compile_check else ()))
    if cache:
        hit = cache_mod.get(k, time_limit)
        # an answer kept before the checks ran past the time limit may be one the compiler was never asked about
        unchecked = chk is not None and hit is not None and (hit.kernel_check or {}).get("status") == \
            "not compile-checked"
        if hit is not None and not unchecked:
            return replace(hit, cached=True)
    t0 = time.perf_counter()
    kw = dict(solver=solver, time_limit=time_limit, placement=placement, executor=executor, jobs=jobs,
              decoupled=decoupled, fix=fix, progress=progress, deterministic=deterministic,
              verify=_verifier(chk, hwt), buildable=getattr(chk, "buildable", None))
    ahead = _Ahead(op, hwt, kw, t0) if replay else None
    try:
        res = search(op, hwt, **kw, spare=ahead if ahead and ahead.useful() else None)
        if compile_check and chk is None:
            res = replace(res, kernel_check=KernelCheck("not compile-checked", f"no code generator registered for "
                                                        f"{hwt.arch} (ptsolve.kernelcheck)").to_dict())
        left = time_limit - (time.perf_counter() - t0)
        if ahead and (deterministic or left >= 1.0):  # the whole call keeps to a wall-clock limit
            ahead.wait(res.tiling)
            res = _replayed_order(op, hwt, res, chk, kw | ({} if deterministic else {"time_limit": left}))
    finally:
        if ahead:
            ahead.cancel()
    if cache:
        cache_mod.put(k, time_limit, res)
    return res


def _verifier(chk: Checker | None, hw: Hardware) -> Callable[[Any], KernelCheck] | None:
    """search's ``verify``: ``chk`` on ``hw``, with the checker's ``kernel_key`` (ptsolve.kernelcheck) if it has one.
    Where the checker has a ``predict`` (a refusal it can name before running the compiler), a schedule it names is
    refused at once (no compile): the search moves to the tiling's next schedule as after the compiler's refusal."""
    if chk is None:
        return None
    predict = getattr(chk, "predict", None)

    def verify(p: Any) -> KernelCheck:
        why = predict(p, hw) if predict is not None else None
        if why:
            return KernelCheck("rejected", why, target=hw.arch)
        return chk(p, hw)
    verify.kernel_key = kernel_key(chk, hw)  # type: ignore[attr-defined]
    return verify


def compile_check_default() -> bool:
    """``PTSOLVE_COMPILE_CHECK`` (1 default, 0 off): whether optimize puts the compiler in the loop."""
    v = os.environ.get("PTSOLVE_COMPILE_CHECK", "1")
    if v not in ("0", "1"):
        raise PtsolveError(f"PTSOLVE_COMPILE_CHECK={v!r}: use 1 (compile-check schedules, the default) or 0 (don't)")
    return v == "1"


def _declared_order(op: Operator, hw: Hardware, tiling: dict[str, int], chk: Any, kw: dict[str, Any]
                    ) -> Result | None:
    """The best schedule of ``tiling`` with ``op``'s declared issue orders pinned (cpsat-orders), compile-checked
    (``chk`` None: not checked), as a FEASIBLE Result; None when ``op`` declares none, the search is not CP-SAT's, or
    the compiler rejects it too."""
    if kw.get("solver") != "cpsat" or op.spec.orders is None:
        return None
    g, key = _declared_key(op, hw, tiling, chk, kw)
    if key not in _DECLARED:
        try:
            alt = search(g, hw, **(kw | {"solver": "cpsat-orders", "fix": None}))
        except PtsolveError:
            alt = None
        if alt is not None and chk is not None and KernelCheck(**alt.kernel_check).refused:
            alt = None
        if len(_DECLARED) > 256:
            _DECLARED.clear()
        _DECLARED[key] = None if alt is None else replace(alt, status="FEASIBLE")
    return _DECLARED[key]


def _declared_key(op: Operator, hw: Hardware, tiling: dict[str, int], chk: Any,
                  kw: dict[str, Any]) -> tuple[STaskGraph, tuple]:
    """(the tiling's graph, its key in _DECLARED): the same tiling comes back (compare's decoupled column, tune's
    walk, optimize's spare-core solve), so its pinned solves are done once per process."""
    g = op.graph(dict(tiling), hw)
    return g, (g.to_json(), json.dumps(hw.to_dict(), sort_keys=True, default=str), kw.get("placement"), chk,
               kw.get("deterministic") and float(kw["time_limit"]))


_DECLARED: dict[tuple, Result | None] = {}


class _Ahead:
    """optimize's work for a core the compiler leaves idle (search's ``spare``): while a candidate answer's lone
    compile check runs, the declared-order solve of its tiling that _replayed_order asks for once the search is done
    (1-2 s of CP-SAT on 2 cores: most of a cold attention call's time after its compile checks). It runs in a thread
    of its own (CP-SAT releases the GIL) into _DECLARED, so it changes no answer: _replayed_order finds the same
    Result there, or solves it itself where the candidate was refused and its solve cancelled."""

    def __init__(self, op: Operator | STaskGraph, hw: Hardware, kw: dict[str, Any], t0: float) -> None:
        self.op, self.hw, self.kw, self.t0 = op, hw, kw, t0
        self.runs: dict[tuple, tuple[threading.Thread, threading.Event]] = {}

    def useful(self) -> bool:
        """Whether _replayed_order will ask for a declared-order solve at all (and the compiler is in the loop)."""
        return not isinstance(self.op, STaskGraph) and self.kw.get("solver") == "cpsat" and \
            self.op.spec.orders is not None and self.kw.get("verify") is not None

    def __call__(self, prog: Any) -> Callable[[], None]:
        """Start the declared-order solve of ``prog``'s tiling (unless known or running, or _replayed_order would not
        ask for it: ``prog`` is of the declared orders already, or no time is left); what cancels it."""
        kw = self._kw()
        if prog.policy.startswith("cpsat-orders") or (not kw.get("deterministic") and kw["time_limit"] < 1.0):
            return lambda: None
        g, key = _declared_key(self.op, self.hw, prog.graph.tiling, None, kw)  # type: ignore[arg-type]
        if key in _DECLARED or (key in self.runs and not self.runs[key][1].is_set()):  # a cancelled one starts again
            return lambda: None
        stop = threading.Event()
        th = threading.Thread(target=self._solve, args=(dict(prog.graph.tiling), kw, stop, prog), daemon=True)
        self.runs[key] = (th, stop)
        th.start()
        return stop.set

    def _kw(self) -> dict[str, Any]:
        """_replayed_order's arguments, less the progress lines (this thread's would interleave the search's)."""
        left = {} if self.kw.get("deterministic") else \
            {"time_limit": self.kw["time_limit"] - (time.perf_counter() - self.t0)}
        return self.kw | {"verify": None, "progress": None} | left

    def _solve(self, tiling: dict[str, int], kw: dict[str, Any], stop: threading.Event, prog: Any) -> None:
        from .policies.orders import Stopped, stopping
        try:
            with stopping(stop):
                alt = _declared_order(self.op, self.hw, tiling, None, kw)  # type: ignore[arg-type]
        except Stopped:
            return
        self._compile(alt, prog, stop)

    def _compile(self, alt: Result | None, prog: Any, stop: threading.Event) -> None:
        """Ask the compiler now about the declared-order schedule ``alt`` where its replay beats the candidate
        ``prog``'s: _replayed_order will ask about exactly that schedule, and the checker keeps its verdict by kernel
        hash (the cubin cache), so that check is then a lookup instead of a second compile after the search (1.5 s of
        nvcc at the end of a cold call whose answer is the declared order, 2 cores). A verdict is the same whenever it
        is asked: no answer changes."""
        verify = self.kw.get("verify")
        if verify is None or alt is None or alt.program is None or stop.is_set():
            return
        from .simulate import replay_us
        if replay_us(alt.program, self.hw) < replay_us(prog, self.hw):
            try:
                verify(alt.program)
            except PtsolveError:  # _replayed_order asks again and meets it there
                pass

    def wait(self, tiling: dict[str, int]) -> None:
        """Let a solve of ``tiling`` that still runs finish (it is the one _replayed_order asks for); cancel the
        others."""
        if not self.runs:
            return
        _, key = _declared_key(self.op, self.hw, tiling, None, self._kw())  # type: ignore[arg-type]
        for k, (th, stop) in self.runs.items():
            if k == key and not stop.is_set():
                th.join()
            else:
                stop.set()

    def cancel(self) -> None:
        for _, stop in self.runs.values():
            stop.set()


ORDER_CHOICE = "orders=replay"  # in optimize's cache key: answers before _replayed_order are not served


def _replayed_order(op: Operator | STaskGraph, hw: Hardware, res: Result, chk: Any, kw: dict[str, Any]) -> Result:
    """CP-SAT's answer, or the best schedule of the same tiling with the operator's declared issue orders where the
    ``asap`` replay (ptsolve.simulate.replay_us: the orders run as the hardware runs them) finds that one faster.
    Both reach the steady state the formula sees; the formula also charges one iteration laid out at its
    steady-state slots for the pipeline's fill and drain, which ranked CP-SAT's free orders ahead of FlashAttention-3's
    where the GPU ran FA3's up to 6.8% faster (bench study replay_orders). The declared order's answer is FEASIBLE (its
    formula objective is above the proven optimum: ``bound`` keeps the search's) and says why in ``features``.
    Unchanged for a graph, another solver, an operator that declares no orders, or an answer already of them."""
    if isinstance(op, STaskGraph) or res.program is None or res.program.policy.startswith("cpsat-orders"):
        return res
    from .simulate import replay_us
    # the replay decides before the compiler is asked: a declared order that replays slower costs no compile
    alt = _declared_order(op, hw, res.tiling, None, kw | {"verify": None})
    if alt is None or alt.program is None:
        return res
    mine, theirs = replay_us(res.program, hw), replay_us(alt.program, hw)
    if theirs >= mine:
        return res
    if chk is not None:
        kc = chk(alt.program, hw)
        if not kc.refused:  # the schedule just solved is the one the compiler builds: no second solve
            alt = replace(alt, kernel_check=kc.to_dict())
        else:  # the search with the compiler in it may still find a compile-clean schedule of the declared orders
            alt = _declared_order(op, hw, res.tiling, chk, kw)
            if alt is None or alt.program is None or replay_us(alt.program, hw) >= mine:
                return res
            theirs = replay_us(alt.program, hw)
    (kw.get("progress") or (lambda s: None))(
        f"tiling {res.tiling}: the declared issue order replays to {theirs:.2f} µs, CP-SAT's to {mine:.2f} µs; kept")
    why = (f"issue order: the operator's declared order (cpsat-orders); its asap replay {theirs:.2f} µs < "
           f"{mine:.2f} µs of CP-SAT's answer ({res.objective} cycles by the formula, {res.status})")
    status = "TIME_LIMIT" if res.status == "TIME_LIMIT" else "FEASIBLE"
    # without a compiler in the loop the answer keeps what res says of that ("not compile-checked" or nothing)
    return replace(alt, status=status, bound=res.bound, solve_s=res.solve_s + alt.solve_s, tilings=res.tilings,
                   solved=res.solved + alt.solved, rejected=res.rejected, features=(why, *alt.features),
                   kernel_check=alt.kernel_check if chk is not None else res.kernel_check)
