"""Exact-shape schedules behind the shape classes (ptsolve.serve.exact): the modes, the answer kept on disk and read by
a later process without solving, the background worker, and launches of a pending shape that nobody keeps."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from test_cuda import _have_nvcc

from ptsolve import serve
from ptsolve.errors import PtsolveError
from ptsolve.serve import exact, prepared

SKINNY = {"M": 16, "N": 4096, "K": 4096, "dtype": "fp16"}  # a shape the gemm class's 128x128 tile serves poorly
needs_tools = pytest.mark.skipif(not (_have_nvcc() and serve.solvers_installed()), reason="nvcc and OR-Tools needed")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty answer store and cubin cache, and a process that has seen no shape yet."""
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    for name in ("_READY", "_QUEUE", "_RUNNING", "_RACED"):
        monkeypatch.setattr(exact, name, {})
    return tmp_path


def test_the_mode_names_a_bad_value(monkeypatch):
    monkeypatch.setenv("PTSOLVE_EXACT", "sometimes")
    with pytest.raises(PtsolveError, match="PTSOLVE_EXACT='sometimes'.*background, sync, off"):
        exact.mode()
    monkeypatch.delenv("PTSOLVE_EXACT")
    assert exact.mode() == "background"


def test_off_serves_the_class_and_solves_nothing(fresh, monkeypatch):
    monkeypatch.setenv("PTSOLVE_EXACT", "off")
    monkeypatch.setattr(exact, "solve_exact", lambda *a: pytest.fail("solved with PTSOLVE_EXACT=off"))
    assert exact.exact_kernel(serve.gemm_class("fp16"), SKINNY) == (None, True)
    assert not (fresh / "exact").exists()


def test_keys_tell_shapes_and_classes_apart():
    c16, cbf = serve.gemm_class("fp16"), serve.gemm_class("bf16")
    k = exact.shape_key(c16, SKINNY)
    assert k == exact.shape_key(c16, dict(reversed(list(SKINNY.items()))))  # the order of the keys is no shape
    assert k != exact.shape_key(c16, {**SKINNY, "M": 17})
    assert k != exact.shape_key(cbf, {**SKINNY, "dtype": "bf16"})


def test_a_provisional_launch_is_kept_by_nobody():
    calls = []
    key = ("test", object())
    ln = prepared.keep(key, lambda s, o=None: calls.append((s, o)), final=False)
    assert isinstance(ln, prepared.Provisional) and key not in prepared.LAUNCHES
    ln(7, 9)
    assert calls == [(7, 9)]
    assert prepared.keep(key, ln.ln) is ln.ln and prepared.LAUNCHES.pop(key) is ln.ln


def test_a_failed_solve_leaves_the_class_final(fresh, monkeypatch):
    monkeypatch.setenv("PTSOLVE_EXACT", "sync")
    monkeypatch.setattr(exact, "solve_exact", lambda c, p: {"params": p, "error": "no tiling builds"})
    assert exact.exact_kernel(serve.gemm_class("fp16"), SKINNY) == (None, True)
    (entry,) = (fresh / "exact").glob("*.json")
    assert json.loads(entry.read_text())["error"] == "no tiling builds"


@needs_tools
def test_sync_solves_once_and_a_later_process_reads_the_answer(fresh, monkeypatch):
    monkeypatch.setenv("PTSOLVE_EXACT", "sync")
    c = serve.gemm_class("fp16")
    ck, final = exact.exact_kernel(c, SKINNY)
    assert final and ck is not None
    assert ck.ir.tiling["BM"] < serve.kernel(c).ir.tiling["BM"]  # a 16-row product: a smaller tile than the class's
    # the exact-shape build the compiler check passed: the shape's sizes are constants of this binary
    assert not ck.ks.generic and {k: ck.ks.params[k] for k in SKINNY} == SKINNY
    # a later process: nothing in memory, the answer on disk, no solve
    monkeypatch.setattr(exact, "_READY", {})
    monkeypatch.setattr(exact, "solve_exact", lambda *a: pytest.fail("solved again"))
    again, final = exact.exact_kernel(c, SKINNY)
    assert final and again.ks.source == ck.ks.source


