"""Mamba2 SSD state passing (ptsolve.ops.state_passing, codegen.cuda.state_passing) on the CPU: the operator validates
and refuses bad shapes naming the value, its tilings and graph are what the kernel builds, the cost model prices the
bytes it moves, greedy and CP-SAT schedule it and ``simulate`` replays the claim, the command knows its alias, hand
plans and the solvers' schedules compile for sm_90a with no spill (exact-shape and shape-generic builds), and the
launch arguments are the serving layer's. The kernel against ``ptsolve.ssd.state_passing`` on an H100/H200 is
tests/gpu/test_state_passing_gpu.py."""
from __future__ import annotations

import os
import shutil

import pytest
from test_logsumexp import assert_clean

import ptsolve
from codegen.cuda import emit
from codegen.plan import default_plan
from ptsolve.errors import CodegenError, ShapeError
from ptsolve.opspec import aliases, make

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc not installed")

OP = "mamba2_state_passing"
P = {"batch": 2, "chunks": 64, "heads": 48, "head_dim": 64, "d_state": 128, "chunk": 256, "dtype": "bf16"}
TILINGS = [  # one and two warpgroups, 512 to 4096 elements each (1 to 8 vectors a thread), shallow and deep rings
    {"BE": 512, "depth": 2, "groups": 1},
    {"BE": 1024, "depth": 8, "groups": 2},
    {"BE": 2048, "depth": 4, "groups": 1, "ctas": 2},
    {"BE": 4096, "depth": 3, "groups": 1},
    {"BE": 8192, "depth": 2, "groups": 2, "ctas": 2},
]


def _key(t: dict[str, int]) -> str:
    return "_".join(f"{k}{v}" for k, v in sorted(t.items()))


