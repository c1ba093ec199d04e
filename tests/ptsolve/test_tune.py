"""Measured selection (ptsolve.tune) on the CPU with a stand-in runner: the K best distinct schedules in the
model's order, the measured best returned and cached, the prepare / GPU / finish round trip of the CLI."""
from __future__ import annotations

import json

import pytest

import ptsolve
from ptsolve.cli import main
from ptsolve.errors import PtsolveError
from ptsolve.tune import candidates, tune

OP = ptsolve.ops.gemm(M=512, N=512, K=512)
ARGS = ["gemm", "M=512", "N=512", "K=512", "--hw", "h200", "--top-k", "3", "--search-limit", "10"]


def test_candidates_are_distinct_and_in_the_models_order():
    cands, rejected = candidates(OP, "h200", 3, time_limit=10)
    assert [c.rank for c in cands] == [0, 1, 2] and rejected == []
    tilings = [tuple(sorted(c.tiling.items())) for c in cands]
    assert len(set(tilings)) == 3
    objs = [c.result.objective for c in cands]
    assert objs == sorted(objs)
    assert cands[0].result.objective == ptsolve.optimize(OP, "h200", time_limit=10).objective
    with pytest.raises(PtsolveError, match="top_k"):
        candidates(OP, "h200", 0)



def test_candidate_0_is_optimizes_answer_when_the_compiler_keeps_a_declared_order(monkeypatch):
    """The compiler rejects every free order and takes FlashAttention's declared (FA3) order: optimize keeps the first
    rejected tiling with that order (optimize._compiler_in_the_loop), so measured selection must time it too, as
    candidate 0; the per-tiling walk alone finds nothing (it drops rejected tilings)."""
    import sys

    from ptsolve.kernelcheck import KernelCheck
    opt = sys.modules["ptsolve.optimize"]
    op = ptsolve.ops.flash_attention(batch=1, heads=8, kv_heads=2, seq=1024, head_dim=128)
    fix = {"BM": 128, "BN": 128, "depth": 2, "groups": 2, "persistent": 1}

    def fake(program, hw):
        ok = program.policy.startswith("cpsat-orders")
        return KernelCheck("ok", kernel="k") if ok else KernelCheck("rejected", "serialised")
    monkeypatch.setattr(opt, "checker", lambda hw: fake)
    # deterministic: both solves are functions of the model, so they agree on any machine load
    first = ptsolve.optimize(op, hw="h200", cache=False, compile_check=True, jobs=1, fix=fix, time_limit=10,
                             deterministic=True)
    cands, rejected = candidates(op, "h200", 2, time_limit=10, fix=fix, deterministic=True)
    assert [c.rank for c in cands] == [0] and cands[0].result.program == first.program
    assert cands[0].result.status == "FEASIBLE" and cands[0].check.status == "ok" and rejected


def test_candidates_rank_ties_as_search_does():
    """GEMM1's ring depths 3 and 4, with the TMA store or without, tie in kernel time; search breaks the tie by the
    busiest slot's latency, then the tiling's tie key (search.answer_key), and the measured selection's rank 0 is the
    same schedule."""
    op = ptsolve.ops.gemm(M=8192, N=14336, K=4096)
    cands, _ = candidates(op, "h200", 3, check=False, time_limit=10)
    assert len({c.result.objective for c in cands}) == 1
    assert len({(c.tiling["depth"], c.tiling.get("tma_store", 0)) for c in cands}) == 3
    assert cands[0].tiling == ptsolve.optimize(op, "h200", compile_check=False, cache=False, time_limit=10).tiling


def test_candidates_hold_other_orders_of_a_tiling():
    """With two policies a tiling gives each distinct order (greedy's differs from CP-SAT's on causal attention),
    never the same kernel twice; still in the model's order."""
    from ptsolve.tune import order_key
    fa = ptsolve.ops.flash_attention(batch=1, heads=8, kv_heads=2, seq=1024, head_dim=128, causal=True)
    # grid launches only: with persistent CTAs too, the top 6 are six tilings of one order each
    cands, _ = candidates(fa, "h200", 6, solver="cpsat,greedy", time_limit=10, check=False, fix={"persistent": 0})
    keys = [(tuple(sorted(c.tiling.items())), order_key(c.result.program)) for c in cands]
    assert len(set(keys)) == len(keys)
    tilings = [k[0] for k in keys]
    assert len(set(tilings)) < len(tilings)  # some tiling appears with two orders
    assert [c.result.objective for c in cands] == sorted(c.result.objective for c in cands)
    with pytest.raises(PtsolveError, match="empty policy"):
        candidates(fa, "h200", 2, solver="cpsat,", check=False)

