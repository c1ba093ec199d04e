"""Deterministic search (search / optimize / tune with deterministic=True, CLI --deterministic): the same Result under
CPU load, serially and in a process pool, with a budget that stops solves; such a solve is never called OPTIMAL; the
MILP back-ends (wall-clock limits only) refuse; the schedule cache keys the mode and its budget; the flag reaches
search from the command line."""
from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import ptsolve
from ptsolve.cli import main
from ptsolve.errors import PtsolveError, SolverError
from ptsolve.policies import cpsat
from ptsolve.policies.model import build
from ptsolve.search import search
from ptsolve.tune import candidates

# 18 attention tilings (BM 128) whose solves a 1 s budget stops: the serial search prunes more than the pool
FA = ptsolve.ops.flash_attention(batch=1, heads=32, kv_heads=8, seq=4096, head_dim=128, causal=True)
FA_FIX = {"BM": 128}
HARD = {"BM": 128, "BN": 128, "depth": 3, "groups": 2, "persistent": 1}  # about 0.5 s of deterministic time to prove
TINY = ptsolve.ops.gemm(M=256, N=256, K=256)
opt_mod = importlib.import_module("ptsolve.optimize")  # ptsolve.optimize is the function


@contextmanager
def _busy(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU while the block runs (a machine under load)."""
    ps = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in ps:
            p.kill()
            p.wait()


def _key(r: ptsolve.Result) -> tuple:
    return r.program.to_json(), r.status, r.objective, r.bound


def _params(monkeypatch: pytest.MonkeyPatch) -> list:
    """The parameters of every CP-SAT solver built in this process from now on."""
    seen = []
    real = cpsat.cp_solver

    def spy(*a, **k):
        sv = real(*a, **k)
        seen.append(sv.parameters)
        return sv
    monkeypatch.setattr(cpsat, "cp_solver", spy)
    return seen


def test_same_answer_under_load() -> None:
    g = FA.graph(HARD, ptsolve.hw.load("h200"))
    a = search(g, "h200", time_limit=0.3, executor="serial", deterministic=True)
    assert a.status == "TIME_LIMIT"  # the budget binds: the answer is wherever the solve stopped
    with _busy(4):  # twice as many spinners as cores: a wall-clock limit would stop the solve earlier
        b = search(g, "h200", time_limit=0.3, executor="serial", deterministic=True)
    assert _key(a) == _key(b)


def test_same_answer_serially_and_in_a_pool_under_load() -> None:
    said: list[str] = []
    a = search(FA, "h200", time_limit=1.0, fix=FA_FIX, executor="serial", jobs=1, deterministic=True,
               progress=said.append)
    assert any(": TIME_LIMIT in" in s for s in said) and a.status == "TIME_LIMIT"  # the budget binds
    with _busy(2):
        b = search(FA, "h200", time_limit=1.0, fix=FA_FIX, executor="process", jobs=2, deterministic=True)
    assert _key(a) == _key(b)


def test_serial_and_pool_settle_on_the_same_bound() -> None:
    """A deeper ring A (solved: 100, the answer) prunes its shallower twin B in a serial search (B's bound raised to
    A's); a pool solved B beside A and its budget stopped it at a bound of 90. Settled at the end, B inherits A's
    bound in both, so both are proven (B's 90 alone made the pool's search TIME_LIMIT, the serial one OPTIMAL)."""
    from ptsolve.search import _settle
    a, b, c = {"BM": 64, "depth": 3}, {"BM": 64, "depth": 2}, {"BM": 128, "depth": 2}
    tilings = [(a, ("a",)), (b, ("b",)), (c, ("c",))]
    serial = _settle(tilings, {("a",): 100, ("b",): 100, ("c",): 120}, set(), 100)
    pool = _settle(tilings, {("a",): 100, ("b",): 90, ("c",): 120}, {("b",)}, 100)
    assert serial == pool == ([100, 100, 120], False)
    # a stopped solve below the answer with no deeper twin to lift it keeps the search TIME_LIMIT
    assert _settle(tilings, {("a",): 100, ("b",): 100, ("c",): 90}, {("c",)}, 100) == ([100, 100, 90], True)
    assert _settle(tilings, {("a",): 100, ("b",): 100, ("c",): 90}, set(), 100)[1] is False  # FEASIBLE, not TIME_LIMIT


def test_cpsat_orders_is_reproducible_under_load() -> None:
    g = ptsolve.ops.flash_attention(batch=1, heads=8, kv_heads=2, seq=1024, head_dim=128, causal=True).graph(
        {"BM": 128, "BN": 128, "depth": 2, "groups": 2}, ptsolve.hw.load("h200"))
    a = search(g, "h200", solver="cpsat-orders", time_limit=0.5, executor="serial", deterministic=True)
    with _busy(2):
        b = search(g, "h200", solver="cpsat-orders", time_limit=0.5, executor="serial", deterministic=True)
    assert _key(a) == _key(b)


def test_a_stopped_solve_is_not_optimal(monkeypatch: pytest.MonkeyPatch) -> None:
    g = FA.graph(HARD, ptsolve.hw.load("h200"))
    seen = _params(monkeypatch)
    r = search(g, "h200", time_limit=0.1, executor="serial", deterministic=True)
    assert r.status == "TIME_LIMIT" and r.bound < r.objective and r.gap > 0
    assert r.program.policy in ("cpsat", "cpsat (greedy's schedule, not improved, status TIME_LIMIT)")
    # the budget: all of time_limit for the one tiling, CP-SAT deterministic time, one worker, a fixed seed
    (p,) = seen
    assert p.max_deterministic_time == 0.1 and math.isinf(p.max_time_in_seconds)
    assert p.num_workers == 1 and p.random_seed == 0 and not p.interleave_search
    _, st = cpsat.solve(build(g, ptsolve.hw.load("h200")), det_time=0.05, num_workers=1)
    assert st["status"] == "TIME_LIMIT" and st["bound"] < st["objective"]  # CP-SAT's FEASIBLE at the budget
    seen.clear()
    done = search(g, "h200", time_limit=3.0, executor="serial", deterministic=True)  # enough to prove it
    assert done.status == "OPTIMAL" and done.bound == done.objective <= r.objective
    assert all(math.isinf(p.max_time_in_seconds) for p in seen)  # the polish too


def test_several_cpsat_workers_interleave() -> None:
    """Outside search, a deterministic budget with several workers switches CP-SAT to its interleaved search: the
    parallel portfolio alone races its threads whatever the budget."""
    from ortools.sat.python import cp_model
    assert cpsat.cp_solver(cp_model, 2, det_time=1.0).parameters.interleave_search
    assert not cpsat.cp_solver(cp_model, 2, time_limit=1.0).parameters.interleave_search
    assert not cpsat.cp_solver(cp_model, 1, det_time=1.0).parameters.interleave_search


@pytest.mark.parametrize("solver", ["milp", "milp-highs", "milp-cbc"])
def test_milp_refuses_deterministic(solver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SolverError, match=f"solver '{solver}' cannot run deterministically.*use solver 'cpsat'"):
        search(TINY, "h100", solver=solver, deterministic=True)
    monkeypatch.setattr(opt_mod, "search", lambda *a, **k: pytest.fail("searched"))
    with pytest.raises(SolverError, match="wall-clock"):
        ptsolve.optimize(TINY, "h100", solver=solver, deterministic=True)
    with pytest.raises(SolverError, match=solver):  # before the first policy's solves
        candidates(TINY, "h100", 1, solver=f"cpsat,{solver}", deterministic=True)


def test_other_refusals_and_greedy() -> None:
    with pytest.raises(SolverError, match="placement 'exact' cannot run deterministically"):
        search(TINY, "h100", placement="exact", deterministic=True)
    with pytest.raises(PtsolveError, match="deterministic must be True or False"):
        ptsolve.optimize(TINY, "h100", deterministic="yes")
    g = search(TINY, "h100", solver="greedy", executor="serial", deterministic=True)
    assert _key(g) == _key(search(TINY, "h100", solver="greedy", executor="serial"))


def test_cache_keys_the_mode_and_its_budget() -> None:
    a = ptsolve.optimize(TINY, "h100", time_limit=0.5, deterministic=True)
    assert not a.cached
    assert ptsolve.optimize(TINY, "h100", time_limit=0.5, deterministic=True).cached
    assert not ptsolve.optimize(TINY, "h100", time_limit=0.5).cached  # a wall-clock search is another entry
    assert not ptsolve.optimize(TINY, "h100", time_limit=0.25, deterministic=True).cached  # so is another budget


def test_cli_flag_reaches_search(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    calls: list[dict] = []
    real = opt_mod.search
    monkeypatch.setattr(opt_mod, "search", lambda *a, **k: (calls.append(k), real(*a, **k))[1])
    args = ["gemm", "M=256", "N=256", "K=256", "--time-limit", "0.5", "--out", str(tmp_path)]
    assert main(["optimize", *args, "--deterministic", "--no-cache"]) == 0
    assert main(["optimize", *args, "--no-cache"]) == 0
    assert [(c["deterministic"], c["time_limit"]) for c in calls] == [(True, 0.5), (False, 0.5)]
    calls.clear()
    f = tmp_path / "cands.json"
    assert main(["tune", *args[:-2], "--hw", "h200", "--top-k", "1", "--deterministic", "--prepare", str(f)]) == 0
    assert calls and all(c["deterministic"] for c in calls) and json.loads(f.read_text())["deterministic"]
    calls.clear()
    capsys.readouterr()
    # compare's default solvers include milp: refused before any configuration is solved
    assert main(["compare", "--only", "GEMM0", "--deterministic", "--out", str(tmp_path)]) == 2
    assert "solver 'milp' cannot run deterministically" in capsys.readouterr().err and not calls
    assert main(["optimize", *args, "--solver", "milp-cbc", "--deterministic"]) == 2
    assert "'milp-cbc' cannot run deterministically" in capsys.readouterr().err and not calls


def test_exact_placement_runs_deterministically(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """``exact_loads(deterministic=True)``: one CP-SAT worker under deterministic time, the same proven placement as
    the wall-clock solve; ``ptsolve placement --deterministic`` passes the mode to both its searches and its exact
    placements (the suite stubbed to one causal configuration, whose CTAs are unequal)."""
    import numpy as np

    import ptsolve.cpsolver as cps
    import ptsolve.placement as pl
    import ptsolve.suites as suites
    seen: list[tuple] = []
    real = cps.cp_solver
    monkeypatch.setattr(cps, "cp_solver", lambda m, w, seed=0, time_limit=None, det_time=None:
                        (seen.append((w, time_limit, det_time)), real(m, w, seed, time_limit, det_time))[1])
    a = pl.exact_loads([5, 4, 3, 3, 3], 1, 2, time_limit=2.0, deterministic=True)
    b = pl.exact_loads([5, 4, 3, 3, 3], 1, 2, time_limit=2.0)
    assert seen == [(1, None, 2.0), (2, 2.0, None)]
    assert a[1] and b[1] and sorted(a[0].tolist()) == sorted(b[0].tolist()) == [9, 9]
    placed: list[bool] = []
    searched: list[bool] = []
    monkeypatch.setattr(pl, "exact_loads", lambda *x, deterministic=False, **k: (placed.append(deterministic),
                                                                                   (np.array([1]), True))[1])
    opt = ptsolve.optimize
    monkeypatch.setattr(ptsolve, "optimize", lambda *x, deterministic=False, **k: (searched.append(deterministic),
                                                                                  opt(*x, deterministic=deterministic,
                                                                                      **k))[1])
    cfg = {"name": "T0c", "op": "flash_attention", "params": {"batch": 1, "heads": 2, "seq": 512, "head_dim": 64,
                                                             "causal": True}}
    monkeypatch.setitem(suites.SUITES, "paper", lambda: [cfg])
    assert main(["placement", "--hw", "h200", "--search-limit", "0.5", "--deterministic", "--no-cache",
                 "--out", str(tmp_path)]) == 0
    assert searched == [True] and placed == [True]
