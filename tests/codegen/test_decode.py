"""Split-KV attention (ptsolve.ops.decode, codegen.cuda.decode) on the CPU: the operator, its work split, the
split + combine math against full attention, the solvers, the lowering and sm_90a compiles; 64-bit offsets in
the attention kernel."""
from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

import ptsolve
from ptsolve.errors import ShapeError
from ptsolve.hw import load
from ptsolve.ops.decode import merge_rows, merge_units, packing, pieces, query_tiles, tile_rows, trip_counts

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not __import__("os").path.exists(
    "/usr/local/cuda/bin/nvcc"), reason="nvcc not installed")

SHAPES = [  # (params, what it exercises)
    dict(batch=2, heads=32, kv_heads=8, seq_q=1, seq_kv=4097),                   # Llama decode, ragged cache
    dict(batch=1, heads=14, kv_heads=2, seq_q=4, seq_kv=1000, head_dim=64, causal=True),  # Qwen, packed 7 x 4
    dict(batch=1, heads=71, kv_heads=1, seq_q=1, seq_kv=1000, head_dim=64),      # Falcon MQA: 71 rows > 64
    dict(batch=1, heads=8, kv_heads=8, seq_q=1000, seq_kv=1000, causal=True),    # batch-1 causal prefill
]


@pytest.mark.parametrize("p", SHAPES)
def test_pieces_cover_every_key_block_once(p: dict) -> None:
    op = ptsolve.ops.flash_decode(**p)
    for t in op.tilings():
        BM, BN = t["BM"], t["BN"]
        trips = trip_counts(op.params, BM, BN)
        work = pieces(op.params, BM, BN, t["splits"])
        assert max(w[3] for w in work) == t["splits"]  # the tiling names the pieces the longest tile gets
        for q, T in enumerate(trips):
            mine = sorted((w[4], w[1], w[2], w[3]) for w in work if w[0] == q)
            assert [k for k, *_ in mine] == list(range(len(mine))) and all(n == len(mine) for *_, n in mine)
            blocks = [b for _, kb, n, _ in mine for b in range(kb, kb + n)]
            assert blocks == list(range(T)) and all(n >= 1 for _, _, n, _ in mine)
        assert [w[2] for w in work] == sorted((w[2] for w in work), reverse=True)  # longest first
        g = op.graph(t)
        assert g.row == tuple(w[2] for w in work) and g.rows == op.params["batch"] * op.params["kv_heads"]


def test_packing_fills_the_wgmma_rows() -> None:
    assert packing(ptsolve.ops.flash_decode(batch=1, heads=32, kv_heads=8, seq_q=4, seq_kv=64).params, 64) == (4, 4)
    qwen = ptsolve.ops.flash_decode(batch=1, heads=14, kv_heads=2, seq_q=16, seq_kv=64, head_dim=64).params
    assert packing(qwen, 64) == (7, 9) and query_tiles(qwen, 64) == 2
    falcon = ptsolve.ops.flash_decode(batch=1, heads=71, kv_heads=1, seq_q=1, seq_kv=64, head_dim=64).params
    assert packing(falcon, 64) == (64, 1) and query_tiles(falcon, 64) == 2 and query_tiles(falcon, 128) == 1


def test_invalid_shapes_and_tilings_name_the_fix() -> None:
    with pytest.raises(ShapeError, match="seq_q <= seq_kv"):
        ptsolve.ops.flash_decode(batch=1, heads=8, seq_q=9, seq_kv=4, causal=True)
    with pytest.raises(ShapeError, match="head_dim"):
        ptsolve.ops.flash_decode(batch=1, heads=8, seq_q=1, seq_kv=64, head_dim=96)
    op = ptsolve.ops.flash_decode(batch=1, heads=32, kv_heads=8, seq_q=1, seq_kv=4096)
    with pytest.raises(ShapeError, match="groups=1"):
        op.graph({"BM": 128, "BN": 128, "depth": 2, "groups": 2, "splits": 1})