def test_candidates_per_structure():
    """``per``: the K best of each structure (GEMM cooperative and ping-pong), ranked together by prediction, so the
    measured selection times both structures whichever the model ranks first (at 8192³ its own top 2 were
    cooperative before bench study gemm_model, ping-pong after)."""
    op = ptsolve.ops.gemm(M=8192, N=8192, K=8192)
    plain, _ = candidates(op, "h200", 2, solver="greedy", check=False)
    cands, _ = candidates(op, "h200", 2, solver="greedy", check=False, per=("pingpong",))
    assert sorted(bool(c.tiling.get("pingpong")) for c in cands) == [False, False, True, True]
    assert [c.rank for c in cands] == [0, 1, 2, 3]
    assert [c.result.objective for c in cands] == sorted(c.result.objective for c in cands)
    assert [c.tiling for c in cands[:2]] == [c.tiling for c in plain]


def test_tune_keeps_the_measured_best_and_caches_it():
    calls = []

    def runner(programs, hw):
        calls.append(len(programs))
        return [30.0, 10.0, 20.0][:len(programs)]  # the model's second choice is the fastest kernel

    r = tune(OP, "h200", top_k=3, runner=runner, time_limit=10)
    assert r.measured_us == 10.0 and [m["measured_us"] for m in r.measured] == [30.0, 10.0, 20.0]
    assert dict(r.tiling) == r.measured[1]["tiling"] and calls == [3]

    def broken(programs, hw):
        raise AssertionError("a cached selection must not be timed again")
    again = tune(OP, "h200", top_k=3, runner=broken, time_limit=10)
    assert again.measured_us == 10.0 and dict(again.tiling) == dict(r.tiling)
    r2 = tune(OP, "h200", top_k=3, runner=lambda p, hw: [5.0, 9.0, 9.0], time_limit=10, cache=False)
    assert r2.measured_us == 5.0 and dict(r2.tiling) == r.measured[0]["tiling"]


@pytest.mark.parametrize("times,match", [([1.0], "returned 1 times"), ([float("inf")] * 2, "every candidate")])
def test_tune_refuses_bad_runner_output(times, match):
    with pytest.raises(PtsolveError, match=match):
        tune(OP, "h200", top_k=2, runner=lambda p, hw: times, time_limit=10)


def test_prepare_time_finish_round_trip(tmp_path, capsys):
    f = tmp_path / "cands.json"
    assert main(["tune", *ARGS, "--prepare", str(f)]) == 0
    doc = json.loads(f.read_text())
    assert len(doc["candidates"]) == 3 and doc["top_k"] == 3 and doc["solver"] == "cpsat"
    assert main(["tune", *ARGS, "--finish", str(f)]) == 2  # not timed yet: one line, non-zero
    assert "measured_us" in capsys.readouterr().err
    doc["measured_us"] = [12.0, 11.0, float("inf")]  # what codegen.tune_runner writes on the GPU (inf: failed check)
    doc["rejected"] = [[{"BM": 256}, "rejected: 64 bytes of register spills"]]
    f.write_text(json.dumps(doc))
    assert main(["tune", *ARGS, "--finish", str(f)]) == 0
    out = capsys.readouterr().out
    assert "measured 11.0 µs  <- measured best" in out and "cached" in out
    assert "1 tiling(s) met while collecting the candidates rejected by the compiler" in out
    r = tune(OP, "h200", top_k=3, runner=lambda p, hw: pytest.fail("timed again"), time_limit=10)
    assert r.measured_us == 11.0 and dict(r.tiling) == doc["candidates"][1]["tiling"]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc | {"params": {"M": 1, "N": 8, "K": 8, "dtype": "fp16"}}))
    assert main(["tune", *ARGS, "--finish", str(other)]) == 2
    assert "not of gemm" in capsys.readouterr().err


def test_prepare_per_structure_round_trip(tmp_path, capsys):
    """``ptsolve tune --per pingpong``: the prepare file holds both structures' candidates and names ``per``; its
    finished selection is cached under its own key (a plain ``tune`` of the shape is not answered by it)."""
    f = tmp_path / "cands.json"
    args = ["gemm", "M=512", "N=512", "K=512", "--hw", "h200", "--top-k", "1", "--search-limit", "10", "--solver",
            "greedy"]
    assert main(["tune", *args, "--prepare", str(f), "--per", "pingpong"]) == 0
    doc = json.loads(f.read_text())
    assert doc["per"] == ["pingpong"] and len(doc["candidates"]) == 2
    assert sorted(bool(c["tiling"].get("pingpong")) for c in doc["candidates"]) == [False, True]
    doc["measured_us"] = [12.0, 11.0]
    f.write_text(json.dumps(doc))
    assert main(["tune", *args, "--finish", str(f)]) == 0
    capsys.readouterr()
    r = tune(OP, "h200", top_k=1, solver="greedy", runner=lambda p, hw: pytest.fail("timed again"), time_limit=10,
             per=("pingpong",))
    assert r.measured_us == 11.0
    with pytest.raises(BaseException, match="timed again"):
        tune(OP, "h200", top_k=1, solver="greedy", runner=lambda p, hw: pytest.fail("timed again"), time_limit=10)
