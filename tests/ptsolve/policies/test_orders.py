"""Hand-known issue orders as points of the schedule space: policy cpsat-orders, cpsat's pin / cycle constraints,
and the kernel plan's rotation of symmetric warpgroups (codegen.plan.same_rotation)."""
from __future__ import annotations

import pytest

pytest.importorskip("ortools")

import ptsolve  # noqa: E402
from codegen.plan import fa3_order_plan, plan_from_program, same_rotation  # noqa: E402
from ptsolve.errors import SolverError  # noqa: E402
from ptsolve.hw import load  # noqa: E402
from ptsolve.kernelcheck import KernelCheck  # noqa: E402
from ptsolve.ops.attention import orders  # noqa: E402
from ptsolve.policies import cpsat  # noqa: E402
from ptsolve.policies import orders as orders_policy  # noqa: E402
from ptsolve.policies.model import build  # noqa: E402

H200 = load("h200")
T = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}
FA = ptsolve.ops.flash_attention(batch=1, heads=8, kv_heads=2, seq=1024, head_dim=128, causal=False)


def _cyclic(seq: list[str], ref: list[str]) -> bool:
    return len(seq) == len(ref) and any(seq[m:] + seq[:m] == ref for m in range(len(seq)))


def test_cpsat_orders_returns_fa3s_kernel_plan():
    """The pinned schedule lowers to FA3's order in every warpgroup (warpgroup 1 rotated back to warpgroup 0's
    start), FA3's turn order, one copy of each register buffer: the hand plan's loop, found by the solver."""
    r = ptsolve.optimize(FA, hw="h200", solver="cpsat-orders", time_limit=60, cache=False, fix=T,
                         compile_check=False, executor="serial")
    assert r.status == "FEASIBLE" and r.program.policy.startswith("cpsat-orders")
    plan = plan_from_program(r.program, "h200")
    hand = fa3_order_plan(dict(FA.params), T)
    for g in (0, 1):
        got = plan.order["loop"][f"wg{g}"]
        assert [t for t, _ in got] == [t for t, _ in hand.order["loop"][f"wg{g}"]]
        st = dict(got)  # stages relative to the warpgroup's QK: PV one behind, the softmax with the QK
        assert {t: s - st[f"mma_qk@{g}"] for t, s in got} == dict(hand.order["loop"][f"wg{g}"])
    assert _cyclic(plan.tc_order, [t for t, _ in orders(2)["fa3"]["tc"]])
    assert set(plan.copies.values()) == {1}


