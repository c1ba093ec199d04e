"""Hypothesis strategies: random small sTask-graphs and the tiny hardware they are scheduled on."""
from __future__ import annotations

import os
from dataclasses import replace

from hypothesis import strategies as st

from ptsolve.hw import Hardware, load
from ptsolve.ir import Buffer, Edge, STask, STaskGraph


def examples(n: int) -> int:
    """Hypothesis examples per property test: ``n`` (sized for CI's 2 cores), ten times that for the deeper run
    (``PTSOLVE_DEEP_TESTS=1 python -m pytest -n auto``, README), or 6 under mutation testing (`python -m bench
    mutation` sets PTSOLVE_MUTATION=1), where every mutant reruns the tests and derandomized runs keep the same first
    examples."""
    if os.environ.get("PTSOLVE_MUTATION"):
        return min(n, 6)
    return 10 * n if os.environ.get("PTSOLVE_DEEP_TESTS") == "1" else n


def tiny_hw(sms: int = 2) -> Hardware:
    """An H100 with round numbers: 1 B/clk loads, 64 FLOP/clk mma, no launch overhead."""
    return replace(load("h100"), sms=sms, hbm_bytes_per_s=1e30, l2_bytes_per_clk=1.0, mem_latency=16,
                   tc_flops_per_clk=64.0, tc_efficiency=1.0, tc_latency=8, tc_fixed=0, issue_cycles=8, barrier_cycles=8,
                   fp32_flops_per_clk=128.0, vector_efficiency=1.0, launch_us=0.0)


@st.composite
def graphs(draw: st.DrawFn, max_loop: int = 5) -> STaskGraph:
    """A random loop body: loads on the producer, mma / vector tasks on one or two warpgroups, a DAG of
    zero-distance edges (each task after a load), an optional loop-carried edge, pre and post tasks."""
    groups = draw(st.integers(1, 2))
    n_load = draw(st.integers(1, 2))
    n_comp = draw(st.integers(1, max_loop - n_load))
    tasks: list[STask] = []
    for i in range(n_load):
        tasks.append(STask(f"ld{i}", "load", bytes=8 * draw(st.integers(1, 6)), is_async=True,
                           allocs=(Buffer(f"b{i}", "smem", 1024),)))
    comp = []
    for j in range(n_comp):
        g = draw(st.integers(0, groups - 1))
        kind = draw(st.sampled_from(["mma", "vector"]))
        src = f"b{draw(st.integers(0, n_load - 1))}"
        t = STask(f"c{j}", kind, flops=64 * draw(st.integers(1, 6)), is_async=kind == "mma", group=g,
                  sfu=8 * draw(st.integers(0, 2)) if kind == "vector" else 0, reads=(src,), frees=(src,))
        comp.append(t)
    tasks += comp
    edges = [Edge(f"ld{int(t.reads[0][1:])}", t.name) for t in comp]
    for j in range(1, n_comp):
        if draw(st.booleans()):
            edges.append(Edge(f"c{draw(st.integers(0, j - 1))}", f"c{j}"))
    if draw(st.booleans()):
        a, b = sorted(draw(st.lists(st.integers(0, n_comp - 1), min_size=2, max_size=2)))
        edges.append(Edge(f"c{b}", f"c{a}", 1))
    if draw(st.booleans()):
        tasks.append(STask("pre", "load", phase="pre", bytes=16, is_async=True, allocs=(Buffer("q", "smem", 512),)))
        edges.append(Edge("pre", comp[0].name))
    if draw(st.booleans()):
        tasks.append(STask("post", "store", phase="post", bytes=16, is_async=True, group=comp[-1].group))
        edges.append(Edge(comp[-1].name, "post"))
    row = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    # depth 2+: a ring read by a wgmma that nothing waits for is released one iteration late (protocol.releases)
    tiling = {"depth": draw(st.integers(2, 3)), "groups": groups, "ctas": draw(st.integers(1, 2))}
    return STaskGraph("rand", "custom", {}, tiling, tuple(tasks),
                      tuple(dict.fromkeys(edges)), row, draw(st.integers(1, 3)), useful_flops=1000)
