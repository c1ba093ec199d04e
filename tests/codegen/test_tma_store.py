"""GEMM's TMA-store epilogue (tiling key ``tma_store``): the graph and its shared memory, the opt-in search, the
emitted chunk protocol (every accumulator pair lands where C's swizzled tensor map reads it, no staging slot rewritten
before the copy engine read it) and its compile, on the CPU. The kernels' results on the GPU:
tests/gpu/test_kernels_gpu.py (``test_gemm_tma_store``); measured against the register store: bench study tma_store"""
from __future__ import annotations

import re

import pytest
from test_cuda import _have_nvcc

import ptsolve
from codegen.cuda import emit
from codegen.kernel_ir import KernelIR
from codegen.lower import lower
from codegen.plan import default_plan
from ptsolve.errors import CodegenError, ShapeError
from ptsolve.hw import load
from ptsolve.ops.gemm import STAGE_COLS, stage_bytes
from ptsolve.protocol import ring_depths, smem_layout
from ptsolve.search import _fixed

P = {"M": 1000, "N": 1000, "K": 1000, "dtype": "fp16"}
COOP = {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}
PING = {"BM": 128, "BN": 192, "BK": 64, "depth": 4, "groups": 1, "pingpong": 1}
H200 = load("h200")


def test_graph_stages_in_a_buffer_of_the_whole_cta():
    op = ptsolve.ops.gemm(**P)
    g = op.graph(COOP | {"tma_store": 1}, H200)
    assert g.tiling["tma_store"] == 1 and "tma_store" not in op.graph(COOP, H200).tiling
    for w in (0, 1):
        assert {b.name: b.bytes for b in g.task[f"zero@{w}"].allocs if b.space == "smem"} == \
            {f"cs@{w}": 2 * 64 * STAGE_COLS * 2}
        assert g.task[f"store_tma@{w}"].reads == (f"acc@{w}", f"cs@{w}") and f"store@{w}" not in g.task
    gp = op.graph(PING | {"tma_store": 1}, H200)  # one warpgroup in the graph stands for the kernel's two
    assert next(b.bytes for b in gp.task["zero@0"].allocs if b.name == "cs@0") == 2 * stage_bytes(128, 192, "fp16")
    assert stage_bytes(64, 64, "bf16") == 64 * 64 * 2  # one chunk: one slot


def test_staging_never_overlays_the_ring():
    """A persistent CTA's copy engine still reads the staging while the next tile's loads fill the ring."""
    g = ptsolve.ops.gemm(**P).graph(COOP | {"tma_store": 1, "persistent": 1}, H200)
    lay = smem_layout(g, ring_depths(g), {}, H200)
    d = ring_depths(g)["a"]
    ring = (min(lay.offsets["a"], lay.offsets["b"]), max(lay.offsets["a"], lay.offsets["b"]) + lay.strides["a"] * d)
    assert lay.strides["a"] == lay.strides["b"] >= 128 * 64 * 2 + 64 * 256 * 2  # one slot holds both tiles
    cs = sorted((lay.offsets[n], lay.offsets[n] + g.buffers()[n].bytes) for n in ("cs@0", "cs@1"))
    assert cs[0][1] <= cs[1][0]
    for lo, hi in cs:
        assert hi <= ring[0] or ring[1] <= lo, (lo, hi, ring)
    assert lay.total <= H200.smem_per_block


