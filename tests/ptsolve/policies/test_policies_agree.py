"""The exact policies agree: CP-SAT, the MILP on HiGHS and on CBC, and exhaustive enumeration find the same
optimum (cycles) on random tiny graphs; greedy is never better; every program is valid and replays to the
objective it claims."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

import ptsolve.hw as H
from ptsolve.cost import GRAIN
from ptsolve.errors import InfeasibleError, SolverError
from ptsolve.ir import Buffer, Edge, STask, STaskGraph
from ptsolve.policies import cpsat, exhaustive, greedy, milp, model
from ptsolve.simulate import simulate
from ptsolve.validate import check_valid

pytest.importorskip("pulp")
pytest.importorskip("highspy")

# A hardware table on which every duration is a few grains (Q cycles each; the solvers work in grains), so
# exhaustive enumeration stays cheap: load: occupancy = bytes/Q grains (Q B/clk from HBM and L2), latency
# + 2; mma: tensor cores busy flops/Q grains, latency + 1; vector: flops/Q grains; crossing streams and
# issuing an async instruction cost 1 grain.
Q = GRAIN
TINY = dataclasses.replace(
    H.load("h100"), name="tiny", sms=3, clock_ghz=1.0, hbm_bytes_per_s=3e9 * Q, l2_bytes_per_clk=float(Q),
    tc_flops_per_clk=1.0, tc_efficiency=1.0, fp32_flops_per_clk=2.0, vector_efficiency=1.0, sfu_per_clk=1.0,
    mem_latency=2 * Q, tc_latency=Q, barrier_cycles=Q, issue_cycles=Q, launch_us=0.0,
    **({"tc_fixed": 0} if "tc_fixed" in {f.name for f in dataclasses.fields(H.Hardware)} else {}))


@st.composite
def tiny_graphs(draw: Any) -> STaskGraph:
    """3-7 tasks: loads on the producer, mma / vector on warpgroups 0-1, a zero-distance DAG, maybe a
    loop-carried edge, maybe a shared-memory ring and a register buffer, maybe a prologue and an epilogue task."""
    n_loop = draw(st.integers(3, 5))
    kinds = [draw(st.sampled_from(("load", "mma", "vector"))) for _ in range(n_loop)]
    kinds[0] = "load"  # a loop needs its data
    if all(k == "load" for k in kinds):
        kinds[-1] = "mma"  # and a consumer warpgroup
    spec: list[dict[str, Any]] = []
    for i, k in enumerate(kinds):
        d: dict[str, Any] = {"name": f"t{i}", "kind": k, "phase": "loop"}
        if k == "load":
            d |= {"bytes": Q * Q * draw(st.integers(1, 3)), "group": -1, "is_async": True}
        else:
            d |= {"flops": Q * draw(st.integers(1, 3) if k == "mma" else st.integers(1, 4)),
                  "group": draw(st.integers(0, 1)), "is_async": k == "mma"}
        spec.append(d)
    edges = [Edge(f"t{i}", f"t{j}") for i in range(n_loop) for j in range(i + 1, n_loop)
             if draw(st.booleans()) and draw(st.booleans())]
    for j in range(1, n_loop):  # keep the graph connected: every task needs some earlier task
        if not any(e.dst == f"t{j}" for e in edges):
            edges.append(Edge(f"t{draw(st.integers(0, j - 1))}", f"t{j}"))
    if draw(st.booleans()):  # a loop-carried dependence (running max, accumulator)
        j = draw(st.integers(0, n_loop - 1))
        i = draw(st.integers(j, n_loop - 1))
        edges.append(Edge(f"t{i}", f"t{j}", 1))
    readers = [e.dst for e in edges if e.src == "t0" and e.dist == 0]
    if readers and draw(st.booleans()):  # the first load fills a shared-memory ring that a consumer frees
        spec[0]["allocs"] = (Buffer("ring", "smem", 1024),)
        spec[int(readers[0][1:])]["frees"] = ("ring",)
    mmas = [i for i, k in enumerate(kinds) if k == "mma"]
    if mmas and draw(st.booleans()):  # an mma result in registers, freed by a later task of its group
        i = mmas[0]
        later = [e.dst for e in edges if e.src == f"t{i}" and e.dist == 0]
        if later:
            spec[i]["allocs"] = (*spec[i].get("allocs", ()), Buffer("acc", "reg", 4096))
            spec[int(later[0][1:])]["frees"] = (*spec[int(later[0][1:])].get("frees", ()), "acc")
    n_tasks = n_loop
    if draw(st.booleans()) and n_tasks < 7:  # a prologue load feeding some loop task
        spec.append({"name": "pre", "kind": "load", "phase": "pre", "bytes": Q * Q * draw(st.integers(1, 3)),
                     "group": -1, "is_async": True})
        edges.append(Edge("pre", f"t{draw(st.integers(0, n_loop - 1))}"))
        n_tasks += 1
    if draw(st.booleans()) and n_tasks < 7:  # an epilogue store or vector op after some loop task
        k = draw(st.sampled_from(("store", "vector")))
        spec.append({"name": "post", "kind": k, "phase": "post", "group": -1 if k == "store" else 0,
                     "bytes": Q * Q * draw(st.integers(1, 3)) if k == "store" else 0,
                     "flops": Q * draw(st.integers(1, 3)) if k == "vector" else 0, "is_async": k == "store"})
        edges.append(Edge(f"t{draw(st.integers(0, n_loop - 1))}", "post"))
    # up to 4 CTAs a row on 3 SMs: some SM may run fewer CTAs with more iterations than another, so the
    # objective can be a max of several (a·ii + b·span) terms; with two resident CTAs per SM (6 slots) the
    # shared units' floor may bind instead
    row = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    rows = draw(st.integers(1, 2))
    tasks = tuple(STask(**d) for d in spec)
    # depth 2+: a ring read by a wgmma nothing waits for is released one iteration late (protocol.releases)
    tiling = {"depth": draw(st.integers(2, 3)), "ctas": draw(st.integers(1, 2))}
    return STaskGraph(name="tiny", op="test", params={}, tiling=tiling, tasks=tasks,
                      edges=tuple(edges), row=row, rows=rows, useful_flops=1)


@st.composite
def mirrored_graphs(draw: Any) -> STaskGraph:
    """Two consumer warpgroups running the same tasks (x@0, x@1) on shared loads: the symmetry CP-SAT and the
    MILP break (s[x@0] <= s[x@1], cpsat._symmetry_task) must not cut off every optimum; exhaustive does
    not break it."""
    n_load = draw(st.integers(1, 2))
    n_comp = draw(st.integers(1, 2))
    ring = draw(st.booleans())
    tasks = [STask(f"ld{i}", "load", bytes=Q * Q * draw(st.integers(1, 3)), is_async=True,
                   allocs=(Buffer("ring", "smem", 1024),) if ring and i == 0 else ()) for i in range(n_load)]
    kinds = [draw(st.sampled_from(("mma", "vector"))) for _ in range(n_comp)]
    work = [Q * draw(st.integers(1, 3)) for _ in range(n_comp)]
    src = [draw(st.integers(0, n_load - 1)) for _ in range(n_comp)]
    chain = n_comp == 2 and draw(st.booleans())
    carried = draw(st.booleans())
    edges = []
    for grp in (0, 1):
        for j, (k, w) in enumerate(zip(kinds, work)):
            tasks.append(STask(f"c{j}@{grp}", k, flops=w, group=grp, is_async=k == "mma",
                               frees=("ring",) if ring and j == 0 and src[0] == 0 else ()))
            edges.append(Edge(f"ld{src[j]}", f"c{j}@{grp}"))
        if chain:
            edges.append(Edge(f"c0@{grp}", f"c1@{grp}"))
        if carried:
            edges.append(Edge(f"c{n_comp - 1}@{grp}", f"c0@{grp}", 1))
    row = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    return STaskGraph(name="mirror", op="test", params={}, tiling={"depth": draw(st.integers(2, 3)), "groups": 2},
                      tasks=tuple(tasks), edges=tuple(edges), row=row, rows=draw(st.integers(1, 2)), useful_flops=1)


def _check(P: model.Problem, prog: Any, stats: dict[str, Any], who: str, hw: Any = TINY) -> int:
    """The program is valid, replays on time, and its replayed kernel cycles equal the claimed objective."""
    assert prog is not None, f"{who}: no program ({stats})"
    ok = check_valid(prog, hw)
    assert ok, f"{who}: {ok}"
    sol = exhaustive.to_grains(P, prog)
    assert sol is not None, f"{who}: times off the {P.grain}-cycle grain"
    assert not exhaustive.violations(P, *sol), who
    obj = exhaustive.objective_of(P, *sol) * P.grain
    if "objective" in stats:
        assert stats["objective"] == obj, f"{who}: claims {stats['objective']}, program gives {obj}"
    tl = simulate(prog, hw)
    assert tl.late == 0, f"{who}: {tl.late} instances late"
    assert tl.kernel_cycles == obj, f"{who}: replay {tl.kernel_cycles} cycles vs objective {obj}"
    return obj


def _agree(g: STaskGraph, hw: Any) -> None:
    """All exact policies find the same optimum of ``g``; greedy is no better; every program checks out."""
    P = model.build(g, hw)
    try:
        gp, _ = greedy.solve(P)
    except InfeasibleError:
        gp = None
    cp, cs = cpsat.solve(P, time_limit=20, num_workers=1, hint=gp)  # one worker: deterministic
    ex, es = exhaustive.solve(P)
    assert cs["status"] == es["status"], (cs, es)
    if es["status"] == "INFEASIBLE":
        return
    assert cs["status"] == "OPTIMAL", cs
    best = _check(P, ex, es, "exhaustive", hw)
    assert _check(P, cp, cs, "cpsat", hw) == best
    for backend in milp.BACKENDS:
        mp, ms = milp.solve(P, time_limit=20, backend=backend)
        assert ms["status"] == "OPTIMAL", (backend, ms)
        assert ms["bound"] == best, (backend, ms)
        assert _check(P, mp, ms, f"milp-{backend}", hw) == best
    if gp is not None:
        assert _check(P, gp, {}, "greedy", hw) >= best
    # at the smallest ii alone the problem may be infeasible: every solver must say the same
    # (60 s: CBC proving infeasibility on a loaded 2-core CI machine took more than the default 10 s once)
    lb = {"exhaustive": exhaustive.solve(P, ii_max=P.ii_lb),
          "cpsat": cpsat.solve(P, ii_max=P.ii_lb, num_workers=1, time_limit=60)}
    lb |= {f"milp-{b}": milp.solve(P, ii_max=P.ii_lb, backend=b, time_limit=60) for b in milp.BACKENDS}
    got = {k: (s["status"], s.get("objective")) for k, (_, s) in lb.items()}
    assert len({st for st, _ in got.values()}) == 1, got
    if lb["exhaustive"][1]["status"] == "OPTIMAL":
        want = lb["exhaustive"][1]["objective"]
        for who, (prog, stats) in lb.items():
            assert prog.ii == P.ii_lb * P.grain and _check(P, prog, stats, who, hw) == want


@settings(max_examples=examples(60), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_graphs())
def test_exact_policies_agree(g: STaskGraph) -> None:
    _agree(g, TINY)


@settings(max_examples=examples(30), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_exact_policies_agree_shared_strategy(data: st.DataObject) -> None:
    """The same properties on the shared strategy of tests/strategies.py (MUFU work, two warpgroups)."""
    strategies = pytest.importorskip("strategies")
    _agree(data.draw(strategies.graphs()), strategies.tiny_hw())


@settings(max_examples=examples(25), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mirrored_graphs())
def test_symmetry_breaking_keeps_an_optimum(g: STaskGraph) -> None:
    assert cpsat._symmetry_task(model.build(g, TINY)), "the strategy should produce symmetric warpgroups"
    _agree(g, TINY)


@settings(max_examples=examples(40), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_graphs())
def test_exhaustive_methods_agree(g: STaskGraph) -> None:
    """Slot enumeration with least starts and the plain grid of every start find the same optimum (the grid,
    seeded with the other's answer, proves nothing better exists)."""
    P = model.build(g, TINY)
    for ii_max in (None, P.ii_lb):
        rp, rs = exhaustive.solve(P, ii_max=ii_max)
        try:
            gp, gs = exhaustive.solve(P, ii_max=ii_max, hint=rp, method="grid", max_nodes=300_000)
        except SolverError:
            assert rs["status"] == "INFEASIBLE"  # without an incumbent the grid may not finish: inconclusive
            continue
        assert rs["status"] == gs["status"] and rs.get("objective") == gs.get("objective"), (rs, gs)


def _sample() -> model.Problem:
    g = STaskGraph(name="tiny", op="test", params={}, tiling={"depth": 2},
                   tasks=(STask("a", "load", bytes=2 * Q * Q, is_async=True, allocs=(Buffer("ring", "smem", 1024),)),
                          STask("b", "mma", flops=3 * Q, group=0, is_async=True, frees=("ring",)),
                          STask("c", "vector", flops=2 * Q, group=0)),
                   edges=(Edge("a", "b"), Edge("b", "c"), Edge("c", "b", 1)), row=(1, 3, 4), rows=2, useful_flops=1)
    return model.build(g, TINY)


@pytest.mark.parametrize("backend", milp.BACKENDS)
def test_milp_hint_and_time_limit(backend: str) -> None:
    """A greedy hint does not change the optimum; an immediate time limit still answers (program or None)."""
    P = _sample()
    gp, _ = greedy.solve(P)
    _, ref = exhaustive.solve(P)
    p, s = milp.solve(P, backend=backend, hint=gp)
    assert s["status"] == "OPTIMAL" and s["objective"] == ref["objective"]
    assert check_valid(p, TINY)
    p, s = milp.solve(P, backend=backend, time_limit=0.0, hint=gp)
    assert s["status"] in ("OPTIMAL", "TIME_LIMIT")
    assert (p is None) == ("objective" not in s)


def test_cpsat_objective_is_its_programs() -> None:
    """Found by test_exact_policies_agree: at ii = ii_lb, CP-SAT claimed 96 grains for a schedule of 97."""
    Q2 = Q * Q
    g = STaskGraph(name="tiny", op="test", params={}, tiling={"depth": 1},
                   tasks=(STask("t0", "load", bytes=Q2, is_async=True, allocs=(Buffer("ring", "smem", 1024),)),
                          STask("t1", "load", bytes=Q2, is_async=True, frees=("ring",)),
                          STask("t2", "mma", flops=Q, group=0, is_async=True),
                          STask("t3", "load", bytes=2 * Q2, is_async=True),
                          STask("t4", "load", bytes=3 * Q2, is_async=True)),
                   edges=(Edge("t2", "t3"), Edge("t2", "t4"), Edge("t0", "t1"), Edge("t0", "t2")),
                   row=(2, 4, 4, 1), rows=2, useful_flops=1)
    P = model.build(g, TINY)
    _, ref = exhaustive.solve(P, ii_max=P.ii_lb)
    prog, stats = cpsat.solve(P, ii_max=P.ii_lb, num_workers=1)
    assert _check(P, prog, stats, "cpsat") == ref["objective"]


def test_exhaustive_refuses_large_graphs() -> None:
    tasks = tuple(STask(f"v{i}", "vector", flops=Q, group=0) for i in range(9))
    g = STaskGraph(name="big", op="test", params={}, tiling={}, tasks=tasks,
                   edges=tuple(Edge(f"v{i}", f"v{i + 1}") for i in range(8)), row=(2,), rows=1, useful_flops=1)
    with pytest.raises(SolverError, match="at most"):
        exhaustive.solve(model.build(g, TINY))


def test_milp_unknown_backend() -> None:
    with pytest.raises(SolverError, match="backend"):
        milp.solve(_sample(), backend="gurobi")