def test_split_costs_the_combine() -> None:
    """splits > 1 adds the partial write, the read of every piece's partial and the merged store to the model."""
    op = ptsolve.ops.flash_decode(batch=1, heads=32, kv_heads=8, seq_q=1, seq_kv=4097)
    one = op.graph({"BM": 64, "BN": 128, "depth": 2, "groups": 1, "splits": 1})
    many = op.graph({"BM": 64, "BN": 128, "depth": 2, "groups": 1, "splits": 11})
    with pytest.raises(ShapeError, match="use splits=7"):
        op.graph({"BM": 64, "BN": 128, "depth": 2, "groups": 1, "splits": 8})
    assert {t.name for t in one.phase("post")} == {"normalize@0", "store@0"}
    post = {t.name: t for t in many.phase("post")}
    assert set(post) == {"normalize@0", "store@0", "combine@0", "out@0"}
    assert post["store@0"].bytes == 4 * (128 + 1) * 4 and post["combine@0"].bytes == 11 * post["store@0"].bytes
    assert many.row == (3,) * 11 and sum(one.row) == 33


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """float64 attention, q [Sq, H, D], k/v [Skv, Hkv, D], causal bottom-right aligned."""
    Sq, H, D = q.shape
    Skv, Hkv = k.shape[:2]
    out = np.empty_like(q)
    for h in range(H):
        s = q[:, h] @ k[:, h // (H // Hkv)].T / math.sqrt(D)
        if causal:
            s = np.where(np.arange(Skv)[None] > np.arange(Sq)[:, None] + Skv - Sq, -np.inf, s)
        w = np.exp(s - s.max(1, keepdims=True))
        out[:, h] = (w / w.sum(1, keepdims=True)) @ v[:, h // (H // Hkv)]
    return out


def _split_combine(p: dict, t: dict, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The kernel's arithmetic for one batch, in numpy: per work-table entry, the packed rows (head r % gbox,
    position r // gbox) over its key blocks with the kernel's mask; partial O / l and lse in the log2 domain;
    the combine's weights exp2(lse_k - max lse)."""
    H, Hkv, D, Sq, Skv = p["heads"], p["kv_heads"], p["head_dim"], p["seq_q"], p["seq_kv"]
    G, BM, BN = H // Hkv, t["BM"], t["BN"]
    gbox, sbox = packing(p, BM)
    ngt = -(-G // gbox)
    scale = math.log2(math.e) / math.sqrt(D)
    out = np.full_like(q, np.nan)
    for hkv in range(Hkv):
        parts: dict[int, list] = {}
        for qt, kb0, n, _, _ in pieces(p, BM, BN, t["splits"]):
            j0, s0 = (qt % ngt) * gbox, (qt // ngt) * sbox
            keys = np.arange(kb0 * BN, (kb0 + n) * BN)
            for r in range(gbox * sbox):
                j, s = j0 + r % gbox, s0 + r // gbox
                if j >= G or s >= Sq:
                    continue
                sc = (k[keys.clip(max=Skv - 1), hkv] @ q[s, hkv * G + j]) * scale
                sc = np.where((keys >= Skv) | (p["causal"] & (keys > s + Skv - Sq)), -np.inf, sc)
                m = sc.max()
                w = np.exp2(sc - (0 if m == -np.inf else m))
                lse = m + math.log2(w.sum()) if w.sum() > 0 else -np.inf
                o = (w @ v[keys.clip(max=Skv - 1), hkv]) / w.sum() if w.sum() > 0 else np.zeros(D)
                parts.setdefault((s, hkv * G + j), []).append((lse, o))
        for (s, h), lst in parts.items():
            mx = max(x for x, _ in lst)
            wk = [math.exp2(x - mx) for x, _ in lst]
            out[s, h] = sum(w * o for w, (_, o) in zip(wk, lst)) / sum(wk)
    return out


@pytest.mark.parametrize("p,t", [
    (dict(batch=1, heads=8, kv_heads=2, seq_q=3, seq_kv=300, head_dim=64, causal=True),
     {"BM": 64, "BN": 64, "depth": 2, "groups": 1, "splits": 5}),
    (dict(batch=1, heads=4, kv_heads=4, seq_q=130, seq_kv=200, head_dim=64, causal=True),
     {"BM": 64, "BN": 64, "depth": 2, "groups": 1, "splits": 4}),
    (dict(batch=1, heads=71, kv_heads=1, seq_q=1, seq_kv=129, head_dim=64),
     {"BM": 64, "BN": 64, "depth": 2, "groups": 1, "splits": 3}),
])
def test_split_and_combine_equal_attention(p: dict, t: dict) -> None:
    op = ptsolve.ops.flash_decode(**p)
    assert t in op.tilings()
    rng = np.random.default_rng(0)
    q = rng.standard_normal((p["seq_q"], p["heads"], p["head_dim"]))
    k = rng.standard_normal((p["seq_kv"], p["kv_heads"], p["head_dim"]))
    v = rng.standard_normal((p["seq_kv"], p["kv_heads"], p["head_dim"]))
    want = _attention(q, k, v, op.params["causal"])
    np.testing.assert_allclose(_split_combine(op.params, t, q, k, v), want, atol=1e-12)


@pytest.mark.parametrize("solver", ["greedy", "cpsat"])
def test_solvers_choose_a_split_for_a_few_head_decode(solver: str) -> None:
    """batch 1, 8 kv heads: 8 CTAs without a split; every solver splits the cache, and the replay reproduces
    the claimed latency."""
    from ptsolve.simulate import simulate
    op = ptsolve.ops.flash_decode(batch=1, heads=32, kv_heads=8, seq_q=1, seq_kv=4097)
    res = ptsolve.optimize(op, hw="h200", solver=solver, time_limit=30, cache=False, executor="serial")
    one = ptsolve.optimize(op, hw="h200", solver=solver, time_limit=30, cache=False, executor="serial",
                           fix={"splits": 1})
    assert res.tiling["splits"] > 1 and res.predicted_us < 0.7 * one.predicted_us
    assert simulate(res.program).late == 0
    assert abs(simulate(res.program).kernel_us - res.predicted_us) < 1e-6


def test_declared_orders_pin_the_warpgroup_loop() -> None:
    """cpsat-orders on a decode tiling keeps a declared order (FA2's or FA3's, up to the stage shift of a rotation)
    in warpgroup 0's loop: what the compiler in the loop falls back on when ptxas serialises the free optimum."""
    from ptsolve.ops.decode import orders
    from ptsolve.search import search
    op = ptsolve.ops.flash_decode(batch=16, heads=14, kv_heads=2, seq_q=1, seq_kv=1000, head_dim=64)
    g = op.graph({"BM": 64, "BN": 64, "depth": 2, "groups": 1, "splits": 4})
    res = search(g, "h200", solver="cpsat-orders", time_limit=20, executor="serial")
    loop = res.program.streams(load("h200"))["loop"]["wg0"]
    first = {n: st for n, st in loop}
    shifted = [(n, st - first["mma_qk@0"]) for n, st in loop]
    assert shifted in [o["wg0"] for o in orders(1).values()], loop
    assert set(orders(2)) == {"fa2", "fa3"} and [t for t, _ in orders(2)["fa2"]["tc"]] == [
        "mma_qk@0", "mma_pv@0", "mma_qk@1", "mma_pv@1"]


def test_exact_no_worse_than_greedy_on_a_small_shape() -> None:
    op = ptsolve.ops.flash_decode(batch=1, heads=8, kv_heads=2, seq_q=2, seq_kv=300, head_dim=64, causal=True)
    g = ptsolve.optimize(op, hw="h200", solver="greedy", cache=False, executor="serial")
    c = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=30, cache=False, executor="serial")
    assert c.predicted_us <= g.predicted_us + 1e-9


def _ks(p: dict, t: dict):
    from codegen.cuda import emit
    from codegen.plan import default_plan
    return emit(default_plan("flash_decode", ptsolve.ops.flash_decode(**p).params, t), "h200")


def test_lowered_kernel_source() -> None:
    """The work table is the operator's pieces, the merge table its merge units, launched after every piece; the
    merge path exists only when a tile has several pieces."""
    p = dict(batch=1, heads=32, kv_heads=8, seq_q=1, seq_kv=4097)
    ks = _ks(p, {"BM": 64, "BN": 128, "depth": 3, "groups": 1, "splits": 11})
    work = pieces(ptsolve.ops.flash_decode(**p).params, 64, 128, 11)
    merge = merge_units(ptsolve.ops.flash_decode(**p).params, 64, 128, 11, ks.block[0], 132)
    table = re.search(r"dec_work\[(\d+)\] = \{(.*)\};", ks.source)
    assert table and int(table.group(1)) == len(work) and ks.grid[0] == (len(work) + len(merge)) * 8
    assert table.group(2).startswith("{" + ", ".join(map(str, work[0][:3])))
    mt = re.search(r"dec_merge\[(\d+)\] = \{(.*)\};", ks.source)
    assert merge == [(0, 0, 4, 1)]  # one merge CTA per kv head: 4 rows, 2 groups of 32 threads share 11 pieces
    assert mt and mt.group(2) == ", ".join("{" + ", ".join(map(str, u)) + "}" for u in merge)
    assert "atomicAdd(&cnt[ctr], 1)" in ks.source and "ld_acquire(&cnt[ctr]) < ns * 1" in ks.source
    assert ks.source.index("blockIdx.x >= NTILES") < ks.source.index("mbar_init(&")  # before any barrier is set up
    assert ks.args == ("tmap:q", "tmap:k", "tmap:v", "ptr:o", "ptr:ws", "ptr:lse", "ptr:cnt")
    assert ks.info["workspace"]["lse"] == 8 * 11 * 4 * 4  # bytes: (batch, kv head) x pieces x the 4 packed rows
    assert ks.info["workspace"]["cnt"] == 2 * 8 * 4  # two int32 counters per query tile
    one = _ks(p, {"BM": 64, "BN": 128, "depth": 3, "groups": 1, "splits": 1})
    assert "atomicAdd" not in one.source and "(long long)bz * SQ + sq" in one.source
    assert "blockIdx.x >= NTILES" not in one.source and one.grid[0] == 8


@pytest.mark.parametrize("p", SHAPES)
def test_merge_units_cover_every_row_of_every_split_tile(p: dict) -> None:
    """Each tile of several pieces is merged row by row exactly once, by merge CTAs of whole rounds of merge_rows
    rows (a row's pieces shared by P thread groups leave whole groups for the CTA's other rows), fewer merge CTAs
    than SMs unless one per tile is already more, and no more rounds than that takes."""
    op = ptsolve.ops.flash_decode(**p)
    rows_ = op.params["batch"] * op.params["kv_heads"]
    for sms in (132, 64, 33, 16, 9, 5, 3):
        for t in op.tilings():
            threads = 128 * (t["groups"] + 1)
            ns = {q: n for q, _, _, n, _ in pieces(op.params, t["BM"], t["BN"], t["splits"])}
            units = merge_units(op.params, t["BM"], t["BN"], t["splits"], threads, sms)
            split = [q for q in sorted(ns) if ns[q] > 1]
            assert rows_ * len(units) < sms or all(u[3] == 1 for u in units)
            rounds = []
            for q in range(query_tiles(op.params, t["BM"])):
                mine = [u for u in units if u[0] == q]
                assert bool(mine) == (q in split)
                if not mine:
                    continue
                rows = [r for _, r0, n, _ in mine for r in range(r0, r0 + n)]
                assert rows == list(range(tile_rows(op.params, t["BM"], q))) and all(u[3] == len(mine) for u in mine)
                R = merge_rows(op.params["head_dim"], ns[q], threads)
                groups = threads // (op.params["head_dim"] // 4)
                assert R * min(groups, math.ceil(ns[q] / 8)) <= groups
                assert all(n % R == 0 for _, _, n, _ in mine[:-1])
                rounds.append(math.ceil(mine[0][2] / R))
            if units and max(rounds) > 1:  # one round fewer would be more merge CTAs than SMs
                fewer = sum(math.ceil(tile_rows(op.params, t["BM"], q) / ((max(rounds) - 1) * merge_rows(
                    op.params["head_dim"], ns[q], threads))) for q in split)
                assert rows_ * fewer >= sms


def test_tile_rows_are_the_rows_holding_a_query() -> None:
    falcon = ptsolve.ops.flash_decode(batch=1, heads=71, kv_heads=1, seq_q=1, seq_kv=64, head_dim=64).params
    assert [tile_rows(falcon, 64, q) for q in range(2)] == [64, 7] and tile_rows(falcon, 128, 0) == 71
    qwen = ptsolve.ops.flash_decode(batch=1, heads=14, kv_heads=2, seq_q=16, seq_kv=64, head_dim=64).params
    assert [tile_rows(qwen, 64, q) for q in range(2)] == [63, 49]  # 9 positions x 7 heads, then 7 x 7


@needs_nvcc
@pytest.mark.parametrize("p,t", [
    (dict(batch=1, heads=32, kv_heads=8, seq_q=4, seq_kv=4097, causal=True),
     {"BM": 64, "BN": 128, "depth": 3, "groups": 1, "splits": 7}),
    (dict(batch=4, heads=14, kv_heads=2, seq_q=1, seq_kv=32768, head_dim=64, dtype="bf16"),
     {"BM": 64, "BN": 128, "depth": 4, "groups": 1, "splits": 16}),
    (dict(batch=1, heads=71, kv_heads=1, seq_q=4, seq_kv=1000, head_dim=64),
     {"BM": 128, "BN": 64, "depth": 2, "groups": 2, "splits": 4}),
    (dict(batch=1, heads=8, kv_heads=8, seq_q=4097, seq_kv=4097, causal=True),
     {"BM": 128, "BN": 128, "depth": 2, "groups": 2, "splits": 3}),
])
def test_compiles_clean_for_sm90a(p: dict, t: dict) -> None:
    from codegen.runtime import compile_kernel
    assert t in ptsolve.ops.flash_decode(**p).tilings()
    rep = compile_kernel(_ks(p, t)).report
    assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0 and not rep["wgmma_serialized"], rep["warnings"]
    assert not rep["warnings"], rep["warnings"]


@needs_nvcc
def test_solver_schedule_compiles_through_the_compiler_in_the_loop() -> None:
    op = ptsolve.ops.flash_decode(batch=1, heads=14, kv_heads=2, seq_q=4, seq_kv=1000, head_dim=64, causal=True)
    res = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=30, cache=False, executor="serial",
                           compile_check=True)
    assert res.kernel_check["status"] == "ok" and res.kernel_check["spill_bytes"] == 0
    assert not res.kernel_check["serialized"]


def test_attention_offsets_are_64_bit_for_fa19_sizes() -> None:
    """FA18c (2^31 elements of q / o) and FA19 (2^32) emit: the check no longer refuses them and every offset into
    o is computed in 64 bits."""
    from codegen.cuda import emit
    from codegen.plan import default_plan
    for s, causal in ((4096, True), (8192, False)):
        p = ptsolve.ops.flash_attention(batch=64, heads=64, kv_heads=8, seq=s, head_dim=128, causal=causal).params
        ks = emit(default_plan("flash_attention", p, {"BM": 128, "BN": 128, "depth": 2, "groups": 2}), "h200")
        offs = [ln for ln in ks.source.splitlines() if "out +" in ln]
        # every offset into o starts from a 64-bit row (OROW, size_t), so the products that follow are 64-bit
        assert "const size_t OROW = (size_t)" in ks.source
        assert offs and all("(OROW + " in ln for ln in offs), offs
        assert 64 * s * 64 * 128 >= 1 << 31


def test_attention_refuses_only_32_bit_row_indices() -> None:
    """What stays 32-bit is a row index batch·seq; the operator's own size guard refuses such shapes first, so the
    generator's check is called on a hand-made IR."""
    from types import SimpleNamespace

    from codegen.cuda.attention import _check
    from ptsolve.errors import CodegenError
    t = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}
    p = dict(batch=1 << 16, heads=1, kv_heads=1, seq_q=1 << 15, seq_kv=1 << 15, head_dim=64, dtype="fp16")
    with pytest.raises(CodegenError, match="2\\^31 rows"):
        _check(SimpleNamespace(params=p, tiling=t))
    _check(SimpleNamespace(params=p | {"batch": 1 << 15, "seq_q": 1 << 15, "seq_kv": (1 << 16) - 1}, tiling=t))


def test_merge_ctas_tail_is_in_the_objective_and_the_replay() -> None:
    """A split launch whose pieces and merge CTAs exceed the SM slots pays the merge CTAs' tail (program.follow_tail):
    the solver's objective, its bound and simulate's replay all include it, so the tail ranks tilings without
    breaking the proof."""
    from ptsolve.policies.model import build
    from ptsolve.program import follow_tail
    from ptsolve.simulate import claimed_cycles, simulate
    hw = load("h200")
    op = ptsolve.ops.flash_decode(batch=64, heads=14, kv_heads=2, seq_q=1, seq_kv=1000, head_dim=64)
    res = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=30, cache=False, executor="serial",
                           fix={"splits": 2, "BN": 128})
    g = res.program.graph
    tail = follow_tail(g, hw)
    assert tail > 0 and build(g, hw).tail * build(g, hw).grain >= tail
    assert res.objective == claimed_cycles(res.program, hw) == simulate(res.program, hw).kernel_cycles
    assert res.status == "OPTIMAL" and res.bound == res.objective  # the proof's bound carries the tail too
    assert follow_tail(op.graph(dict(g.tiling, splits=1), hw), hw) == 0


def test_search_excludes_a_tiling_given_with_its_optional_defaults() -> None:
    """The compiler in the loop excludes a rejected tiling as its graph holds it (optional keys such as ``ctas`` at
    their defaults) while ``op.tilings()`` lists it without them: the search must still skip it (it handed the same
    tiling back forever, and the compile test never ended)."""
    from ptsolve.search import search
    op = ptsolve.ops.flash_decode(batch=1, heads=14, kv_heads=2, seq_q=4, seq_kv=1000, head_dim=64, causal=True)
    first = search(op, load("h200"), solver="greedy", time_limit=30, executor="serial")
    assert "ctas" in first.tiling and any("ctas" not in t for t in op.tilings())
    again = search(op, load("h200"), solver="greedy", time_limit=30, executor="serial", exclude=(first.tiling,))
    assert again.tiling != first.tiling


def test_merge_tail_grows_with_the_queued_merge_ctas() -> None:
    """Over decode shapes and piece counts: no tail while every merge CTA is resident beside the pieces, a tail as
    soon as some queue, never more for fewer queued merge CTAs, and at most follow_cycles. (The tail is not monotone
    in the piece count: more pieces can mean fewer, wider merge CTAs, ops.decode.merge_units.)"""
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    from ptsolve.ops.decode import follow, split_counts
    from ptsolve.program import follow_tail
    hw = load("h200")
    cap = hw.for_op("flash_decode").follow_cycles

    @settings(max_examples=examples(40), deadline=None, derandomize=True)
    @example((71, 1, 64), 15, 2049, 1)  # more pieces, fewer merge CTAs: a smaller tail at a larger piece count
    @given(st.sampled_from([(32, 8, 128), (14, 2, 64), (12, 12, 64), (71, 1, 64)]), st.integers(1, 64),
           st.integers(64, 20000), st.sampled_from([1, 2]))
    def check(heads: tuple[int, int, int], B: int, S: int, ctas: int) -> None:
        H, Hkv, D = heads
        op = ptsolve.ops.flash_decode(batch=B, heads=H, kv_heads=Hkv, seq_q=1, seq_kv=S, head_dim=D)
        W = 2 if H // Hkv > 64 else 1
        t = {"BM": 64 * W, "BN": 128, "depth": 2, "groups": W, "ctas": ctas if W == 1 else 1}
        seen = []
        for s in split_counts(op.params, t["BM"], t["BN"])[:12]:
            g = op.graph(t | {"splits": s}, hw)
            tail, n = follow_tail(g, hw), follow(op.params, g.tiling, hw)
            queued = min(n, g.n_ctas + n - hw.sms * t["ctas"])
            assert 0 <= tail <= cap
            assert (tail > 0) == (queued > 0)
            seen.append((queued, tail))
        seen.sort()
        assert all(a[1] <= b[1] for a, b in zip(seen, seen[1:]))

    check()


@given(st.integers(1, 8), st.sampled_from([(32, 8), (14, 2), (71, 1), (12, 12), (28, 4)]), st.integers(1, 16),
       st.integers(1, 200_000), st.booleans(), st.sampled_from([64, 128]), st.sampled_from([64, 128, 176]),
       st.integers(1, 64), st.integers(0, 10_000))
@settings(max_examples=300, deadline=None)
def test_generic_sizes_move_with_key_blocks_only(B, heads, sq, skv, causal, D, BN, splits, delta):
    """A decode family re-targets its launch to a longer cache by writing SKV alone while the keys stay in their
    BN-wide block (``sizes_at``): every other size of the generic kernel depends on the key count only through its
    blocks. The sizes of any count in the block equal ``sizes_at`` of the block's first count."""
    from codegen.cuda.decode import sizes, sizes_at
    H, Hkv = heads
    first = (skv - 1) // BN * BN + 1  # the block's first count
    other = min(first + delta % BN, first + BN - 1)
    p = {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": sq, "seq_kv": first, "head_dim": D, "causal": causal,
         "dtype": "fp16"}
    t = {"BM": 64, "BN": BN, "groups": 1 if H // Hkv * sq <= 64 else 2, "splits": splits}
    assert sizes(dict(p, seq_kv=other), t) == sizes_at(sizes(p, t), other)


def test_softcap_is_a_validated_parameter_priced_on_the_sfu() -> None:
    """``softcap`` (Gemma-2's, Grok's) is a decode parameter only where it asks something (0: the graph it always
    was); rowmax pays a multiply and a tanh per score on the SFU, as flash_attention's does, and nothing else of the
    graph moves (the merge combines the pieces' log-sum-exps of the capped scores); a bad cap is a ShapeError naming
    the value."""
    base = dict(batch=1, heads=16, kv_heads=8, seq_q=1, seq_kv=8192)
    t = {"BM": 64, "BN": 128, "depth": 2, "groups": 1, "splits": 8}
    assert "softcap" not in ptsolve.ops.flash_decode(**base, softcap=0.0).params
    plain, capped = ptsolve.ops.flash_decode(**base).graph(t), ptsolve.ops.flash_decode(**base, softcap=50).graph(t)
    assert capped.params["softcap"] == 50.0 and "_sc50_" in capped.name and "_sc" not in plain.name
    fa = ptsolve.ops.make("flash_attention", batch=1, heads=16, kv_heads=8, seq_q=64, seq_kv=8192, softcap=50.0).graph(
        {"BM": 64, "BN": 128, "depth": 2, "groups": 1})
    rm = {g.name: next(x for x in g.tasks if x.name == "rowmax@0") for g in (plain, capped, fa)}
    assert rm[capped.name].sfu == rm[fa.name].sfu == 64 * 128 and rm[plain.name].sfu == 0
    assert rm[capped.name].flops == 2 * rm[plain.name].flops
    others = {x.name: x for x in capped.tasks if x.name != "rowmax@0"}
    assert others == {x.name: x for x in plain.tasks if x.name != "rowmax@0"}
    for bad in (-1.0, float("inf"), float("nan"), True, "30"):
        with pytest.raises(ShapeError, match=r"flash_decode: softcap=.* must be a finite number >= 0"):
            ptsolve.ops.flash_decode(**base, softcap=bad)


@needs_nvcc
@pytest.mark.parametrize("p,t", [
    (dict(batch=1, heads=16, kv_heads=8, seq_q=1, seq_kv=8192, softcap=50.0),
     {"BM": 64, "BN": 128, "depth": 3, "groups": 1, "splits": 8}),
    (dict(batch=1, heads=71, kv_heads=1, seq_q=2, seq_kv=1000, head_dim=64, causal=True, softcap=30.0, dtype="bf16"),
     {"BM": 128, "BN": 64, "depth": 2, "groups": 2, "splits": 4}),
])
def test_softcap_exact_build_caps_scores_before_the_mask(p: dict, t: dict) -> None:
    """The exact-shape kernel with a softcap: each score capped, tanh(s · SOFTCAP_PRE) with SOFTCAP_PRE = 1 / (sqrt(D)
    · softcap), before the mask (a masked score stays -inf), the exp2 domain's scale softcap · log2 e; it compiles
    for sm_90a without spills or a serialised wgmma pipeline."""
    from codegen.runtime import compile_kernel
    ks = _ks(p, t)
    D, sc = p.get("head_dim", 128), p["softcap"]
    assert "tanh.approx.f32" in ks.source and f"SOFTCAP_PRE = {1 / (math.sqrt(D) * sc)!r}f" in ks.source
    assert f"SCALE_LOG2 = {math.log2(math.e) * sc!r}f" in ks.source
    body = ks.source[ks.source.index("fast_tanh(sacc"):]
    assert body.index("fast_tanh(sacc") < body.index("= -INFINITY")  # the cap, then the mask
    rep = compile_kernel(ks).report
    assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0 and not rep["wgmma_serialized"], rep["warnings"]