@needs_tools
def test_an_answer_keeps_the_models_next_distinct_schedules(fresh):
    """The entry holds the first choice and up to EXACT_CANDIDATES - 1 other schedules, all distinct and compile-clean
    (the race times them on the GPU)."""
    from codegen.plan import KernelPlan
    from codegen.runtime import compile_kernel
    from ptsolve.serve.kernels import build

    c = serve.gemm_class("fp16")
    e = exact.solve_exact(c, SKINNY, time_limit=5, k=3)
    plans = [e["plan"], *e["candidates"]]
    assert 2 <= len(plans) <= 3 and len({json.dumps(p, sort_keys=True) for p in plans}) == len(plans)
    for p in plans:
        rep = compile_kernel(build(c, KernelPlan.from_json(json.dumps(p)), generic=False).ks).report
        assert not rep["spill_stores"] and not rep["wgmma_serialized"]
    assert exact.solve_exact(c, SKINNY, time_limit=5, k=1)["candidates"] == []


@needs_tools
def test_background_serves_the_class_until_the_worker_answers(fresh, monkeypatch):
    monkeypatch.setenv("PTSOLVE_EXACT", "background")
    c = serve.gemm_class("fp16")
    assert exact.exact_kernel(c, SKINNY) == (None, False)  # pending: the class serves, the launch is not kept
    assert len(exact._RUNNING) == 1
    assert exact.exact_kernel(c, SKINNY) == (None, False)  # asked again: no second worker
    assert len(exact._RUNNING) + len(exact._QUEUE) == 1
    exact.wait(timeout=300)
    ck, final = exact.exact_kernel(c, SKINNY)
    assert final and ck is not None and Path(fresh / "exact").is_dir()


def test_an_exact_kernel_launches_on_its_own_grid_with_its_scratch(monkeypatch):
    """A split-K exact-shape kernel: the launcher's tile count is the class kernel's business; this one runs the grid it
    was built for (its reduce CTAs included) and gets its workspace and counters."""
    import ptsolve
    from codegen.plan import plan_from_program
    from ptsolve.serve.kernels import build

    c = serve.gemm_class("fp16")
    r = ptsolve.optimize(ptsolve.ops.gemm(16, 4096, 4096), hw=serve.HW, compile_check=False, cache=False,
                         fix={"splits": 4}, time_limit=5)
    ck = build(c, plan_from_program(r.program), generic=False)
    got = {}
    fake = type("M", (), {"prepare": lambda self, v, m, n, out: got.update(v=v, n=n, out=out)})()
    monkeypatch.setattr(type(ck), "module", lambda self: fake)
    monkeypatch.setattr("codegen.runtime.workspace_ptrs", lambda ks: {"ws": 1, "cnt": 2})
    ck.prepare({"a": 5}, (), 999, out="c")
    assert got["n"] == ck.ks.grid[0] > 16 * 4096 // (ck.ir.tiling["BM"] * ck.ir.tiling["BN"])  # tiles x splits + reduce
    assert got["v"] == {"a": 5, "ws": 1, "cnt": 2} and got["out"] == "c"
    generic = serve.kernel(c)
    monkeypatch.setattr(type(generic), "module", lambda self: fake)
    generic.prepare({"a": 5}, (), 999, out="c")
    assert got["n"] == 999 and got["v"] == {"a": 5}


class _T:
    """A contiguous tensor as a launcher sees one: shape, strides, an address."""

    def __init__(self, *shape: int):
        self.shape = shape
        self._st = tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))

    def stride(self, i: int | None = None):
        return self._st if i is None else self._st[i]

    def data_ptr(self) -> int:
        return 1 << 20


