"""The shortcuts that make a cold search with the compiler in the loop fast change no answer (issue 34's speed item):
cpsat-orders' cutoff, ladder and relaxation (ptsolve.policies.orders), the search's declared-order fallback under the
best schedule in hand as a cutoff, the compile checks asked ahead and the caller's spare work (ptsolve.search),
optimize's declared-order solve on a spare core (ptsolve.optimize) and the tilings prepared on the process pool.
Each test compares the shortcut with the long way, or checks what the shortcut relies on; none times anything."""
from __future__ import annotations

import hashlib
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

pytest.importorskip("ortools")

import ptsolve  # noqa: E402
from ptsolve.hw import load  # noqa: E402
from ptsolve.kernelcheck import KernelCheck  # noqa: E402
from ptsolve.policies import cpsat  # noqa: E402
from ptsolve.policies import orders as orders_policy  # noqa: E402
from ptsolve.policies.model import build, fits  # noqa: E402

H200 = load("h200")
T = {"BM": 128, "BN": 128, "depth": 2, "groups": 2, "persistent": 1}
FA = ptsolve.ops.flash_attention(batch=1, heads=8, kv_heads=2, seq=1024, head_dim=128, causal=False)
SMALL = ptsolve.ops.flash_attention(batch=1, heads=4, kv_heads=2, seq=700, head_dim=64, causal=True)


@pytest.fixture(scope="module")
def problem():
    return build(FA.graph(T, H200), H200)


@pytest.fixture(scope="module")
def full(problem):
    """cpsat-orders' answer with no cutoff and no ladder start: the pins' first best, solved on its own."""
    return orders_policy.solve(problem, time_limit=60, num_workers=1)


def test_a_cutoff_refutes_or_returns_the_same_schedule(problem, full):
    """Under a cutoff at the pins' best nothing is left (INFEASIBLE, ``refuted``: what search reads as "no declared
    schedule beats the rival"); one cycle above, the schedule without a cutoff comes back, the same one."""
    prog, st = full
    assert prog is not None and st["status"] == "FEASIBLE"
    none, st0 = orders_policy.solve(problem, time_limit=60, num_workers=1, cutoff=st["objective"])
    assert none is None and st0["status"] == "INFEASIBLE" and st0["refuted"]
    same, st1 = orders_policy.solve(problem, time_limit=60, num_workers=1, cutoff=st["objective"] + 1)
    assert same == prog and st1["objective"] == st["objective"]


@pytest.mark.parametrize("start", [1, "answer", "twice"])
def test_the_ladder_start_is_a_hint_not_a_bound(problem, full, start):
    """Where the ladder of cutoffs starts changes the path, never the answer: below every pin, at the answer, or far
    above it (a start above a pin's optimum must not hide that pin)."""
    prog, st = full
    bound = {"answer": st["objective"], "twice": 2 * st["objective"]}.get(start, start)
    again, st2 = orders_policy.solve(problem, time_limit=60, num_workers=1, bound=bound)
    assert again == prog and st2["objective"] == st["objective"]


def test_the_pins_in_turn_find_what_the_ladder_finds(problem, full, monkeypatch):
    """Where a solve of the ladder stops unproven, the pins are solved one after another as before the ladder: the
    same answer."""
    def unproven(*a, **k):
        raise orders_policy._Unproven
    monkeypatch.setattr(orders_policy, "_ladder", unproven)
    again, st = orders_policy.solve(problem, time_limit=60, num_workers=1)
    assert again == full[0] and st["objective"] == full[1]["objective"]


def test_an_orders_relaxation_bounds_every_rotation(problem):
    """A block of pins (the rotations of one declared order) shares its first role's sequence and its turn order;
    pinning only those is a relaxation: its optimum is no worse than any rotation's, so "INFEASIBLE under a cutoff"
    refutes every pin of the block, and a pin meeting it ends the block."""
    Q = orders_policy.one_copy(problem)
    ps = orders_policy.pins(problem)
    run = orders_policy._Pins(Q, ps, 1, 0, None, 0.0, 60.0)
    blocks = run.blocks()
    assert sorted(i for _, _, idx in blocks for i in idx) == list(range(len(ps)))
    for first, cyc, idx in blocks:
        (role, seq), = first.items()
        assert all(ps[i][0][role] == seq and ps[i][1] == cyc for i in idx)
        relaxed = cpsat.solve(Q, time_limit=60, num_workers=1, pin=first, cycle=cyc)[1]
        pinned = [cpsat.solve(Q, time_limit=60, num_workers=1, pin=ps[i][0], cycle=ps[i][1])[1] for i in idx]
        assert relaxed["status"] == "OPTIMAL" and all(p["status"] == "OPTIMAL" for p in pinned)
        assert relaxed["objective"] <= min(p["objective"] for p in pinned)


def test_the_ladder_rungs_rise_to_an_open_one():
    """Rungs above the start, strictly increasing, then None (no cutoff): every pin is reached in the end."""
    rungs = [orders_policy.rung(1000, j) for j in range(1, orders_policy.LADDER_RUNGS + 2)]
    assert rungs[-1] is None and all(b > a for a, b in zip(rungs[:-2], rungs[1:-1])) and rungs[0] > 1000


