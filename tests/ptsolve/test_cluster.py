"""GEMM's 2-CTA clusters with B multicast (tiling key ``cluster``): the graph, the model's price, the opt-in search, the
emitted protocol and its compile, on the CPU. The kernels' results on the GPU: tests/gpu/test_kernels_gpu.py
(``test_gemm_cluster``); measured against the unclustered kernels: bench study gemm_skinny"""
from __future__ import annotations

import json

import pytest
from test_cuda import _have_nvcc

import ptsolve
from codegen.cuda import emit
from codegen.kernel_ir import KernelIR
from codegen.lower import lower
from codegen.plan import default_plan
from ptsolve.cost import timings
from ptsolve.errors import CodegenError, GraphError, ShapeError
from ptsolve.hw import load
from ptsolve.ir import STask, STaskGraph
from ptsolve.search import _fixed

P = {"M": 320, "N": 1000, "K": 1000, "dtype": "fp16"}  # 5 M tiles of 64 rows: the pairs need a sixth
T = {"BM": 64, "BN": 128, "BK": 64, "depth": 4, "groups": 1}
H200 = load("h200")


def test_graph_pairs_m_tiles_and_multicasts_b():
    op = ptsolve.ops.gemm(**P)
    g, g2 = op.graph(T, H200), op.graph(T | {"cluster": 2}, H200)
    assert (g.rows, g2.rows) == (5 * 8, 6 * 8)  # the odd M tile gets an (empty) partner
    assert g2.task["load_b"].multicast == 2 and g2.task["load_a"].multicast == 1
    assert g2.task["load_b"].bytes == g.task["load_b"].bytes  # each CTA still receives the whole tile
    assert g2.tiling["cluster"] == 2 and "cluster" not in g.tiling
    with pytest.raises(ShapeError, match="split-K"):
        op.graph(T | {"cluster": 2, "splits": 2}, H200)
    with pytest.raises(ShapeError, match="cluster=3"):
        op.graph(T | {"cluster": 3}, H200)


def test_multicast_costs_each_sm_the_whole_tile():
    """Each SM still receives the whole B tile, and its L2 -> SM share bounds the load: the model prices a multicast
    load as the unshared one (clusters measured no faster on loops the model calls L2-bound: bench study
    gemm_skinny)."""
    tb, tb2 = timings(ptsolve.ops.gemm(**P).graph(T, H200), H200), \
        timings(ptsolve.ops.gemm(**P).graph(T | {"cluster": 2}, H200), H200)
    assert tb2["load_b"] == tb["load_b"] and tb2["load_a"] == tb["load_a"]


def test_multicast_field_json_and_checks():
    op = ptsolve.ops.gemm(**P)
    g, g2 = op.graph(T, H200), op.graph(T | {"cluster": 2}, H200)
    assert "multicast" not in g.to_json()  # graphs without a cluster keep their JSON (and hashes)
    assert json.loads(g2.to_json())["tasks"][1]["multicast"] == 2
    assert STaskGraph.from_json(g2.to_json()) == g2 and STaskGraph.from_json(g.to_json()) == g
    with pytest.raises(GraphError, match="multicast"):  # only a load can be multicast
        STaskGraph(**{**g.__dict__, "tasks": tuple(STask(**{**t.__dict__, "multicast": 2}) if t.name == "mma@0"
                                                   else t for t in g.tasks)})


def test_clusters_are_opt_in():
    op = ptsolve.ops.gemm(**P)
    assert any(t.get("cluster") == 2 for t in op.tilings())
    assert not any(t.get("cluster") for t in _fixed(op, None))  # not offered unasked (measured slower)
    assert all(t.get("cluster") == 2 for t in _fixed(op, {"cluster": 2}))
    assert any(t.get("cluster") == 2 for t in _fixed(op, None, ("cluster",)))  # tune --per cluster
    r = ptsolve.optimize(op, hw="h200", solver="greedy", cache=False, compile_check=False)
    assert "cluster" not in r.tiling
    r = ptsolve.optimize(op, hw="h200", solver="greedy", cache=False, compile_check=False, fix={"cluster": 2})
    assert r.tiling["cluster"] == 2
    no_tma = ptsolve.hw.load("a100")
    assert "TMA multicast" in (ptsolve.policies.model.fits(op.graph(T | {"cluster": 2}, no_tma), no_tma) or "")


@pytest.mark.parametrize("extra", [{}, {"pingpong": 1}])
def test_emitted_protocol(extra):
    t = T | {"cluster": 2} | extra
    ir = lower(default_plan("gemm", P, t), "h200")
    assert ir.multicast == ("load_b",) and KernelIR.from_json(ir.to_json()) == ir
    assert "multicast" not in lower(default_plan("gemm", P, T), "h200").to_json()
    ks = emit(default_plan("gemm", P, t), "h200")
    src = ks.source
    assert "__cluster_dims__(2, 1, 1)" in src and src.count("cluster_sync();") == 2  # after init, before exit
    assert "tma_load_2d_mc(b_cur + cr_ * 8192" in src and "n0 + cr_ * 64" in src  # its half of 128 rows
    assert "mbar_init(&a_empty[s], 8)" in src  # four warps of each of the two CTAs free a slot
    assert "mbar_arrive(&a_empty" not in src and "mbar_arrive_cluster(&a_empty" in src
    assert "release.cluster.shared::cluster" not in src  # a cluster-wide fence per arrival ran 2-3x slower
    assert ks.cluster == 2 and ks.grid[0] % 2 == 0 and ks.tensor_maps[1].box == (64, 64)
    assert "__cluster_dims__" not in emit(default_plan("gemm", P, T), "h200").source


def test_cluster_refusals():
    from codegen.hip import emit as hip_emit
    with pytest.raises(CodegenError, match="HIP"):
        hip_emit(default_plan("gemm", P, T | {"cluster": 2, "BN": 64, "depth": 2}), "mi300x")  # fits 64 KB LDS
    with pytest.raises(CodegenError, match="exact build"):
        emit(default_plan("gemm", P, T | {"cluster": 2}), "h200", generic=True)


@pytest.mark.slow
def test_cluster_kernels_compile_clean():
    if not _have_nvcc():
        pytest.skip("nvcc not available")
    from codegen.runtime import compile_kernel
    for extra in ({}, {"pingpong": 1}, {"groups": 2, "BM": 128}):
        r = compile_kernel(emit(default_plan("gemm", P, T | {"cluster": 2} | extra), "h200")).report
        assert r["spill_stores"] == 0 and not r["wgmma_serialized"], r