@pytest.mark.parametrize("case", ["gemm16", "gemm1000", "gemm_splitk", "attn", "attn_short"])
def test_the_launcher_gives_an_exact_kernel_its_own_tensor_maps(case, monkeypatch):
    """An exact-shape kernel's loads expect its own boxes (a 16-row GEMM loads 16 rows of A, not the tile's 64): the
    serving launcher's maps for contiguous inputs are the kernel's, or the copy engine's byte count never meets the
    barrier's and the kernel hangs."""
    import ptsolve
    from codegen.plan import plan_from_program
    from ptsolve.serve import attention as sa
    from ptsolve.serve import gemm as sg
    from ptsolve.serve.kernels import build

    g = {"gemm16": (16, 4096, 4096, None), "gemm1000": (1000, 1024, 512, None), "gemm_splitk": (1, 4096, 4096, 4)}
    if case in g:
        M, N, K, splits = g[case]
        c = serve.gemm_class("fp16")
        op, launch = ptsolve.ops.gemm(M, N, K), lambda ck: sg._gemm_launch(_T(M, K), _T(N, K), c, ck)
    else:
        B, H, Hk, S, D = (2, 8, 2, 1000, 128) if case == "attn" else (3, 4, 4, 40, 64)
        c, splits = serve.attention_class("fp16", D, True, H, Hk), None
        op = ptsolve.ops.flash_attention(batch=B, heads=H, kv_heads=Hk, seq=S, head_dim=D, causal=True)
        launch = lambda ck: sa._attention_launch(_T(B, S, H, D), _T(B, S, Hk, D), _T(B, S, Hk, D), c, ck,  # noqa: E731
                                                 D ** -0.5, None, None, 0, 0)
    r = ptsolve.optimize(op, hw=serve.HW, compile_check=False, cache=False, time_limit=5,
                         fix={"splits": splits} if splits else None)
    ck = build(c, plan_from_program(r.program), generic=False)
    got = {}
    monkeypatch.setattr(type(ck), "prepare", lambda self, v, maps, n, out: got.update(maps=maps))
    launch(ck)
    assert {m.tensor: m for m in got["maps"]} == {m.tensor: m for m in ck.ks.tensor_maps}


def _torch(monkeypatch, gpu: str = "GPU-A", capturing: bool = False):
    """The bits of torch ``race`` asks (the CPU machines that run CI have no torch): the GPU's name, whether a graph
    is being captured."""
    import types

    cuda = types.SimpleNamespace(get_device_name=lambda d=None: gpu, is_current_stream_capturing=lambda: capturing)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))


class _Out:
    """A scratch output as ``race`` sees one."""

    device = type("D", (), {"index": 0})()

    def data_ptr(self) -> int:
        return 1 << 21


@pytest.mark.parametrize("times,wins", [({"exact": 10.0, "class": 20.0}, "exact"),
                                        ({"exact": 30.0, "class": 20.0}, "class")])
def test_the_faster_of_the_exact_and_the_class_kernel_is_kept_per_gpu(fresh, monkeypatch, times, wins):
    from codegen.plan import default_plan
    from ptsolve.serve.kernels import ClassKernel

    monkeypatch.setenv("PTSOLVE_EXACT", "off")
    c = serve.gemm_class("fp16")
    plan = default_plan("gemm", SKINNY, {"BM": 64, "BN": 128, "BK": 64, "depth": 6, "groups": 1, "splits": 4})
    key = exact.shape_key(c, SKINNY)
    exact.write_entry(exact.store() / f"{key}.json", {"params": SKINNY, "plan": json.loads(plan.to_json())})
    ck, final = exact.exact_kernel(c, SKINNY)
    assert final and isinstance(ck, ClassKernel)
    _torch(monkeypatch)
    monkeypatch.setattr("ptsolve.serve.prepared.current_stream", lambda dev: 7)
    calls, names = [], {}
    monkeypatch.setattr(exact, "_us", lambda ln, out, stream: calls.append(ln) or times[names[id(ln)]])

    def launch(k):
        ln = lambda s, o: None  # noqa: E731
        names[id(ln)] = "exact" if k is ck else "class"
        calls.append(ln)
        return ln
    got, final = exact.race(c, SKINNY, ck, launch, _Out)
    assert final and (got is ck if wins == "exact" else got is None)
    measured = json.loads((exact.store() / f"{key}.json").read_text())["measured"]
    assert measured == {"GPU-A": {"exact_us": times["exact"], "class_us": times["class"]}}
    # a later process reads the verdict: nothing is timed again; another GPU model times its own
    monkeypatch.setattr(exact, "_RACED", {})
    n = len(calls)
    assert exact.race(c, SKINNY, ck, launch, _Out)[0] is got and len(calls) == n
    monkeypatch.setattr(exact, "_RACED", {})
    _torch(monkeypatch, "GPU-B")
    exact.race(c, SKINNY, ck, launch, _Out)
    assert len(calls) > n and set(json.loads((exact.store() / f"{key}.json").read_text())["measured"]) == {
        "GPU-A", "GPU-B"}