def test_a_stopped_solve_raises_and_says_nothing():
    """A cancelled cpsat-orders solve raises Stopped, which is no PtsolveError: nothing takes it for a verdict."""
    stop = threading.Event()
    stop.set()
    P = build(FA.graph(T, H200), H200)
    with orders_policy.stopping(stop), pytest.raises(orders_policy.Stopped):
        orders_policy.solve(P, time_limit=60, num_workers=1)
    assert not issubclass(orders_policy.Stopped, ptsolve.errors.PtsolveError)


def _wide(p, hw=None):
    """A stand-in compiler: refuses every schedule of a tiling with BN >= 128 but the declared orders', so the
    search falls back to declared orders under cutoffs, refutes some, solves others, and compiles ahead."""
    if p.graph.tiling["BN"] >= 128 and not p.policy.startswith("cpsat-orders"):
        return KernelCheck("rejected", "fake")
    return KernelCheck("ok", kernel="k")


def _digest(r):
    return (hashlib.sha256(r.program.to_json().encode()).hexdigest(), r.status, r.objective, r.bound,
            tuple(map(str, r.rejected)))


def test_the_declared_orders_cutoff_changes_no_answer(monkeypatch):
    """The search solves a refused tiling's declared order only for schedules that could beat the best schedule in
    hand: the same answer, status, bound and rejections as solving it in full, with some solves refuted (the
    shortcut was taken)."""
    search = sys.modules["ptsolve.search"].search
    seen = []
    real = orders_policy.solve

    def spy(*a, **k):
        out = real(*a, **k)
        seen.append(out[1].get("refuted"))
        return out
    monkeypatch.setattr(orders_policy, "solve", spy)
    short = search(SMALL, "h200", time_limit=120, verify=_wide, jobs=1, executor="serial")
    assert any(seen)
    monkeypatch.setattr(orders_policy, "solve", lambda *a, **k: real(*a, **{x: y for x, y in k.items()
                                                                              if x not in ("cutoff", "bound")}))
    long = search(SMALL, "h200", time_limit=120, verify=_wide, jobs=1, executor="serial")
    assert _digest(short) == _digest(long)
    assert short.program.policy.startswith("cpsat-orders") and short.rejected


def test_compiling_ahead_and_spare_work_change_no_answer(monkeypatch):
    """With compile slots to spare the search asks the compiler ahead about the next schedule and starts the caller's
    spare work for a candidate: the same answer as with neither; spare work for a candidate the compiler refuses is
    cancelled, and the answer's is not."""
    S = sys.modules["ptsolve.search"]
    started, cancelled = [], set()

    def spare(prog):
        started.append(prog)
        return lambda: cancelled.add(id(prog))
    busy = S.search(SMALL, "h200", time_limit=120, verify=_wide, jobs=2, executor="serial", spare=spare)
    monkeypatch.setattr(S._Search, "_idle", lambda self, k, variants: S._nothing)
    plain = S.search(SMALL, "h200", time_limit=120, verify=_wide, jobs=2, executor="serial")
    assert _digest(busy) == _digest(plain)
    for p in started:
        assert (id(p) in cancelled) == (not _wide(p).ok)


def test_optimizes_spare_core_solve_changes_no_answer(monkeypatch):
    """optimize's declared-order solve of a candidate's tiling, on a core the compile checks leave idle, fills the
    memo _replayed_order reads: the same Result as without it."""
    opt = sys.modules["ptsolve.optimize"]
    kw = dict(hw="h200", cache=False, compile_check=True, time_limit=120, executor="serial", jobs=2,
              kernel_check=lambda p, hw: KernelCheck("ok", kernel="k"), fix={"persistent": 1, "groups": 2})
    ahead = opt.optimize(FA, **kw)
    opt._DECLARED.clear()
    monkeypatch.setattr(opt._Ahead, "useful", lambda self: False)
    plain = opt.optimize(FA, **kw)
    assert _digest(ahead) == _digest(plain) and ahead.features == plain.features


def test_a_cancelled_spare_solve_leaves_no_answer_behind():
    """Cancelled at once, the spare-core solve either finished (its memo entry is the full answer) or left none."""
    opt = sys.modules["ptsolve.optimize"]
    opt._DECLARED.clear()
    kw = dict(solver="cpsat", time_limit=60.0, placement="even", executor="serial", jobs=1, decoupled=False,
              fix=None, progress=None, deterministic=False, verify=lambda p: KernelCheck("ok"), buildable=None)
    prog = sys.modules["ptsolve.search"].search(FA, H200, fix=T).program
    ahead = opt._Ahead(FA, H200, kw, time.perf_counter())
    ahead(prog)()
    for th, _ in ahead.runs.values():
        th.join()
    _, key = opt._declared_key(FA, H200, T, None, kw)
    got = opt._DECLARED.get(key, "absent")
    opt._DECLARED.clear()
    assert got == "absent" or got == opt._declared_order(FA, H200, T, None, kw | {"verify": None})


