"""The compiler in the loop inside the search (ptsolve.search): a refused schedule gives way to its tiling's next
one, the exact answer is never worse than greedy's compile-clean answer, OPTIMAL stays honest, and an operator the
generator cannot build at all is answered at once."""
from __future__ import annotations

import hashlib
import json
import sys

import pytest

import ptsolve
from ptsolve.hw import load
from ptsolve.kernelcheck import KernelCheck

pytest.importorskip("ortools")

OPS = {
    "fa": lambda: ptsolve.ops.flash_attention(batch=1, heads=4, kv_heads=2, seq=700, head_dim=64, causal=True),
    "gemm": lambda: ptsolve.ops.gemm(1000, 1024, 2048),
    "scan": lambda: ptsolve.ops.mamba2_chunk_scan(1, 1000, 4, 64, 64, 128),
    "state": lambda: ptsolve.ops.mamba2_chunk_state(1, 1000, 4, 64, 64, 128),
}


def coin(salt: str):
    """A stand-in compiler that refuses about half of all schedules, by a hash of the schedule itself (so greedy's
    and CP-SAT's schedules of one tiling get independent verdicts, and a run gets the same ones every time)."""
    def chk(p, hw):
        key = json.dumps([salt, p.graph.tiling, p.ii, sorted(p.start.items())], sort_keys=True)
        bad = hashlib.sha256(key.encode()).digest()[0] % 2
        return KernelCheck("rejected", "coin") if bad else KernelCheck("ok", kernel="k", target="test")
    return chk


def _opt(op, hw, solver, chk, monkeypatch):
    monkeypatch.setattr(sys.modules["ptsolve.optimize"], "checker", lambda h: chk)
    return ptsolve.optimize(op, hw=hw, solver=solver, cache=False, compile_check=True, jobs=1, deterministic=True,
                            time_limit=3, replay=False)


@pytest.mark.parametrize("hw", ["h200", "mi300x"])
@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("salt", ["a", "b"])
def test_exact_is_never_worse_than_greedy_with_the_compiler_in_the_loop(name, hw, salt, monkeypatch):
    op, chk = OPS[name](), coin(salt)
    try:
        g = _opt(op, hw, "greedy", chk, monkeypatch)
    except ptsolve.errors.InfeasibleError:
        pytest.skip(f"no tiling of {name} fits {hw}")
    x = _opt(op, hw, "cpsat", chk, monkeypatch)
    assert g.kernel_check["status"] == x.kernel_check["status"] == "ok"
    assert chk(x.program, None).ok and chk(g.program, None).ok  # what is returned is what the compiler took
    assert x.objective <= g.objective, (x.tiling, x.objective, g.tiling, g.objective)
    # OPTIMAL is over compile-clean schedules and honest: it is the model's optimum, which the compiler happened to
    # take (a refused better schedule leaves its tiling's bound below the answer)
    free = _opt(op, hw, "cpsat", lambda p, h: KernelCheck("ok", kernel="k"), monkeypatch)
    assert x.objective >= free.objective and x.bound <= free.objective
    if x.status == "OPTIMAL":
        assert x.objective == free.objective
    elif x.rejected:
        assert x.status in ("FEASIBLE", "TIME_LIMIT") or x.objective == free.objective


def test_a_refused_schedule_keeps_its_tiling(monkeypatch):
    """One tiling searched (at its ring depths): CP-SAT's schedules refused, greedy's taken. The tiling stays with
    greedy's schedule (named so), FEASIBLE with the gap to the refused optimum: never an error for a tiling the
    compiler builds."""
    op = OPS["gemm"]()
    free = _opt(op, "h200", "cpsat", lambda p, hw: KernelCheck("ok", kernel="k"), monkeypatch)
    fix = {k: v for k, v in free.tiling.items() if k != "depth"}  # the ring depths of that tiling

    def chk(p, hw):
        return KernelCheck("ok", kernel="k") if "greedy" in p.policy else KernelCheck("rejected", "serialised")
    monkeypatch.setattr(sys.modules["ptsolve.optimize"], "checker", lambda h: chk)
    r = ptsolve.optimize(op, hw="h200", cache=False, compile_check=True, jobs=1, deterministic=True, time_limit=3,
                         replay=False, fix=fix)
    same = lambda t: {k: v for k, v in t.items() if k != "depth"} == fix  # noqa: E731
    assert same(r.tiling) and r.rejected and all(same(t) for t, _ in r.rejected)
    assert "greedy's schedule" in r.program.policy and r.kernel_check["status"] == "ok"
    if r.objective > free.objective:  # the refused optimum bounds the answer: not proven
        assert r.status == "FEASIBLE" and r.bound <= free.objective


