from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from strategies import examples, graphs, tiny_hw

import ptsolve
from ptsolve.errors import GraphError, SchemaError
from ptsolve.ir import Edge, STask, STaskGraph
from ptsolve.policies import greedy, model
from ptsolve.program import SProgram
from ptsolve.result import Result


@settings(max_examples=examples(60), deadline=None, derandomize=True)
@given(graphs())
def test_graph_json_round_trip(g: STaskGraph) -> None:
    assert STaskGraph.from_json(g.to_json()) == g


@settings(max_examples=examples(30), deadline=None, derandomize=True)
@given(graphs())
def test_program_json_round_trip(g: STaskGraph) -> None:
    p, _ = greedy.solve(model.build(g, tiny_hw()))
    assert SProgram.from_json(p.to_json()) == p


def test_operator_and_result_round_trip() -> None:
    op = ptsolve.ops.flash_attention(batch=1, heads=8, kv_heads=2, seq=300, head_dim=64, causal=True)
    assert ptsolve.ops.Operator.from_json(op.to_json()) == op
    r = ptsolve.optimize(op.graph(op.tilings()[0]), hw="h100", solver="greedy", cache=False)
    r2 = Result.from_json(r.to_json())
    assert r2 == r and r2.program == r.program


def test_bad_json() -> None:
    g = ptsolve.ops.gemm(256, 256, 256).graph({"BM": 128, "BN": 128, "BK": 64, "depth": 2, "groups": 1})
    with pytest.raises(SchemaError, match="not valid JSON"):
        STaskGraph.from_json("{")
    d = json.loads(g.to_json())
    d["schema"] = 99
    with pytest.raises(SchemaError, match="schema version 99"):
        STaskGraph.from_json(json.dumps(d))
    d["schema"] = 1
    del d["tasks"][0]["kind"]
    with pytest.raises((SchemaError, TypeError)):
        STaskGraph.from_json(json.dumps(d))
    with pytest.raises(SchemaError, match="expected a JSON object"):
        SProgram.from_json("[1, 2]")


def test_graph_errors() -> None:
    a, b = STask("a", "vector", flops=1), STask("b", "vector", flops=1)
    with pytest.raises(GraphError, match="zero-distance cycle"):
        STaskGraph("g", "x", {}, {}, (a, b), (Edge("a", "b"), Edge("b", "a")), (1,), 1, 1)
    STaskGraph("g", "x", {}, {}, (a, b), (Edge("a", "b"), Edge("b", "a", 1)), (1,), 1, 1)  # a recurrence is fine
    with pytest.raises(GraphError, match="duplicate task names"):
        STaskGraph("g", "x", {}, {}, (a, a), (), (1,), 1, 1)
    with pytest.raises(GraphError, match="unknown task"):
        STaskGraph("g", "x", {}, {}, (a,), (Edge("a", "zz"),), (1,), 1, 1)
    with pytest.raises(GraphError, match="kind"):
        STaskGraph("g", "x", {}, {}, (STask("a", "teleport"),), (), (1,), 1, 1)
    with pytest.raises(GraphError, match="at least one CTA"):
        STaskGraph("g", "x", {}, {}, (a,), (), (0,), 1, 1)
    with pytest.raises(GraphError, match="no task allocates"):
        STaskGraph("g", "x", {}, {}, (STask("a", "vector", reads=("ghost",)),), (), (1,), 1, 1)