def test_tilings_prepared_on_the_pool_are_the_ones_prepared_here():
    """A tiling's Problem, bounds and greedy schedule do not depend on the process that builds them."""
    S = sys.modules["ptsolve.search"]
    graphs = S._graphs(SMALL, H200, {"persistent": 1, "groups": 1}, ())
    items = [(g, True) for g in graphs if fits(g, H200) is None][:6]
    assert len(items) > 1
    S._PREPARED.clear()
    with ProcessPoolExecutor(2) as ex:
        pooled = S._prepare_many(items, H200, "even", lambda: ex)
    S._PREPARED.clear()
    here = S._prepare_many(items, H200, "even", lambda: None)
    assert pooled == here and all(a is not b for a, b in zip(pooled, here))


def test_one_kernel_is_compiled_once():
    """Schedules the checker's ``kernel_key`` names one kernel get one verdict, asked once. Here a tiling's schedules
    are one kernel, its declared orders' another (a key _wide's verdicts agree with): each is asked about once, and
    the answer is the one without keys."""
    search = sys.modules["ptsolve.search"].search

    def key(p):
        return str((sorted(p.graph.tiling.items()), p.policy.startswith("cpsat-orders")))
    calls = []

    def verify(p):
        calls.append(key(p))
        return _wide(p)
    verify.kernel_key = key
    keyed = search(SMALL, "h200", time_limit=120, verify=verify, jobs=2, executor="serial")
    assert calls and len(calls) == len(set(calls))
    plain = search(SMALL, "h200", time_limit=120, verify=_wide, jobs=2, executor="serial")
    assert _digest(keyed) == _digest(plain)


def test_compile_checks_keep_to_their_slots_and_close_cancels_the_rest():
    """At most ``jobs`` checks run at once; closing cancels the ones not started (nobody will read them) and lets
    the running one finish; its threads never hold up the interpreter's exit (daemon threads)."""
    S = sys.modules["ptsolve.search"]
    release, inside, most = threading.Event(), [], [0]
    lock = threading.Lock()

    def check(x):
        with lock:
            inside.append(x)
            most[0] = max(most[0], len(inside))
        release.wait(30)
        with lock:
            inside.remove(x)
        return x
    c = S._Compiles(1)
    first = c.submit(check, 1)
    while not first.running():  # the first holds the only slot before the rest are asked
        time.sleep(0.001)
    rest = [c.submit(check, i) for i in (2, 3)]
    c.close()
    release.set()
    assert first.result(30) == 1 and all(f.cancelled() for f in rest) and most[0] == 1


def test_a_candidate_unlikely_refused_is_compiled_alone(monkeypatch):
    """The solver's schedule and its polished twin are two kernels: the polished one (the answer as returned) is
    compiled alone, its twin only once the compiler has refused it, and then taken in its place."""
    S = sys.modules["ptsolve.search"]
    from dataclasses import replace
    monkeypatch.setattr(S, "_polish", lambda prog, problems, hw, say: replace(prog, registers=1))
    asked = []

    def verify(p):
        asked.append(p.registers)
        return KernelCheck("ok", kernel="k")
    r = S.search(FA, "h200", fix=T, time_limit=120, verify=verify, jobs=2, executor="serial")
    assert r.status == "OPTIMAL" and asked == [1] and r.program.registers == 1

    def refuse_polished(p):
        asked.append(p.registers)
        return KernelCheck("rejected", "fake") if p.registers == 1 else KernelCheck("ok", kernel="k")
    asked.clear()
    r = S.search(FA, "h200", fix=T, time_limit=120, verify=refuse_polished, jobs=2, executor="serial")
    assert asked == [1, 0] and r.program.registers == 0 and r.kernel_check["status"] == "ok"


def test_the_spare_core_compiles_the_declared_order_only_where_it_replays_faster():
    """optimize's spare-core work asks the compiler about the declared-order schedule _replayed_order will ask about
    (one that replays faster than the candidate), and about nothing else: not a slower one, not once cancelled."""
    from types import SimpleNamespace

    from ptsolve.simulate import replay_us
    opt = sys.modules["ptsolve.optimize"]
    S = sys.modules["ptsolve.search"]
    a, b = (S.search(FA, H200, fix=T, solver=s).program for s in ("greedy", "cpsat"))
    fast, slow = sorted((a, b), key=lambda p: replay_us(p, H200))
    assert replay_us(fast, H200) < replay_us(slow, H200)
    asked = []
    ahead = opt._Ahead(FA, H200, {"verify": lambda p: asked.append(p) or KernelCheck("ok")}, time.perf_counter())
    stop = threading.Event()
    ahead._compile(SimpleNamespace(program=slow), fast, stop)
    assert asked == []
    ahead._compile(SimpleNamespace(program=fast), slow, stop)
    assert asked == [fast]
    stop.set()
    ahead._compile(SimpleNamespace(program=fast), slow, stop)
    assert asked == [fast]