def test_cpsat_pin_and_cycle_are_constraints():
    """pin fixes a role's slot order and relative stages; cycle fixes a cyclic slot order. An impossible pin (PV
    before the QK whose scores it multiplies, same stage) is infeasible."""
    P = build(FA.graph(T, H200), H200)
    seq = orders(2)["fa3"]["wg0"]
    prog, st = cpsat.solve(P, time_limit=30, pin={"wg0": seq}, cycle=["mma_qk@0", "mma_pv@0", "mma_qk@1",
                                                                           "mma_pv@1"])
    assert prog is not None
    slot = {t: prog.start[t] % prog.ii for t in prog.start}
    assert [slot[t] for t, _ in seq] == sorted(slot[t] for t, _ in seq)
    k = {t: prog.start[t] // prog.ii for t, _ in seq}
    assert {t: k[t] - k["mma_qk@0"] for t, _ in seq} == dict(seq)
    tc = sorted(["mma_qk@0", "mma_pv@0", "mma_qk@1", "mma_pv@1"], key=lambda t: slot[t])
    assert _cyclic(tc, ["mma_qk@0", "mma_pv@0", "mma_qk@1", "mma_pv@1"])
    bad = [("mma_pv@0", 0), ("mma_qk@0", 0), ("rowmax@0", 0), ("exp2@0", 0), ("rowsum@0", 0), ("rescale@0", 0)]
    prog, st = cpsat.solve(P, time_limit=30, pin={"wg0": bad})
    assert prog is None and st["status"] == "INFEASIBLE"


def test_cpsat_orders_refuses_operators_without_orders():
    op = ptsolve.ops.gemm(M=1024, N=1024, K=1024)
    with pytest.raises(SolverError, match="declares no issue orders"):
        orders_policy.pins(build(op.graph(op.tilings()[0], H200), H200))


def test_same_rotation_only_where_the_turns_allow():
    """Warpgroup 1's loop, a rotation of warpgroup 0's, is rotated back (moved tasks one stage earlier) when the
    turn order still serves it in issue order; otherwise it is left as the model's slots cut it."""
    w0 = [("mma_qk@0", 1), ("mma_pv@0", 2), ("rowmax@0", 1), ("exp2@0", 1), ("rowsum@0", 1), ("rescale@0", 1)]
    w1 = [("rowmax@1", 2), ("exp2@1", 2), ("rowsum@1", 2), ("rescale@1", 2), ("mma_qk@1", 1), ("mma_pv@1", 2)]
    loop = {"producer": [("load_k", 0), ("load_v", 1)], "wg0": w0, "wg1": w1}
    out = same_rotation(loop, ["mma_qk@0", "mma_pv@0", "mma_qk@1", "mma_pv@1"])
    assert out["wg1"] == [("mma_qk@1", 1), ("mma_pv@1", 2), ("rowmax@1", 1), ("exp2@1", 1), ("rowsum@1", 1),
                          ("rescale@1", 1)]
    assert out["wg0"] == w0 and out["producer"] == loop["producer"]
    # a turn order that serves warpgroup 1's PV before its QK: the rotated form is the only consistent one
    assert same_rotation(loop, ["mma_qk@0", "mma_pv@1", "mma_qk@1", "mma_pv@0"])["wg1"] == w1


def test_declared_entry_starts_every_warpgroups_loop():
    """An operator's declared order fixes where each warpgroup's emitted loop begins (FlashAttention: at its QK),
    also for warpgroup 0 and for loops that are not rotations of each other; a stage pushed below 0 shifts every
    role alike; a turn order the rotated loop would contradict keeps the model's cut."""
    from codegen.plan import entries
    w0 = [("rowsum@0", 1), ("mma_qk@0", 0), ("mma_pv@0", 1), ("rowmax@0", 0), ("exp2@0", 0), ("rescale@0", 0)]
    w1 = [("exp2@1", 1), ("rowsum@1", 1), ("rescale@1", 1), ("mma_qk@1", 0), ("mma_pv@1", 1), ("rowmax@1", 0)]
    loop = {"producer": [("load_k", 0), ("load_v", 0)], "wg0": w0, "wg1": w1}
    ent = entries("flash_attention", 2)
    assert ent == {"wg0": "mma_qk@0", "wg1": "mma_qk@1"} and entries("gemm", 2) is None
    tc = ["mma_qk@0", "mma_pv@0", "mma_qk@1", "mma_pv@1"]
    out = same_rotation(loop, tc, ent)
    assert out["wg0"] == [("mma_qk@0", 0), ("mma_pv@0", 1), ("rowmax@0", 0), ("exp2@0", 0), ("rescale@0", 0),
                          ("rowsum@0", 0)]  # rowsum moved to the end: one stage earlier
    assert out["wg1"] == [("mma_qk@1", 0), ("mma_pv@1", 1), ("rowmax@1", 0), ("exp2@1", 0), ("rowsum@1", 0),
                          ("rescale@1", 0)]
    assert out["producer"] == loop["producer"]
    # a stage-0 task moved to the end would run at stage -1: every role shifts up by one instead
    low = dict(loop, wg0=[("rowsum@0", 0), ("mma_qk@0", 0), ("mma_pv@0", 1), ("rowmax@0", 0), ("exp2@0", 0),
                          ("rescale@0", 0)])
    out = same_rotation(low, tc, ent)
    assert out["wg0"][-1] == ("rowsum@0", 0) and out["wg0"][0] == ("mma_qk@0", 1)
    assert out["producer"] == [("load_k", 1), ("load_v", 1)] and out["wg1"][0] == ("mma_qk@1", 1)
    # PV before QK in warpgroup 1's turn: its rotated loop (QK first) would contradict it, so it keeps its cut
    kept = same_rotation(loop, ["mma_qk@0", "mma_pv@0", "mma_pv@1", "mma_qk@1"], ent)
    assert [t for t, _ in kept["wg1"]] == [t for t, _ in w1]


def test_the_replay_picks_the_declared_order_the_formula_ranks_second(monkeypatch):
    """CP-SAT's formula optimum on FA's one-tiling search is a free order; the declared FA3 order's best schedule
    costs more by the formula (its fill and drain at steady-state slots) but less in the asap replay, so optimize
    returns the FA3 order: FEASIBLE, the search's bound kept, the reason in ``features``. Where the replay ranks them
    the other way, the formula's proven optimum stands."""
    import sys

    from ptsolve.search import search
    from ptsolve.simulate import replay_us
    opt = sys.modules["ptsolve.optimize"]
    fix = T | {"persistent": 1}
    formula = search(FA, "h200", solver="cpsat", time_limit=60, fix=fix, executor="serial")
    assert formula.status == "OPTIMAL" and not formula.program.policy.startswith("cpsat-orders")
    r = ptsolve.optimize(FA, hw="h200", solver="cpsat", time_limit=60, cache=False, fix=fix, compile_check=False,
                         executor="serial")
    assert r.program.policy.startswith("cpsat-orders") and r.status == "FEASIBLE"
    assert r.objective > formula.objective == r.bound
    assert replay_us(r.program, "h200") < replay_us(formula.program, "h200")
    assert r.features[0].startswith("issue order: the operator's declared order") and "OPTIMAL" in r.features[0]
    assert r.kernel_check is None  # no compiler asked for, none claimed
    plan = plan_from_program(r.program, "h200")
    assert [t for t, _ in plan.order["loop"]["wg0"]] == [t for t, _ in orders(2)["fa3"]["wg0"]]
    # asked for a compiler that is not there: the declared order's answer says so too
    monkeypatch.setattr(opt, "checker", lambda hw: None)
    r1 = opt.optimize(FA, hw="h200", solver="cpsat", time_limit=60, cache=False, fix=fix, compile_check=True,
                      executor="serial")
    assert r1.program.policy.startswith("cpsat-orders") and r1.kernel_check["status"] == "not compile-checked"
    # the replay reversed: the declared order replays slower, CP-SAT's proven answer is returned as it was
    monkeypatch.setattr(sys.modules["ptsolve.simulate"], "replay_us",
                        lambda p, hw=None: 2.0 if p.policy.startswith("cpsat-orders") else 1.0)
    r2 = opt.optimize(FA, hw="h200", solver="cpsat", time_limit=60, cache=False, fix=fix, compile_check=False,
                      executor="serial")
    assert r2.status == "OPTIMAL" and r2.objective == formula.objective and r2.program == formula.program
    # with a compiler: the slower-replaying declared order is never compiled (the replay decides first)
    asked = []

    def counting(program, hw):
        asked.append(program.start)
        return KernelCheck("ok", kernel="k")
    monkeypatch.setattr(opt, "checker", lambda hw: counting)
    r3 = opt.optimize(FA, hw="h200", solver="cpsat", time_limit=60, cache=False, fix=fix, compile_check=True,
                      executor="serial")
    assert r3.program == formula.program and asked and r.program.start not in asked


def test_the_asap_replay_is_never_later_than_the_plan():
    """replay_us runs the program's orders with no planned starts: every instance starts no later than planned (the
    same order on every stream and unit); strictly earlier for CP-SAT's schedules here, whose fill waits for slots
    (greedy's list schedule already starts everything as early as its order allows)."""
    from ptsolve.search import search
    from ptsolve.simulate import predicted_us, replay_us, simulate
    for solver in ("cpsat", "cpsat-orders", "greedy"):
        p = search(FA, "h200", solver=solver, time_limit=30, fix=T | {"persistent": 1}, executor="serial").program
        asap, timed = simulate(p, H200, mode="asap"), simulate(p, H200)
        assert all(a.start <= b.start for a, b in zip(asap.events, timed.events))
        assert replay_us(p, H200) == asap.kernel_us <= predicted_us(p, H200) == timed.kernel_us
        assert solver == "greedy" or asap.kernel_us < timed.kernel_us


def test_a_cutoff_keeps_only_strictly_better_schedules():
    """cpsat's ``cutoff``: at the optimum nothing is left (INFEASIBLE, a quick refutation); one cycle above, the
    optimum comes back."""
    P = build(FA.graph(T, H200), H200)
    prog, st = cpsat.solve(P, time_limit=30, num_workers=1)
    assert st["status"] == "OPTIMAL"
    none, st0 = cpsat.solve(P, time_limit=30, num_workers=1, cutoff=st["objective"])
    assert none is None and st0["status"] == "INFEASIBLE"
    again, st1 = cpsat.solve(P, time_limit=30, num_workers=1, cutoff=st["objective"] + 1)
    assert st1["objective"] == st["objective"]


def test_pins_with_cutoffs_find_what_every_pin_solved_alone_finds():
    """cpsat-orders solves its pins one after another, each under the best so far as a cutoff, and solves the winner
    again without one: the same schedule as solving every pin in full and keeping the first best."""
    P = build(FA.graph(T | {"persistent": 1}, H200), H200, )
    prog, st = orders_policy.solve(P, time_limit=60, num_workers=1)
    Q = orders_policy.one_copy(P)
    full = [cpsat.solve(Q, time_limit=30, num_workers=1, pin=pin, cycle=cyc or None)
            for pin, cyc in orders_policy.pins(P)]
    best = min(range(len(full)), key=lambda i: (full[i][1]["objective"], i))
    assert len(full) > 1 and best > 0  # the winner is not the first pin: it was found under a cutoff
    assert st["objective"] == full[best][1]["objective"] and prog == full[best][0]