@pytest.mark.parametrize("times,wins", [({"exact": 30.0, "exact1": 12.0, "exact2": 11.0, "class": 20.0}, "exact2"),
                                        ({"exact": 30.0, "exact1": 12.0, "exact2": 12.0, "class": 20.0}, "exact1"),
                                        ({"exact": 30.0, "exact1": 25.0, "exact2": 21.0, "class": 20.0}, "class")])
def test_the_fastest_of_the_kept_candidates_serves(fresh, monkeypatch, times, wins):
    """An entry keeps the model's other candidates: the race times every one and the class's kernel, and the fastest
    serves (a tie goes to the model's order)."""
    from codegen.plan import default_plan

    monkeypatch.setenv("PTSOLVE_EXACT", "off")
    c = serve.gemm_class("fp16")
    plans = [default_plan("gemm", SKINNY, {"BM": 64, "BN": bn, "BK": 64, "depth": 4, "groups": 1, "splits": sp})
             for bn, sp in ((128, 4), (128, 2), (256, 2))]
    key = exact.shape_key(c, SKINNY)
    exact.write_entry(exact.store() / f"{key}.json", {"params": SKINNY, "plan": json.loads(plans[0].to_json()),
                                                      "candidates": [json.loads(p.to_json()) for p in plans[1:]]})
    ck, _ = exact.exact_kernel(c, SKINNY)
    kernels = {"exact": ck, **{f"exact{i}": x for i, x in enumerate(exact._ALTS[key], 1)}}
    assert [x.ir.tiling["BN"] for x in kernels.values()] == [128, 128, 256]
    _torch(monkeypatch)
    monkeypatch.setattr("ptsolve.serve.prepared.current_stream", lambda dev: 7)
    names = {}
    monkeypatch.setattr(exact, "_us", lambda ln, out, stream: times[names[id(ln)]])

    def launch(k):
        ln = lambda s, o: None  # noqa: E731
        names[id(ln)] = next((n for n, x in kernels.items() if x is k), "class")
        return ln
    got, final = exact.race(c, SKINNY, ck, launch, _Out)
    assert final and got is kernels.get(wins)
    measured = json.loads((exact.store() / f"{key}.json").read_text())["measured"]["GPU-A"]
    assert measured == {f"{n}_us": t for n, t in times.items()}


def test_nothing_is_timed_while_a_graph_is_captured(fresh, monkeypatch):
    from ptsolve.serve.kernels import ClassKernel

    _torch(monkeypatch, capturing=True)
    monkeypatch.setattr(exact, "_us", lambda *a: pytest.fail("timed during a capture"))
    ck = ClassKernel(serve.gemm_class("fp16"), None, None, None)
    assert exact.race(serve.gemm_class("fp16"), SKINNY, ck, lambda k: None, _Out) == (None, False)


def test_candidates_are_other_structures_before_ring_depth_twins():
    """The race's slots go to other tilings before the same tiling at another ring depth; the model's order is kept
    and twins fill what structures leave."""
    import types

    def prog(**t):
        return types.SimpleNamespace(graph=types.SimpleNamespace(tiling=t))
    a2, a3 = prog(BM=128, BN=128, depth=2), prog(BM=128, BN=128, depth=3)
    b2, c2 = prog(BM=128, BN=64, depth=2), prog(BM=192, BN=128, depth=2)
    assert exact.diverse([a2, a3, b2, c2], 3) == [a2, b2, c2]
    assert exact.diverse([a2, a3, b2], 3) == [a2, a3, b2]
    assert exact.diverse([a2, a3], 1) == [a2]