def test_the_operator_validates_and_builds() -> None:
    assert aliases()["state_passing"] == OP
    op = make(OP, **{k: v for k, v in P.items() if k != "chunk"})
    assert op == ptsolve.ops.state_passing.mamba2_state_passing(2, 64, 48, 64, 128, dtype="bf16")
    assert op.params == P
    ts = op.tilings()
    assert {t["BE"] // t["groups"] for t in ts} == {512, 1024, 2048, 4096}
    assert all(8192 % t["BE"] == 0 and t["ctas"] * t["depth"] * (t["BE"] * 4 + 32) <= 192 * 1024 for t in ts)
    g = op.graph({"BE": 2048, "depth": 4, "groups": 2})
    assert {t.name for t in g.tasks} == {"load_s", "load_dec", "init@0", "init@1", "put@0", "put@1", "step@0",
                                         "step@1", "store@0", "store@1"}
    assert g.row == (64,) * 4 and g.rows == 2 * 48 and not any(t.kind == "mma" for t in g.tasks)
    t = g.task
    # bytes moved per chunk: the float32 states in, the entering states out in the dtype, the decay's two vectors
    assert t["load_s"].bytes == 2048 * 4 and t["put@0"].bytes == t["put@1"].bytes == 1024 * 2
    assert t["load_dec"].bytes == 32 and t["store@0"].bytes == 1024 * 4
    assert {(e.src, e.dst, e.dist) for e in g.edges} >= {("put@0", "step@0", 0), ("step@0", "put@0", 1),
                                                        ("load_s", "step@1", 0), ("load_dec", "step@1", 0)}
    assert op.propagate((1024,), depth=2, groups=1)["step@0"] == (1024,)


@pytest.mark.parametrize("bad,why", [
    ({"d_state": 6}, r"head_dim·d_state = 64·6 = 384 must be a multiple of 512"),
    ({"chunk": 30}, "chunk=30 must be a multiple of 4"),
    ({"heads": 0}, "heads must be a positive integer"),
    ({"dtype": "fp32"}, "not supported"),
    ({"batch": 1 << 16, "chunks": 1 << 10, "heads": 64}, "below 2\\^31"),
    ({"seq": 8}, "unknown seq"),
])
def test_bad_shapes_name_the_value(bad: dict, why: str) -> None:
    with pytest.raises(ShapeError, match=why):
        make(OP, **(P | bad))


def test_a_tiling_the_kernel_cannot_build_is_refused() -> None:
    op = make(OP, **P)
    with pytest.raises(ShapeError, match="BE=3072"):
        op.graph({"BE": 3072, "depth": 2, "groups": 1})
    with pytest.raises(CodegenError, match="BE=8192 over 1 warpgroups"):
        emit(default_plan(OP, P | {"head_dim": 64, "d_state": 64}, {"BE": 8192, "depth": 2, "groups": 1}))
    # the task bodies check what they build on: a lowered schedule changed behind the builder's back is refused
    import dataclasses

    from codegen.cuda.skeleton import emit_ir
    from codegen.lower import lower
    ir = lower(default_plan(OP, P, {"BE": 2048, "depth": 2, "groups": 1}), "h200")
    with pytest.raises(CodegenError, match="chunk=30 must be a multiple of 4"):
        emit_ir(dataclasses.replace(ir, params=ir.params | {"chunk": 30}))
    with pytest.raises(CodegenError, match="512 to 4096 elements"):
        emit_ir(dataclasses.replace(ir, tiling=ir.tiling | {"BE": 16384}))


def test_the_cost_model_prices_the_bytes() -> None:
    """Memory-bound: the predicted time follows the bytes (twice the chunks, about twice the time) and is no faster
    than the HBM moving them."""
    from ptsolve.hw import load
    hw = load("h200")
    t = {"BE": 2048, "depth": 4, "groups": 1, "ctas": 2}
    us = {}
    for nc in (32, 64):
        r = ptsolve.optimize(make(OP, **(P | {"chunks": nc})), solver="greedy", hw="h200", fix=t,
                             executor="serial", cache=False)
        us[nc] = r.predicted_us
        moved = P["batch"] * nc * P["heads"] * 64 * 128 * (4 + 2)  # float32 in, bf16 out
        assert r.predicted_us * 1e-6 >= moved / hw.hbm_bytes_per_s
    assert 1.8 <= us[64] / us[32] <= 2.1, us


@pytest.mark.parametrize("solver", ["greedy", "cpsat"])
def test_the_solvers_schedule_it(solver: str) -> None:
    r = ptsolve.optimize(make(OP, **P), solver=solver, hw="h200", time_limit=20, executor="serial", cache=False)
    assert r.status in ("OPTIMAL", "FEASIBLE") and r.program is not None and r.objective >= r.bound > 0
    tl = ptsolve.simulate(r.program)
    assert tl.kernel_cycles == r.objective and tl.late == 0  # the replay reproduces the claim
    assert emit(r.program, "h200").name.startswith("pts_mamba2_state_passing_bf16_")


def test_the_command_knows_it(tmp_path, capsys) -> None:
    from ptsolve.cli import main
    assert main(["optimize", "state_passing", "batch=1", "chunks=8", "heads=8", "head_dim=64", "d_state=64",
                 "--solver", "greedy", "--out", str(tmp_path)]) == 0
    assert "step@0" in capsys.readouterr().out
    assert main(["ops", "state_passing"]) == 0
    assert capsys.readouterr().out.startswith(f"{OP} (also: state_passing): batch chunks heads head_dim d_state")


def test_the_kernel_source_reads_and_writes_what_the_layouts_say() -> None:
    """The loop's copies follow the layouts (a chunk's states contiguous, the 16 bytes ending at dA_cumsum's last
    element, keep's 16-byte vector only where given, and the fill's bytes with it), the running state is float32 and
    the entering state is written before the chunk is folded in."""
    ks = emit(default_plan(OP, P, {"BE": 2048, "depth": 4, "groups": 1}), "h200")
    src = ks.source
    assert ks.args == ("ptr:states", "ptr:da", "ptr:keep", "ptr:init", "ptr:out", "ptr:fin")
    assert ks.grid == (2 * 48 * 4, 1, 1) and ks.tensor_maps == ()
    assert "bulk_load(s_cur, states + ((size_t)(bz * NC + it_) * H + hd) * PN + e0, BE * 4, fbar_);" in src
    assert "da + ((size_t)(bz * H + hd) * NC + it_) * Q + Q - 4, 16, fbar_" in src
    assert "if (keep != nullptr) bulk_load(dec_cur + 16" in src and "(keep != nullptr ? 32 : 16)" in src
    assert "float st[4 * NV];" in src and "pack_bf162" in src
    assert src.index("// put@0") < src.index("// step@0")
    gen = emit(default_plan(OP, P, {"BE": 2048, "depth": 4, "groups": 1}), "h200", generic=True)
    assert gen.args[-5:] == ("i32:B_", "i32:NC", "i32:H", "i32:Q", "i32:NTILES") and gen.generic
    other = emit(default_plan(OP, P | {"batch": 5, "chunks": 3, "heads": 7, "chunk": 64},
                              {"BE": 2048, "depth": 4, "groups": 1}), "h200", generic=True)
    assert other.source == gen.source  # the sizes are launch arguments: one binary per class


def test_sizes_are_the_grid() -> None:
    from codegen.cuda.state_passing import sizes
    assert sizes(P, {"BE": 2048}) == {"B_": 2, "NC": 64, "H": 48, "Q": 256, "NTILES": 2 * 48 * 4}
    assert sizes(P | {"d_state": 64, "batch": 1}, {"BE": 512})["NTILES"] == 48 * 8


@needs_nvcc
@pytest.mark.parametrize("tiling", TILINGS, ids=_key)
@pytest.mark.parametrize("generic", [False, True])
def test_compiles_without_spills(tiling: dict[str, int], generic: bool, tmp_path, monkeypatch) -> None:
    from codegen.runtime import compile_kernel
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    c = compile_kernel(emit(default_plan(OP, P, tiling), "h200", generic=generic))
    assert_clean(c)


@needs_nvcc
def test_the_compiler_in_the_loop_accepts_the_solvers_schedules() -> None:
    for solver in ("greedy", "cpsat"):
        r = ptsolve.optimize(make(OP, **(P | {"dtype": "fp16", "d_state": 64})), solver=solver, hw="h200",
                             time_limit=20, executor="serial", cache=False, compile_check=True)
        assert r.kernel_check["status"] == "ok" and not r.kernel_check["serialized"], r.kernel_check
        assert r.kernel_check["spill_bytes"] == 0


@needs_nvcc
def test_the_serving_classes_compile(tmp_path, monkeypatch) -> None:
    """Every state-passing class of the shipped table: its schedule, its generic kernel, no spill."""
    from ptsolve import serve
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    cs = [c for c in serve.classes() if c.op == OP]
    assert len(cs) == 4
    for c in cs:
        rep = serve.compile_class(c)
        assert rep["spill_stores"] == rep["spill_loads"] == 0 and rep["registers"] > 0, (c.key, rep)


def test_the_harness_reference_is_ssd_state_passing() -> None:
    """The GPU tests' float64 recurrence (codegen.harness.state_passing.reference) and ``ptsolve.ssd.state_passing``
    (float32, in place, bool keep flags) agree, keep's padding past the last chunk unread."""
    import torch

    from codegen.harness.state_passing import reference
    from ptsolve import ssd
    g = torch.Generator().manual_seed(3)
    b, nc, h, Q = 2, 5, 3, 64
    states = torch.randn(b, nc, h, 64, 64, generator=g)
    da = torch.cumsum(-torch.rand(b, h, nc, Q, generator=g) / 32, dim=-1)
    keep = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 1], [1, 1, 0, 1, 1, 0, 0, 0]], dtype=torch.float32)
    init = torch.randn(b, h, 64, 64, generator=g)
    for k, i in ((keep, init), (None, None), (keep, None)):
        ent, fin = reference(states, da, k, i)
        e32, f32 = ssd.state_passing(states.clone(), da, i, None if k is None else k[:, :nc] > 0, torch.float32)
        assert (ent - e32.double()).abs().max() < 1e-5 and (fin - f32.double()).abs().max() < 1e-5
    assert torch.equal(reference(states, da, keep, init)[0][:, 0], init.double())  # s_{-1}: the initial state
    assert torch.equal(reference(states, da, keep, init)[0][0, 1], states[0, 0].double())  # keep 0 drops init


@needs_nvcc
def test_the_gpu_tests_kernels_compile(tmp_path, monkeypatch) -> None:
    """Every exact-shape plan tests/gpu/test_state_passing_gpu.py launches (``plans()``) compiles with no spill: the
    list the lead's precompile command compiles."""
    import test_state_passing_gpu as gpu

    from codegen.runtime import compile_kernel
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    for plan in gpu.plans():
        rep = compile_kernel(emit(plan)).report
        assert rep["spill_stores"] == rep["spill_loads"] == rep["stack_bytes"] == 0, (plan.tiling, rep)
