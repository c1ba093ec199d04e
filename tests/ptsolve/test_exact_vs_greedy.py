"""Exact ≤ greedy with the compiler in the loop: on random operator configurations and every hardware table, CP-SAT's
answer is never predicted slower than greedy's when both face the same compiler. The compiler here is an oracle that
refuses a pseudo-random third of all schedules (by the program's hash: CP-SAT's optima, greedy's schedules and the
declared orders alike), or every schedule an exact policy found: the search must fall back within a tiling
(ptsolve.search), never drop a tiling whose greedy schedule the compiler would build."""
from __future__ import annotations

import functools
import hashlib
import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import examples

import ptsolve
from ptsolve.errors import InfeasibleError
from ptsolve.hw import load
from ptsolve.ir import STaskGraph
from ptsolve.kernelcheck import KernelCheck
from ptsolve.policies import greedy
from ptsolve.policies.model import build

pytest.importorskip("ortools")

HW = ("a100", "h100", "h200", "mi300x")


def schedule(program) -> str:
    """What a compiler sees of a program: the graph, ii and start times (never the policy's name)."""
    return json.dumps([program.graph.to_json(), program.ii, sorted(program.start.items())])


def third(program, hw) -> bool:
    """A pseudo-random third of all schedules, the same for the same schedule whoever found it."""
    return hashlib.sha256(schedule(program).encode()).digest()[0] % 3 == 0


@functools.cache
def _greedy(graph_json: str, hw: str) -> str:
    g = STaskGraph.from_json(graph_json)
    return schedule(greedy.solve(build(g, load(hw), "even"))[0])


def exact(program, hw) -> bool:
    """Every schedule but greedy's own for its tiling (CP-SAT's optima, the declared orders'): only greedy's build."""
    return schedule(program) != _greedy(program.graph.to_json(), hw.name)


def oracle(refuses):
    def check(program, hw) -> KernelCheck:
        if refuses(program, hw):
            return KernelCheck("rejected", "the oracle refuses it")
        return KernelCheck("ok", kernel="k")
    return check


configs = st.one_of(
    st.builds(lambda M, N, K: ptsolve.ops.gemm(M=M, N=N, K=K), st.sampled_from([64, 333, 1000, 4096]),
              st.sampled_from([256, 1024, 4096]), st.sampled_from([256, 1024, 4096])),
    st.builds(lambda b, h, s, d, c: ptsolve.ops.flash_attention(batch=b, heads=h[0], kv_heads=h[1], seq=s, head_dim=d,
                                                                causal=c),
              st.integers(1, 4), st.sampled_from([(8, 8), (8, 2), (28, 4)]), st.sampled_from([128, 700, 2048]),
              st.sampled_from([64, 128]), st.booleans()),
    st.builds(lambda b, s: ptsolve.ops.mamba2_chunk_state(batch=b, seq=s, heads=8, head_dim=64, d_state=128,
                                                          chunk=256), st.integers(1, 2), st.sampled_from([512, 1000])))


@settings(max_examples=examples(12), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(op=configs, hw=st.sampled_from(HW), refuses=st.sampled_from([third, exact]))
def test_exact_is_never_worse_than_greedy_when_the_compiler_refuses(monkeypatch, op, hw, refuses):
    monkeypatch.setattr(sys.modules["ptsolve.optimize"], "checker", lambda hwt: oracle(refuses))
    # deterministic: no wall clock decides anything (CP-SAT spends its own time, nothing is cut short by a deadline)
    kw = dict(hw=hw, cache=False, compile_check=True, replay=False, executor="serial", deterministic=True,
              time_limit=4)
    try:
        g = ptsolve.optimize(op, solver="greedy", **kw)
    except InfeasibleError:  # nothing of it fits this table, or every schedule greedy has was refused
        return
    e = ptsolve.optimize(op, solver="cpsat", **kw)
    assert e.kernel_check["status"] == "ok" and g.kernel_check["status"] == "ok"
    assert e.objective <= g.objective, (op.describe(), hw, e.tiling, g.tiling)