def test_refusals():
    op = ptsolve.ops.gemm(**P)
    with pytest.raises(ShapeError, match="splits=1"):
        op.graph(COOP | {"tma_store": 1, "splits": 2}, H200)
    with pytest.raises(ShapeError, match="multiple of 8"):
        ptsolve.ops.gemm(M=64, N=1001, K=64).graph(COOP | {"tma_store": 1}, H200)
    with pytest.raises(ShapeError, match="tma_store=2"):
        op.graph(COOP | {"tma_store": 2}, H200)
    assert not any(t.get("tma_store") for t in ptsolve.ops.gemm(M=64, N=1001, K=64).tilings())
    a100 = load("a100")
    assert "copy engine" in (ptsolve.policies.model.fits(op.graph(COOP | {"tma_store": 1}, a100), a100) or "")
    gen = emit(default_plan("gemm", P, COOP | {"tma_store": 1}), "h200", generic=True)  # C's map comes per launch
    assert "tmap:c" in gen.args and "ptr:c" not in gen.args and "i32:N" in gen.args
    from codegen.hip import emit as hip_emit
    with pytest.raises(CodegenError, match="HIP"):
        hip_emit(default_plan("gemm", P, {"BM": 64, "BN": 64, "BK": 64, "depth": 2, "groups": 1, "tma_store": 1}),
                 "mi300x")