@pytest.mark.parametrize("head_dim", [96, 256])
def test_an_operator_no_generator_builds_is_answered_at_once(head_dim, monkeypatch):
    """A generator that refuses the operator (mocked here), not a schedule: the first verdict stops the checks:
    the model's answer comes back marked, after one compile check, not one per tiling."""
    calls = []

    def chk(p, hw):
        calls.append(p.graph.tiling)
        return KernelCheck("unsupported", f"head_dim {head_dim}", scope="operator")
    op = ptsolve.ops.flash_attention(batch=1, heads=32, kv_heads=8, seq=2048, head_dim=head_dim)
    r = _opt(op, "h100", "cpsat", chk, monkeypatch)
    assert r.kernel_check["status"] == "unsupported" and r.kernel_check["scope"] == "operator"
    # one tiling asked (its schedule and, side by side, its deepened twin), not one per tiling
    assert len({json.dumps(t, sort_keys=True) for t in calls}) == 1 and not r.rejected
    # a tiling past the model's register estimate needs the compiler's yes, which an unbuildable operator never
    # gets: the answer fits the estimate (head_dim 96 has such tilings predicted faster)
    from ptsolve.policies.model import fits
    assert fits(r.program.graph, load("h100")) is None


def test_the_verdict_speaks_the_targets_words(monkeypatch):
    """A compile-clean gfx942 kernel is MFMA work, not a wgmma pipeline; an sm_90a one is."""
    op = OPS["gemm"]()
    for target, word, not_word in (("gfx942", "MFMA", "wgmma"), ("sm_90a", "wgmma pipelined", "MFMA")):
        r = _opt(op, "h200", "greedy", lambda p, hw, t=target: KernelCheck("ok", kernel="k", registers=90, target=t),
                 monkeypatch)
        assert word in r.kernel_summary() and not_word not in r.kernel_summary()


def test_a_given_kernel_check_replaces_the_registered_one(monkeypatch):
    """``kernel_check``: the check the caller names (the serving layer's shape-generic build) is the one asked, and the
    answer is what it took; a value that is not a function is refused before any work."""
    monkeypatch.setattr(sys.modules["ptsolve.optimize"], "checker",
                        lambda h: lambda p, hw: pytest.fail("the registered check was asked"))
    chk = coin("given")
    r = ptsolve.optimize(OPS["gemm"](), hw="h200", cache=False, compile_check=True, jobs=1, deterministic=True,
                         time_limit=3, replay=False, kernel_check=chk)
    assert r.kernel_check["status"] == "ok" and chk(r.program, None).ok
    with pytest.raises(ptsolve.errors.PtsolveError, match="kernel_check must be a function"):
        ptsolve.optimize(OPS["gemm"](), hw="h200", cache=False, compile_check=True, kernel_check="nvcc")


def test_past_the_deadline_the_answer_is_still_compile_checked(monkeypatch):
    """Out of time, the answer is still one the compiler was asked about: a slow refusal (nvcc's seconds) counts as
    much as the generator's immediate one, and the answer is the next schedule the compiler passes, marked ok."""
    import time

    from ptsolve import search

    monkeypatch.setattr(search._Search, "_late", lambda self: True)
    free = _opt(OPS["gemm"](), "h200", "greedy", lambda p, hw: KernelCheck("ok", kernel="k"), monkeypatch)
    first = dict(free.tiling)
    asked = []

    def chk(p, hw):
        asked.append(dict(p.graph.tiling))
        time.sleep(0.3)  # nvcc's verdict comes after the deadline
        if dict(p.graph.tiling) == first:
            return KernelCheck("rejected", "96 bytes of register spills", kernel="k")
        return KernelCheck("ok", kernel="k")
    r = _opt(OPS["gemm"](), "h200", "greedy", chk, monkeypatch)
    assert dict(r.tiling) != first and r.kernel_check["status"] == "ok"
    assert r.rejected and r.rejected[0][0] == first and asked[0] == first and dict(r.tiling) in asked