def test_searched_and_priced_by_the_store_rates():
    """Offered by default; the model prices each store by its table rate (the register store's tile leaves the SM at
    reg_store_bytes_per_clk, the staged one at staged_store_bytes_per_clk), and with the measured rates a cooperative
    tiling's TMA-store twin is predicted faster; on a model tie the TMA store wins (tie_key)."""
    import dataclasses

    from ptsolve.cost import timings
    from ptsolve.policies.model import tie_key
    op = ptsolve.ops.gemm(**P)
    assert any(t.get("tma_store") == 1 for t in _fixed(op, None))
    hw = dataclasses.replace(H200, op_constants={}, reg_store_bytes_per_clk=8.0, staged_store_bytes_per_clk=32.0)
    reg, tma = op.graph(COOP, hw), op.graph(COOP | {"tma_store": 1}, hw)
    assert tma.task["store_tma@0"].staged and not reg.task["store@0"].staged
    tr, tt = timings(reg, hw)["store@0"], timings(tma, hw)["store_tma@0"]
    bare = dataclasses.replace(hw, reg_store_bytes_per_clk=0.0, staged_store_bytes_per_clk=0.0)
    br, bt = timings(reg, bare)["store@0"], timings(tma, bare)["store_tma@0"]
    nbytes = 64 * 256 * 2
    assert br.busy("wg0") == bt.busy("wg0") < 300 and br.latency == bt.latency  # no rate: the issue only, as before
    assert tr.busy("wg0") - br.busy("wg0") == nbytes // 8 and tt.busy("wg0") - bt.busy("wg0") == nbytes // 32
    assert tr.busy("tma") == nbytes // 8 > br.busy("tma")  # the copy path busy as long as the tile leaves
    assert abs(tr.latency - (nbytes // 8 + br.latency - br.busy("tma"))) <= 16  # then the memory latency (grains)
    fast = ptsolve.optimize(op, hw=hw, solver="greedy", cache=False, compile_check=False, fix=COOP | {"tma_store": 1})
    slow = ptsolve.optimize(op, hw=hw, solver="greedy", cache=False, compile_check=False, fix=COOP | {"tma_store": 0})
    assert fast.predicted_us < slow.predicted_us
    assert tie_key(PING | {"tma_store": 1}, False) < tie_key(PING, False)
    assert tie_key({"BN": 64, "depth": 2}, False) == (("BN", 64), ("depth", 2))  # other operators: unchanged
    r = ptsolve.optimize(op, hw="h200", solver="greedy", cache=False, compile_check=False, fix={"tma_store": 1})
    assert r.tiling["tma_store"] == 1 and r.program.graph.task.get("store_tma@0") is not None


def test_store_rates_fit_from_profiles():
    """ptsolve.calibrate.store_rates: bytes the tile's warpgroups store together over the slowest warpgroup's median
    store body, per kind, median over kernels; a ping-pong kernel's second warpgroup counts under its own name."""
    from ptsolve.calibrate import store_rates
    from ptsolve.errors import PtsolveError
    from ptsolve.program import SProgram

    def prog(t: dict) -> SProgram:
        r = ptsolve.optimize(ptsolve.ops.gemm(**P), hw="h200", solver="greedy", cache=False, compile_check=False,
                             fix=t | {"BK": 64, "splits": 1, "cluster": 1, "pingpong": t.get("pingpong", 0),
                                      "tma_store": t.get("tma_store", 0)})
        return r.program

    def ev(role: str, task: str, body: int) -> dict:
        return {"role": role, "task": task, "phase": "post", "t0": 0, "t1": 10, "t2": 10 + body, "iteration": 0}
    coop = {"op": "gemm", "kernel": "k1", "events": [ev("wg0", "store@0", 4000), ev("wg0", "store@0", 4200),
                                                   ev("wg1", "store@1", 8000), ev("wg0", "epilogue@0", 99)]}
    ping = {"op": "gemm", "kernel": "k2", "events": [ev("wg0", "store_tma@0", 1000), ev("wg1", "store_tma@1", 3000)]}
    got = store_rates([(coop, prog(COOP)), (ping, prog(PING | {"tma_store": 1}))])
    assert got["reg_store_bytes_per_clk"]["value"] == 2 * 64 * 256 * 2 / 8000  # both warpgroups, the slower one
    assert got["staged_store_bytes_per_clk"]["value"] == 128 * 192 * 2 / 3000  # the slower warpgroup of the two
    with pytest.raises(PtsolveError, match="pair each profile"):
        store_rates([({"op": "flash_attention", "events": []}, prog(COOP))])


@pytest.mark.parametrize("tiling", [COOP, PING, {"BM": 128, "BN": 64, "BK": 64, "depth": 4, "groups": 2}])
def test_chunks_land_where_the_tensor_map_reads_them(tiling):
    """Replays the emitted stmatrix addresses for every thread: each packed accumulator pair (thread t, register
    cpk[m][2jj + h]: row m·64 + w·16 + t/4 + 8h, columns 8jj + 2(t%4), +1 of the warpgroup's tile) must land, after
    the 128-byte swizzle the TMA store undoes (16-byte unit u of smem row r holds the tile's unit u ^ (r % 8)), at
    the row and column the chunk's store puts it; every element of the tile exactly once."""
    t = tiling | {"tma_store": 1}
    ks = emit(default_plan("gemm", P, t), "h200")
    ir = lower(default_plan("gemm", P, t), "h200")
    assert KernelIR.from_json(ir.to_json()) == ir
    rows, bn = t["BM"] // t["groups"], t["BN"]
    mt = rows // 64
    assert ks.tensor_maps[-1].tensor == "c" and ks.tensor_maps[-1].box == (STAGE_COLS, rows)
    assert "tmap:c" in ks.args and "ptr:c" not in ks.args
    for g in range(2 if t.get("pingpong") else t["groups"]):
        body = ks.source.split(f"// post: store_tma@{g}")[1].split("// ----")[0]
        base = int(re.search(r"uint8_t\* const st_ = smem \+ (\d+);", body).group(1))
        cs = ir.buffer(f"cs@{0 if t.get('pingpong') else g}")
        per = stage_bytes(rows, bn, "fp16")
        assert base == cs.offset + (g * per if t.get("pingpong") else 0) and base % 1024 == 0
        stores = [(int(s), int(c)) for s, c in
                  re.findall(r"tma_store_2d\(&tm_c, st_ \+ (\d+), n0 \+ (\d+), m0 \+ ROW0\)", body)]
        assert [c for _, c in stores] == list(range(0, bn, STAGE_COLS))
        seen: dict[tuple[int, int], tuple[int, int, int]] = {}
        segments = re.split(r"tma_store_2d\(&tm_c[^;]*;", body)[:len(stores)]  # chunk c's staging precedes its store
        lines = [(c, *x) for c, seg in enumerate(segments) for x in re.findall(
            r"const int r_ = (.+?), u_ = (.+?);\s*stmatrix_x4\(st_ \+ (\d+) \+ (.+?), (cpk.+?)\); \}", seg)]
        assert len(lines) == bn // 16
        for m in range(mt):
            for c, rx, ux, slot, addr, regs in lines:
                assert int(slot) == stores[c][0]
                idx = [int(x) for x in re.findall(r"cpk\[m\]\[(\d+)\]", regs)]
                for w in range(4):
                    # lane L gives the address of row L % 8 of matrix L / 8
                    lanes = {}
                    for L in range(32):
                        env = {"m": m, "w": w, "lane": L}
                        r_ = eval(rx, {}, env)  # noqa: S307 - the emitted C expression, plain integer arithmetic
                        u_ = eval(ux, {}, env)  # noqa: S307
                        lanes[L] = eval(addr, {}, env | {"r_": r_, "u_": u_})  # noqa: S307
                    for tid in range(32):
                        for k, ci in enumerate(idx):
                            off = lanes[8 * k + tid // 4] + 4 * (tid % 4)
                            srow, unit, within = off // 128, (off % 128) // 16, (off % 16) // 2
                            col = stores[c][1] + 8 * (unit ^ (srow % 8)) + within
                            jj, h = divmod(ci, 2)
                            want = (m * 64 + w * 16 + tid // 4 + 8 * h, 8 * jj + 2 * (tid % 4))
                            assert (srow, col) == want, (g, m, w, tid, k, (srow, col), want)
                            assert want not in seen
                            seen[want] = (m, w, tid)
        assert len(seen) == rows * bn // 2  # every pair of the warpgroup's tile


@pytest.mark.parametrize("tiling", [COOP, PING])
def test_no_slot_rewritten_before_it_was_read(tiling):
    """Thread 0 of the warpgroup waits (bulk wait_group.read) before a slot's next chunk: at the tile's first chunk
    for every earlier store, later for all but the previous slots - 1; and waits for all before its CTA's last tile
    ends. Dropping any of these waits (or the fence to the async proxy) is a race the GPU test may not catch."""
    t = tiling | {"tma_store": 1}
    src = emit(default_plan("gemm", P, t), "h200").source
    body = src.split("// post: store_tma@0")[1].split("// ----")[0]
    chunks = t["BN"] // STAGE_COLS
    slots = min(2, chunks)
    events = re.findall(r"bulk_wait_read<(\d)>|stmatrix_x4\(st_ \+ (\d+)|(fence\.proxy\.async)|tma_store_2d\(|"
                        r"(bulk_wait<0>)", body)
    pending: list[int] = []  # slots the copy engine may still read, oldest first
    wrote: set[int] = set()
    fenced = False
    for wait_read, slot, fence, final in events:
        if wait_read:
            pending = pending[len(pending) - int(wait_read):] if int(wait_read) else []
            continue
        if slot:
            assert int(slot) not in pending, f"slot {slot} rewritten while a store still reads it"
            wrote.add(int(slot))
            fenced = False
        elif fence:
            fenced = True
        elif final:
            pending = []
        else:  # a store of the slot just written
            assert fenced, "a chunk stored before its writes were fenced to the async proxy"
            pending.append(max(wrote))
            wrote = set()
    assert body.count("bulk_wait_read<0>") == 1 and body.count(f"bulk_wait_read<{slots - 1}>") >= (chunks > slots)
    mine = 2 if t.get("pingpong") else 1  # the CTA's next tile of this warpgroup
    assert f"if (tid_ == 0 && tile + {mine} * (int)gridDim.x >= NTILES) bulk_wait<0>();" in body


@pytest.mark.slow
def test_tma_store_kernels_compile_clean():
    if not _have_nvcc():
        pytest.skip("nvcc not available")
    from codegen.runtime import compile_kernel
    for t in (COOP, PING, COOP | {"persistent": 0}):
        r = compile_kernel(emit(default_plan("gemm", P, t | {"tma_store": 1}), "h200")).report
        assert r["spill_stores"] == 0 and not r["wgmma_serialized"], r