def test_the_decoupled_ablation_takes_the_roofline_next_tiling_the_compiler_builds(monkeypatch):
    """decoupled: the tiling with the least roofline bound, alone; where the compiler refuses all its schedules, the
    roofline's next one, never an error while one builds."""
    op = OPS["gemm"]()
    ok = lambda p, hw: KernelCheck("ok", kernel="k")  # noqa: E731
    monkeypatch.setattr(sys.modules["ptsolve.optimize"], "checker", lambda h: ok)
    kw = dict(hw="h200", cache=False, compile_check=True, jobs=1, deterministic=True, time_limit=3, replay=False,
              decoupled=True)
    shape = lambda t: {k: v for k, v in t.items() if k != "depth"}  # noqa: E731  (the answer's ring may be deepened)
    first = shape(ptsolve.optimize(op, **kw).tiling)

    def chk(p, hw):
        return KernelCheck("rejected", "serialised") if shape(p.graph.tiling) == first else ok(p, hw)
    monkeypatch.setattr(sys.modules["ptsolve.optimize"], "checker", lambda h: chk)
    r = ptsolve.optimize(op, **kw)
    assert shape(r.tiling) != first and r.kernel_check["status"] == "ok"
    assert r.rejected and all(shape(t) == first for t, _ in r.rejected)


def test_a_cached_answer_the_compiler_never_saw_is_solved_again(tmp_path, monkeypatch):
    """An answer kept while no compiler was asked ("not compile-checked": older runs cut short by the time limit, or
    no nvcc) is not served to a search with the compiler in the loop: it is solved again and checked."""
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    asked = []

    def run(chk):
        monkeypatch.setattr(sys.modules["ptsolve.optimize"], "checker", lambda h: chk)
        return ptsolve.optimize(OPS["gemm"](), hw="h200", solver="greedy", compile_check=True, jobs=1,
                                deterministic=True, time_limit=3, replay=False)
    r0 = run(lambda p, hw: KernelCheck("not compile-checked", "nvcc not found"))
    assert r0.kernel_check["status"] == "not compile-checked" and not r0.cached
    r1 = run(lambda p, hw: asked.append(1) or KernelCheck("ok", kernel="k"))
    assert asked and not r1.cached and r1.kernel_check["status"] == "ok"
    r2 = run(lambda p, hw: pytest.fail("a checked answer is served from the cache"))
    assert r2.cached and r2.kernel_check["status"] == "ok"


def test_a_tiling_the_generator_cannot_build_is_never_solved(monkeypatch):
    """A checker's ``buildable`` refuses tilings before the search: none of them is solved, asked of the compiler or
    returned (the CUDA generator's one-M-tile-per-warpgroup rule is such a refusal)."""
    asked = []

    def chk(p, hw):
        asked.append(dict(p.graph.tiling))
        return KernelCheck("ok", kernel="k")
    chk.buildable = lambda g: "two M tiles per warpgroup" if g.tiling["BM"] != 64 * g.tiling["groups"] else None
    op = ptsolve.ops.flash_attention(batch=2, heads=32, kv_heads=8, seq=4096, head_dim=128, causal=True)
    # the measured register overcount (Hardware.reg_overcount) rules most such tilings out by itself: without it, the
    # generator's rule is the one at work here
    from dataclasses import replace
    hw = load("h200")
    hw = replace(hw, op_constants={o: v for o, v in hw.op_constants.items() if o != "flash_attention"})
    r = _opt(op, hw, "cpsat", chk, monkeypatch)
    assert r.tiling["BM"] == 64 * r.tiling["groups"] and r.kernel_check["status"] == "ok"
    assert asked and all(t["BM"] == 64 * t["groups"] for t in asked) and not r.rejected
    # without the rule the model's first choice here is a tiling of two M tiles per warpgroup: the rule is what moved it
    free = _opt(op, hw, "cpsat", lambda p, hw: KernelCheck("ok", kernel="k"), monkeypatch)
    assert free.tiling["BM"] != 64 * free.tiling["groups"]


def test_the_cuda_generators_tiling_rule():
    from codegen.compile_check import cuda_buildable

    op = ptsolve.ops.flash_attention(batch=2, heads=32, kv_heads=8, seq=4096, head_dim=128)
    g = {k: op.graph(t, load("h200")) for k, t in (("two", {"BM": 256, "BN": 128, "depth": 2, "groups": 2}),
                                                   ("one", {"BM": 128, "BN": 128, "depth": 2, "groups": 2}))}
    assert "64 query rows per consumer warpgroup" in cuda_buildable(g["two"]) and cuda_buildable(g["one"]) is None
    # about the operator, not the tiling: left to the first compile check (scope "operator")
    bad = ptsolve.ops.flash_attention(batch=2, heads=32, kv_heads=8, seq=4096, head_dim=48)
    assert cuda_buildable(bad.graph({"BM": 128, "BN": 128, "depth": 2, "groups": 2}, load("h200"))) is None


def test_a_tiling_past_its_register_budget_by_more_than_the_overcount_is_never_searched(monkeypatch):
    """Hardware.reg_overcount: a tiling whose register estimate passes its budget by more than the operator's measured
    overcount is out before any solve or compile (ptsolve.validate.register_refusal, with its reason); one within it
    is still searched and the compiler decides. The default (unmeasured) rules nothing out."""
    from dataclasses import replace

    from ptsolve.validate import register_excess, register_refusal
    op = ptsolve.ops.flash_attention(batch=16, heads=16, kv_heads=16, seq=512, head_dim=64)
    base = load("h100", calibrated=False)
    tight = replace(base, op_constants={"flash_attention": {"reg_overcount": 8}})
    excess = {json.dumps(g.tiling, sort_keys=True): x[1] - x[2] for g in map(lambda t: op.graph(t, base),
                                                                             op.tilings())
              if (x := register_excess(g, {}, base))}
    assert any(e > 8 for e in excess.values()) and any(0 < e <= 8 for e in excess.values())
    for g in map(lambda t: op.graph(t, base), op.tilings()):
        e = excess.get(json.dumps(g.tiling, sort_keys=True), 0)
        assert register_refusal(g, base) is None  # unmeasured: the compiler decides
        assert (register_refusal(g, tight) is not None) == (e > 8)
    asked: dict[str, list[dict]] = {"loose": [], "strict": []}

    def chk(run):
        def ask(p, hw):
            asked[run].append(dict(p.graph.tiling))
            return KernelCheck("ok", kernel="k", target="test")
        return ask
    loose = _opt(op, base, "greedy", chk("loose"), monkeypatch)
    strict = _opt(op, tight, "greedy", chk("strict"), monkeypatch)
    # tilings past by more were candidates before (where their bound could win), none is now
    assert 0 < loose.tilings - strict.tilings <= sum(e > 8 for e in excess.values())
    assert asked["strict"] and all(excess.get(json.dumps(t, sort_keys=True), 0) <= 8 for t in asked["strict"])


def test_a_refusal_the_checker_predicts_costs_no_compile(monkeypatch):
    """A checker's ``predict`` names a refusal before the compiler runs: the schedule is refused with that reason and
    the checker itself is never asked about it; the search goes on to other schedules exactly as after a compiled
    refusal, and the answer is one the checker was asked about."""
    op = OPS["gemm"]()
    free = _opt(op, "h200", "greedy", lambda p, hw: KernelCheck("ok", kernel="k"), monkeypatch)
    first = dict(free.tiling)
    asked = []

    def chk(p, hw):
        asked.append(dict(p.graph.tiling))
        return KernelCheck("ok", kernel="k")
    chk.predict = lambda p, hw: "predicted: the first choice" if dict(p.graph.tiling) == first else None
    r = _opt(op, "h200", "greedy", chk, monkeypatch)
    assert r.tiling != first and r.kernel_check["status"] == "ok" and first not in asked and asked
    assert any("predicted: the first choice" in why for _, why in r.rejected)
