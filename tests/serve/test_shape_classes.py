"""Shape-generic kernels on the CPU (ptsolve.serve, lower(..., generic=True)): shape-class keys, a generic
kernel's source holds no size of the shape it was solved on and is the same for every shape of its class, the
schedule table's look-ups and errors, and a second process compiles nothing (nvcc needed; skipped without)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

import ptsolve
from codegen.cuda import emit_ir
from codegen.lower import lower
from codegen.plan import default_plan, fa3_order_plan
from ptsolve import serve
from ptsolve.errors import PtsolveError, ShapeError

ROOT = Path(__file__).parents[2]
FA = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}
GEMM = {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}


def _fa(B, H, Hkv, Sq, Skv, D=128, causal=True, dtype="fp16"):
    return {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": Sq, "seq_kv": Skv, "head_dim": D, "causal": causal,
            "dtype": dtype}


def _has_nvcc() -> bool:
    from codegen.runtime import nvcc_path
    try:
        nvcc_path()
    except PtsolveError:
        return False
    return True


def test_class_keys():
    c = serve.attention_class("bf16", 128, True, 32, 8)
    assert c.key == "flash_attention/bf16/d128/causal/gqa2-4"
    assert serve.attention_class("fp16", 64, False, 16, 16).key == "flash_attention/fp16/d64/full/gqa1"
    assert serve.attention_class("fp16", 64, False, 64, 1).gqa == "5+"  # MQA
    assert serve.attention_class("fp16", 64, False, 40, 8).gqa == "5+"
    assert serve.attention_class("fp16", 64, False, 6, 3).gqa == "2-4"
    assert serve.gemm_class("fp16").key == "gemm/fp16" == serve.gemm_class("fp16", 4096).key
    assert serve.gemm_class("bf16", 4097).key == "gemm/bf16/regs" == serve.gemm_class("bf16", 4100).key
    m = serve.mamba_class("mamba2_chunk_state", "bf16", 64, 128, 256)
    assert m.key == "mamba2_chunk_state/bf16/p64/n128/q256"
    with pytest.raises(ShapeError, match="d_state=96"):
        serve.mamba_class("mamba2_chunk_scan", "fp16", 64, 96, 256)
    keys = [c.key for c in serve.classes()]
    d = serve.decode_class("bf16", 128, False, 32, 8, 1)
    assert d.key == "flash_decode/bf16/d128/full/wg1"
    assert serve.decode_class("fp16", 64, True, 71, 1, 1).groups == 2  # 71 packed rows: two warpgroups
    assert serve.decode_class("fp16", 64, True, 32, 8, 16).groups == 1  # 4 heads x 16 positions = 64 rows
    assert serve.decode_class("fp16", 64, True, 32, 8, 16) != serve.decode_class("fp16", 64, False, 32, 8, 16)
    # gemm (dtype x TMA or register store), attention (dtype x head_dim x causal x GQA bucket, plain or with a
    # softcap, a window or both), decode
    # (dtype x head_dim x causal x warpgroups, the
    # one-warpgroup d64 classes' two-CTAs-per-SM binaries, the one-warpgroup classes' persistent ones), Mamba2 (op x
    # dtype x d_state x chunk, and ChunkScan's two CB dtypes), Mamba2's state passing and decode step (dtype x d_state
    # each)
    assert len(keys) == len(set(keys)) == (2 * 2 + 4 * 2 * 5 * 2 * 3 + 2 * 2 * 2 * 2 + 2 * 2 + 2 * 2 * 2 + 3 * 2 * 2 * 3
                                           + 2 * 2 + 2 * 2)
    assert "mamba2_state_passing/bf16/p64/n128" in keys
    assert "flash_decode/bf16/d128/causal/wg1/persistent" in keys
    for c in serve.classes():  # every class's representative is its own class
        r = serve.representative(c)
        if c.op == "gemm":  # the representative's N (4096) is the plain class's: the register-store one is pinned
            assert serve.gemm_class(r["dtype"], r["N"] + (c.epilogue == "regs")) == c
        elif c.op in serve.MAMBA_OPS:
            assert serve.mamba_class(c.op, r["dtype"], r["head_dim"], r["d_state"], r["chunk"],
                                     cb_dtype=r.get("cb_dtype", "")) == c
        elif c.op == serve.STATE_PASSING:
            assert serve.state_passing_class(r["dtype"], r["head_dim"], r["d_state"]) == c
        elif c.op == serve.SSM_STEP:
            assert serve.ssm_step_class(r["dtype"], r["head_dim"], r["d_state"]) == c
        elif c.op == "flash_decode":
            assert serve.decode_class(r["dtype"], r["head_dim"], r["causal"], r["heads"], r["kv_heads"],
                                        r["seq_q"]) == dataclasses.replace(c, ctas=0, persistent=0)
        else:
            assert serve.attention_class(r["dtype"], r["head_dim"], r["causal"], r["heads"], r["kv_heads"],
                                         softcap="softcap" in r, window="window_left" in r) == c
            # the representative asks for what the class builds in (FlashAttention-3's normalisation keeps it)
            assert set(ptsolve.ops.make("flash_attention", **r).params) >= ({"softcap"} if c.softcap else set()) | (
                {"window_left", "window_right"} if c.window else set())


@pytest.mark.parametrize("args,words", [
    (("fp32", 128, True, 8, 8), ["fp32", "fp16", "bf16"]),
    (("fp16", 80, True, 8, 8), ["head_dim=80", "(64, 96, 128, 192, 256)"]),
    (("fp16", 128, True, 8, 3), ["heads=8", "kv_heads=3"]),
])
def test_class_errors_name_the_value(args, words):
    with pytest.raises(ShapeError) as e:
        serve.attention_class(*args)
    for w in words:
        assert w in str(e.value)
    with pytest.raises(ShapeError) as e:
        serve.decode_class(*args, 1)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("head_dim", [96, 192, 256])
def test_decode_covers_fewer_head_dims_than_prefill(head_dim):
    """FlashAttention-3's head dims all have a prefill class; the split-KV decode kernel covers 64 and 128 and says
    so, and ptsolve.torch then runs short queries on the prefill kernel."""
    assert serve.attention_class("bf16", head_dim, True, 32, 8).head_dim == head_dim
    with pytest.raises(ShapeError, match=rf"head_dim={head_dim}: .*\(64, 128\).*prefill kernel"):
        serve.decode_class("bf16", head_dim, True, 32, 8, 1)
    assert {c.head_dim for c in serve.classes() if c.op == "flash_decode"} == set(serve.DECODE_HEAD_DIMS)


def test_decode_class_takes_up_to_16_positions():
    with pytest.raises(ShapeError, match="seq_q=17"):
        serve.decode_class("fp16", 128, False, 32, 8, 17)


def _src(plan):
    return emit_ir(lower(plan, "h200", generic=True))


def test_the_generic_attention_build_writes_the_log_sum_exp_where_asked():
    """The class's kernel takes an ``lse`` pointer (null: not asked) and writes each stored row's log-sum-exp, +inf
    where a row sees no key (both the zeroed query blocks and the rows of a block whose sum is 0); the exact-shape
    build, which never serves a call that asks, is unchanged."""
    from codegen.cuda import emit
    plan = fa3_order_plan(_fa(3, 40, 8, 1003, 1777), FA)
    g, x = _src(plan), emit(plan)
    assert "ptr:lse" in g.args and "float* __restrict__ lse" in g.source
    assert "lse[LSE_B + row] = inv_l[hh] > 0.f ? m_r[hh] * 0.6931471805599453f - __logf(inv_l[hh]) : INFINITY;" \
        in g.source and "lse[LSE_B + r] = INFINITY;" in g.source and "if (lse != nullptr" in g.source
    assert "LSE_B" not in x.source and "float* __restrict__ lse" not in x.source and "ptr:lse" not in x.args


def test_generic_source_has_no_sizes_and_is_one_per_class():
    a = _src(fa3_order_plan(_fa(3, 40, 8, 1003, 1777), FA))
    b = _src(fa3_order_plan(_fa(1, 8, 2, 64, 64), FA))
    assert a.source == b.source and a.name == b.name and a.generic  # the source does not depend on the shape
    for size in ("1003", "1777"):
        assert size not in a.source
    for name in ("B_", "H", "HKV", "SQ", "SKV", "NMB", "NTILES"):
        assert f"i32:{name}" in a.args and f"const int {name}" in a.source
        assert not re.search(rf"constexpr int [^;]*\b{name} =", a.source)
    assert "f32:scale_log2" in a.args and "ptr:cu_q" in a.args
    exact = emit_ir(lower(fa3_order_plan(_fa(3, 40, 8, 1000, 1777), FA), "h200"))
    assert "constexpr int B_ = 3;" in exact.source and "constexpr int SKV = 1777;" in exact.source
    assert not exact.generic and exact.grid[0] == 8 * 40 * 3
    # another class (causal off) is another binary
    assert _src(fa3_order_plan(_fa(3, 40, 8, 1003, 1777, causal=False), FA)).name != a.name


def test_generic_gemm_source():
    a = _src(default_plan("gemm", {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}, GEMM))
    b = _src(default_plan("gemm", {"M": 100, "N": 72, "K": 8, "dtype": "bf16"}, GEMM))
    assert a.source == b.source
    for name in ("M", "N", "K", "TM", "TN", "KT", "NTILES"):
        assert f"i32:{name}" in a.args
    assert "4096" not in a.source.split("extern \"C\"")[1]
    assert a.persistent_tiles == 1 and a.grid == (0, 1, 1)


def test_generic_refuses_ops_without_sizes_and_profiling():
    from ptsolve.errors import CodegenError
    with pytest.raises(CodegenError, match="profiler"):
        emit_ir(lower(fa3_order_plan(_fa(1, 8, 8, 256, 256), FA), "h200", generic=True, profile=True))
    with pytest.raises(CodegenError, match="profiler"):
        emit_ir(lower(default_plan("flash_decode", _dp(1, 32, 8, 1, 4096), DEC), "h200", generic=True, profile=True))


DEC = {"BM": 64, "BN": 128, "depth": 2, "groups": 1, "splits": 4}


def _dp(B, H, Hkv, Sq, Skv, D=128, causal=False, dtype="fp16"):
    return _fa(B, H, Hkv, Sq, Skv, D, causal, dtype)


def test_generic_decode_source_is_one_per_class():
    a = _src(default_plan("flash_decode", _dp(1, 32, 8, 1, 4096), DEC))
    b = _src(default_plan("flash_decode", _dp(5, 28, 4, 3, 777), DEC | {"splits": 2}))  # pieces are a launch's
    assert a.source == b.source and a.name == b.name and a.generic and a.grid == (0, 1, 1)
    for name in ("B_", "H", "HKV", "SQ", "SKV", "GB", "SB", "NQT", "NSP", "CHUNK", "MRR", "NMU", "NTILES"):
        assert f"i32:{name}" in a.args
    assert "f32:scale_log2" in a.args and "dec_work" not in a.source  # no baked work table
    assert "mbar_expect_tx(pre_full, PR * D * 2)" in a.source  # the shape's query box, not the whole tile
    exact = emit_ir(lower(default_plan("flash_decode", _dp(1, 32, 8, 1, 4096), DEC), "h200"))
    assert "dec_work" in exact.source and not exact.generic


@pytest.mark.parametrize("p,t", [
    (_dp(2, 32, 8, 1, 32768), DEC | {"splits": 16}),
    (_dp(1, 71, 1, 2, 5000, 64, True), {"BM": 128, "BN": 64, "depth": 2, "groups": 2, "splits": 12}),
    (_dp(3, 14, 2, 5, 777, 64, True), DEC | {"splits": 3}),
    (_dp(1, 8, 1, 16, 300, causal=True), {"BM": 128, "BN": 64, "depth": 2, "groups": 2, "splits": 2}),
    (_dp(1, 128, 1, 3, 1000, causal=True), {"BM": 128, "BN": 64, "depth": 2, "groups": 2, "splits": 4}),
    (_dp(2, 28, 4, 1, 4097), DEC | {"splits": 17}),  # a ragged cache: 33 blocks, the last partial
    (_dp(16, 32, 8, 4, 4097, causal=True), DEC | {"splits": 2}),  # 128 tiles: merge CTAs take two rounds of rows
])
def test_generic_decode_sizes_cut_pieces_as_the_model(p, t):
    """The generic kernel's cut (its C, ``codegen.cuda.decode._tiles``: tile qt visits TT key blocks, ns = ceil(TT /
    CHUNK) pieces, piece k = [k·TT/ns, (k+1)·TT/ns)) from ``sizes`` gives the CTAs ``ptsolve.ops.decode.pieces``
    does, and the merge grid covers every row of a split tile with fewer merge CTAs than SMs."""
    from codegen.cuda.decode import sizes
    from ptsolve.ops.decode import pieces, tile_rows, trip_counts
    sz = sizes(p, t, 132)
    trips = trip_counts(p, t["BM"], t["BN"])

    def fdiv(n, name):  # the kernel's division by a launch divisor (codegen.cuda.common.FAST_DIV)
        d = sz["NQT"] * sz["NSP"] if name == "NE" else sz[name]  # NE: the kernel's product
        m, sh = sz[name + "_M"] & 0xFFFFFFFF, sz[name + "_S"]
        return n if d == 1 else (n * m >> 32) >> sh

    got = set()
    for tile in range(sz["NTILES"]):  # the C of _tiles, line by line
        row = fdiv(tile, "NE")
        e = tile - row * sz["NQT"] * sz["NSP"]
        qq = fdiv(e, "NSP")
        piece, qt = e - qq * sz["NSP"], sz["NQT"] - 1 - qq
        TT = trips[qt]
        ns = -(-TT // sz["CHUNK"]) if p["causal"] else sz["NS0"]
        assert ns <= sz["NSP"]
        if piece < ns and row == 0:
            kb0 = piece * TT // ns if p["causal"] else fdiv(piece * TT, "NS0")
            end = (piece + 1) * TT // ns if p["causal"] else fdiv((piece + 1) * TT, "NS0")
            got.add((qt, kb0, end - kb0, ns, piece))
    assert sorted(got) == sorted(pieces(p, t["BM"], t["BN"], t["splits"]))
    assert sz["NTILES"] == p["batch"] * p["kv_heads"] * sz["NQT"] * sz["NSP"]
    if max(g[3] for g in got) > 1:
        assert sz["MRR"] * sz["NMU"] >= max(tile_rows(p, t["BM"], q) for q in range(sz["NQT"]))
        assert p["batch"] * p["kv_heads"] * sz["NQT"] * sz["NMU"] < 132


@settings(max_examples=examples(2000), deadline=None, derandomize=True)
@given(st.integers(0, (1 << 31) - 1), st.one_of(st.integers(1, 4096), st.integers(1, (1 << 31) - 1)))
def test_fast_div_is_exact(n, d):
    from codegen.cuda.common import fast_div
    m, sh = fast_div(d)
    assert (n if d == 1 else (n * (m & 0xFFFFFFFF) >> 32) >> sh) == n // d
    assert -(1 << 31) <= m < 1 << 31  # an i32 argument


@pytest.mark.parametrize("key,shape", [
    (("fp16", 128, False, 32, 8, 1), (16, 32, 8, 1, 33000)),
    (("fp16", 64, True, 71, 1, 2), (1, 71, 1, 2, 20000)),
    (("fp16", 64, True, 14, 2, 5), (3, 14, 2, 5, 4000)),
])
def test_decode_retiming_replays_a_few_iterations_exactly(key, shape):
    """decode_splits' shortened replay (DECODE_REPLAY_TRIPS iterations, then the loop's period) predicts what the
    full replay does, for every piece count of the shape."""
    import dataclasses

    from ptsolve.ops import make
    from ptsolve.ops.decode import split_counts
    from ptsolve.simulate import simulate
    c = serve.decode_class(*key)
    prog = serve.class_program(c)
    t = prog.graph.tiling
    p = _dp(*shape, D=key[1], causal=key[2])
    op = make("flash_decode", **p)
    for s in split_counts(p, t["BM"], t["BN"]):
        q = dataclasses.replace(prog, graph=op.graph(dict(t, splits=s), "h200"))
        assert simulate(q, "h200", max_trips=serve.DECODE_REPLAY_TRIPS).kernel_us == simulate(q, "h200").kernel_us


def test_kv_bucket_steps_a_fifth_at_most():
    prev = 0
    for n in range(1, 5000):
        b = serve.decode._kv_bucket(n)
        assert b >= n and b < n * 1.26 + 1 and b >= prev
        prev = b
    assert len({serve.decode._kv_bucket(n) for n in range(1, 5000)}) < 60


@given(st.integers(1, 1 << 20))
def test_bucket_blocks_is_the_whole_bucket(n):
    """A decode family's range of key blocks (``_bucket_blocks``) is exactly the blocks sharing n's bucket: the
    family re-targets its launch within it and nowhere else (decode_pick's choice is the same inside)."""
    lo, hi = serve.decode._bucket_blocks(n)
    kb = serve.decode._kv_bucket
    assert lo <= n <= hi and kb(lo) == kb(hi) == kb(n) == hi
    assert lo == 1 or kb(lo - 1) != hi
    assert kb(hi + 1) != hi


def test_decode_pick_chooses_among_the_class_binaries_by_the_model():
    """A one-warpgroup d64 decode class has a second binary, two CTAs per SM (its own solved program, 64-wide key
    blocks, no spills in half the register file); d128 classes and two-warpgroup ones do not. ``decode_pick`` takes
    the binary and pieces whose re-timed program predicts the shortest kernel: for GPT-2's MHA batch 16, 1k cache
    (192 short rows: one wave of 2 x 132 resident CTAs instead of 1.5 of 132) the two-CTA binary, as measured
    (bench study torch_decode)."""
    mha = serve.decode_class("fp16", 64, False, 12, 12, 1)
    two = serve.decode_variants(mha)
    assert [(v.ctas, v.persistent) for v in two] == [(0, 0), (2, 0), (0, 1)]
    assert two[1].key == "flash_decode/fp16/d64/full/wg1/ctas2"
    assert serve.schedule(two[1]).tiling["ctas"] == 2 and serve.schedule(two[1]).tiling["BN"] == 64
    d128 = serve.decode_class("fp16", 128, False, 32, 8, 1)
    assert serve.decode_variants(d128) == [d128, dataclasses.replace(d128, persistent=1)]
    falcon = serve.decode_class("fp16", 64, False, 71, 1, 1)  # two warpgroups: or one, the rows in two tiles
    assert serve.decode_variants(falcon) == [falcon, serve.decode_class("fp16", 64, False, 32, 8, 1)]
    p = _dp(16, 12, 12, 1, 1024, 64)
    v, s = serve.decode_pick(mha, p)
    assert v == two[1]
    assert serve.decode._decode_best(v, p)[0] < serve.decode._decode_best(mha, p)[0]
    assert s == serve.decode_splits(v, p)


def test_decode_pick_prices_shared_dram_and_the_merge_ctas_tail():
    """Two choices the cost model got wrong before it priced them (measured on an H200, bench study torch_decode/
    pick_ab.py): GPT-2 b16 at 8192 keys runs the two-CTA binary in one piece (100 us; two pieces 121, the one-CTA
    binary's best 108): 192 CTAs at two per SM keep 96 SMs busy, which split DRAM between them
    (policies.model.floor_of); Qwen2.5-0.5B b64 at 1000 keys stays on the one-CTA binary in one piece (11.9 us; the
    two-CTA binary's two pieces 14.4): 256 pieces and 128 merge CTAs exceed the 264 slots, and the queued merge CTAs
    cost a tail (program.follow_tail)."""
    gpt2 = _dp(16, 12, 12, 1, 8192, 64)
    v, s = serve.decode_pick(serve.decode_class("fp16", 64, False, 12, 12, 1), gpt2)
    assert (v.ctas, s) == (2, 1)
    qwen = _dp(64, 14, 2, 1, 1000, 64)
    c = serve.decode_class("fp16", 64, False, 14, 2, 1)
    assert serve.decode_pick(c, qwen) == (c, 1)
    # Falcon-7B (71 heads per kv head) at batch 1, 1000 keys: the one-warpgroup binary, its rows in two query tiles
    # (6.2 us; the two-warpgroup binary 7.5: bench study torch_decode wg)
    falcon = serve.decode_class("fp16", 64, False, 71, 1, 1)
    assert serve.decode_pick(falcon, _dp(1, 71, 1, 1, 1000, 64))[0] == serve.decode_class("fp16", 64, False,
                                                                                               32, 8, 1)


def test_decode_persistent_binary_is_one_piece_and_picked_where_its_handover_pays():
    """Persistent CTAs are a decode tiling only where every query tile is one piece and there is more than one tile
    (merge CTAs would wait for pieces a persistent CTA has not reached); the persistent generic binary has no merge
    CTAs. The model picks it for Llama-3-70B b64 at 511 keys (512 one-piece tiles: the producer loads a tile's
    first K/V blocks while the consumers finish the last; measured 43.6 -> 40.9 us, bench study torch_decode
    and pick_ab.py) and not where the keys are split (batch 1, 32k keys)."""
    from ptsolve.ops import make
    ts = make("flash_decode", **_dp(4, 32, 8, 1, 4096)).tilings()
    pers = [t for t in ts if t.get("persistent")]
    assert pers and all(t["splits"] == 1 and t.get("ctas", 1) == 1 for t in pers)
    assert not any(t.get("persistent") for t in make("flash_decode", **_dp(1, 8, 1, 1, 4096)).tilings())  # 1 tile
    c = serve.decode_class("fp16", 128, False, 64, 8, 1)
    p = _dp(64, 64, 8, 1, 511)
    v, s = serve.decode_pick(c, p)
    assert (v, s) == (dataclasses.replace(c, persistent=1), 1)
    assert serve.decode._decode_best(v, p)[0] < serve.decode._decode_best(c, p)[0]
    assert serve.schedule(v).tiling["persistent"] == 1 and serve.schedule(v).tiling["splits"] == 1
    src = serve.kernel(v).ks
    assert src.persistent_tiles and "a merge CTA" not in src.source
    assert "a merge CTA" in serve.kernel(c).ks.source
    long = _dp(1, 32, 8, 1, 32768)
    v, s = serve.decode_pick(serve.decode_class("fp16", 128, False, 32, 8, 1), long)
    assert not v.persistent and s > 1


def test_follow_tail_only_when_the_merge_ctas_queue():
    """The merge CTAs' tail is 0 while grid + merge CTAs fit the SM slots, and grows with the share that queues."""
    from ptsolve.hw import load
    from ptsolve.ops import make
    from ptsolve.program import follow_tail
    hw = load("h200")
    fc = hw.for_op("flash_decode").follow_cycles
    assert fc > 0
    op = make("flash_decode", **_dp(1, 32, 8, 1, 4096))
    t = {"BM": 64, "BN": 128, "depth": 2, "groups": 1}
    assert follow_tail(op.graph(t | {"splits": 1}, hw), hw) == 0  # one piece: no merge CTAs
    assert follow_tail(op.graph(t | {"splits": 8}, hw), hw) == 0  # 64 pieces + 8 merge CTAs: resident
    big = make("flash_decode", **_dp(64, 14, 2, 1, 1000, 64))
    one, two = (follow_tail(big.graph({**t, "BN": 64, "splits": s, "ctas": c}, hw), hw) for s, c in ((2, 1), (2, 2)))
    assert 0 < two < one <= fc  # 256 pieces + 128 merges queue less behind 264 slots than behind 132


def test_decode_splits_fill_the_gpu_from_the_class_program():
    """The class's program re-timed per shape: a long cache of 8 (batch, kv head) rows splits; 512 rows do not."""
    c = serve.decode_class("fp16", 128, False, 32, 8, 1)
    long1 = serve.decode_splits(c, _dp(1, 32, 8, 1, 32768))
    assert long1 >= 8
    assert serve.decode_splits(c, _dp(64, 32, 8, 1, 4096)) == 1
    assert serve.decode_splits(c, _dp(1, 32, 8, 1, 32768 - 5)) == long1  # the same bucket, kept
    # a causal speculative step on a long cache is no prefill: few distinct trip counts to replay, no size refusal
    cc = serve.decode_class("fp16", 128, True, 32, 8, 4)
    assert serve.decode_splits(cc, _dp(1, 32, 8, 4, 200_000, causal=True)) > 1


MAMBA = {"mamba2_chunk_scan": {"BM": 64, "BK": 64, "depth": 3, "groups": 1, "ctas": 2},
         "mamba2_chunk_state": {"BM": 64, "BK": 64, "depth": 3, "groups": 1, "ctas": 2}}


def _mp(b, L, h, g, n=128, q=256, dtype="fp16"):
    return {"batch": b, "seq": L, "heads": h, "head_dim": 64, "d_state": n, "chunk": q, "groups": g, "dtype": dtype}


@pytest.mark.parametrize("op", sorted(MAMBA))
def test_generic_mamba_source_has_no_sizes_and_is_one_per_class(op):
    a = _src(default_plan(op, _mp(3, 1003, 24, 8), MAMBA[op]))
    b = _src(default_plan(op, _mp(1, 77, 2, 1), MAMBA[op]))
    assert a.source == b.source and a.name == b.name and a.generic and a.grid == (0, 1, 1)
    body = a.source.split('extern "C"')[1]
    for size in ("1003", "24"):  # neither seq nor heads of the shape it was lowered at
        assert not re.search(rf"\b{size}\b", body), size
    for name in ("B_", "SEQ", "H", "G", "NC", "NTILES"):
        assert f"i32:{name}" in a.args and f"const int {name}" in a.source
        assert not re.search(rf"constexpr int [^;]*\b{name} =", a.source)
    # the class's other sizes stay constants; another class (d_state, chunk, dtype) is another binary
    assert "constexpr int P = 64" in a.source
    for other in (_mp(3, 1003, 24, 8, n=64), _mp(3, 1003, 24, 8, q=128), _mp(3, 1003, 24, 8, dtype="bf16")):
        assert _src(default_plan(op, other, MAMBA[op])).name != a.name
    # the exact-shape build keeps its constants (and its source: the paper configurations' are byte-identical)
    exact = emit_ir(lower(default_plan(op, _mp(3, 1003, 24, 8), MAMBA[op]), "h200"))
    assert "  constexpr int SEQ = 1003, H = 24, G = 8, P = 64, " in exact.source and not exact.generic
    assert f"\n  constexpr int NTILES = {exact.grid[0]};\n" in exact.source
    for name in ("B_", "SEQ", "H", "G", "NC", "NTILES"):  # each defined once, in the op's own constants' layout
        assert len(re.findall(rf"constexpr int [^;]*\b{name} =", exact.source)) == 1, name
    assert not any(x.startswith("i32:") for x in exact.args)


def test_generic_mamba_sizes_give_the_grid():
    from codegen.cuda import chunk_scan, chunk_state
    s = chunk_scan.sizes(_mp(2, 1000, 8, 2), {"BM": 64})
    assert list(s) == ["B_", "SEQ", "H", "G", "NC", "NTILES"] and s["NC"] == 4 and s["NTILES"] == 4 * 8 * 2 * 4
    t = chunk_state.sizes(_mp(2, 1000, 8, 2), {"BM": 64})
    assert t["NC"] == 4 and t["NTILES"] == 4 * 8 * 2 * 2
    for op, mod in (("mamba2_chunk_scan", chunk_scan), ("mamba2_chunk_state", chunk_state)):
        # the exact build's grid is the same formula at the plan's shape
        plan = default_plan(op, _mp(2, 1000, 8, 2), MAMBA[op])
        assert emit_ir(lower(plan, "h200")).grid[0] == mod.sizes(plan.params, plan.tiling)["NTILES"]


class _T:
    """A tensor's shape only (mamba_params reads nothing else)."""

    def __init__(self, *shape):
        self.shape = shape


def test_mamba_params_check_every_shape():
    c = serve.mamba_class("mamba2_chunk_scan", "fp16", 64, 128, 256)
    b, L, h, g, n, q = 2, 300, 8, 2, 128, 256
    ok = dict(x=_T(b, L, h, 64), BC=_T(b, L, g, n), dt=_T(b, h, 2, q), dA_cumsum=_T(b, h, 2, q),
              cb=_T(b, 2, g, q, q), states=_T(b, 2, h, 64, n))
    assert serve.mamba_params(c, **ok) == _mp(b, L, h, g)
    for k, bad in (("dt", _T(b, h, 1, q)), ("cb", _T(b, 2, 1, q, q)), ("states", _T(b, 2, h, 64, 64)),
                   ("BC", _T(b, L + 1, g, n))):
        with pytest.raises(ShapeError, match="must be"):
            serve.mamba_params(c, **(ok | {k: bad}))
    with pytest.raises(ShapeError, match="ngroups=3"):
        serve.mamba_params(c, **(ok | {"BC": _T(b, L, 3, n), "cb": _T(b, 2, 3, q, q)}))
    s = serve.mamba_class("mamba2_chunk_state", "fp16", 64, 128, 256)
    huge = 1 << 22  # batch·heads·nchunks·chunk >= 2^31
    with pytest.raises(ShapeError, match="32-bit"):
        serve.mamba_params(s, _T(1, huge, 512, 64), _T(1, huge, 1, n), _T(1, 512, huge // q, q),
                             _T(1, 512, huge // q, q))


def test_kernel_ir_json_keeps_generic():
    from codegen.kernel_ir import KernelIR
    ir = lower(fa3_order_plan(_fa(1, 8, 8, 256, 256), FA), "h200", generic=True)
    assert KernelIR.from_json(ir.to_json()) == ir and json.loads(ir.to_json())["generic"] is True
    exact = lower(fa3_order_plan(_fa(1, 8, 8, 256, 256), FA), "h200")
    assert "generic" not in json.loads(exact.to_json())  # exact IRs keep their JSON, plan ids and cached cubins
    assert KernelIR.from_json(exact.to_json()) == exact


def test_shipped_table_covers_every_class():
    t = serve.load_table()
    assert set(t["classes"]) == {c.key for c in serve.classes()}, "rebuild: python3 -m ptsolve.serve table"
    assert "commit" in t["made"] and t["hw"] == serve.HW
    for key, e in t["classes"].items():
        plan = serve.schedule(next(c for c in serve.classes() if c.key == key), t)
        assert plan.params["dtype"] == key.split("/")[1]
        assert e["generic_ptxas"].get("spill_stores", 0) == 0


def test_table_miss_without_solvers_names_class_and_fix(monkeypatch):
    monkeypatch.setattr(serve.table, "solvers_installed", lambda: False)
    c = serve.attention_class("fp16", 64, True, 8, 8)
    with pytest.raises(PtsolveError) as e:
        serve.schedule(c, {"classes": {}})
    assert c.key in str(e.value) and "python3 -m ptsolve.serve table" in str(e.value)


def test_table_unreadable(tmp_path):
    p = tmp_path / "t.json"
    p.write_text("{not json")
    with pytest.raises(PtsolveError, match="rebuild"):
        serve.load_table(p)
    p.write_text(json.dumps({"x": 1}))
    with pytest.raises(PtsolveError, match="classes"):
        serve.load_table(p)
    assert serve.load_table(tmp_path / "absent.json") == {"classes": {}}


def test_sizes_give_the_grid():
    from codegen.cuda import attention, gemm
    s = attention.sizes({"batch": 3, "heads": 5, "kv_heads": 1, "seq_q": 129, "seq_kv": 7}, {"BM": 128})
    assert s["NMB"] == 2 and s["NTILES"] == 2 * 5 * 3 and list(s)[-1] == "NTILES"
    g = gemm.sizes({"M": 1000, "N": 72, "K": 8}, {"BM": 128, "BN": 256})
    assert (g["TM"], g["TN"], g["KT"], g["NTILES"]) == (8, 1, 1, 8)


PROBE = """
import json, sys
from codegen import runtime
from ptsolve import serve
c = serve.attention_class("fp16", 64, True, 8, 2)
serve.compile_class(c); serve.compile_class(serve.gemm_class("bf16"))
serve.compile_class(serve.mamba_class("mamba2_chunk_state", "bf16", 64, 64, 64))
print(json.dumps({"nvcc": runtime.NVCC_RUNS[0]}))
"""


@pytest.mark.skipif(not _has_nvcc(), reason="needs nvcc")
@pytest.mark.parametrize("args", [("fp16", 128, False, 32, 8, 1), ("bf16", 64, True, 71, 1, 2)])
def test_generic_decode_kernels_compile_clean(args, tmp_path, monkeypatch):
    """The decode classes' shipped schedules as generic kernels (one and two consumer warpgroups): ptxas builds them
    for sm_90a without spills or a serialised wgmma pipeline."""
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    rep = serve.compile_class(serve.decode_class(*args))
    assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0 and not rep["wgmma_serialized"], rep


@pytest.mark.skipif(not _has_nvcc(), reason="needs nvcc")
def test_gemm_register_store_class_takes_any_n(tmp_path, monkeypatch):
    """N not a multiple of 8 (C's rows off the 16-byte pitch a TMA store needs): the .../regs class's shipped schedule
    stores C from registers, the plain class's by TMA, and its generic kernel compiles clean."""
    from ptsolve.serve.table import schedule
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    for d in ("fp16", "bf16"):
        plain, regs = (schedule(serve.gemm_class(d, n)).tiling for n in (0, 4097))
        assert plain.get("tma_store") == 1 and not regs.get("tma_store")
    rep = serve.compile_class(serve.gemm_class("fp16", 77))
    assert rep["spill_stores"] == 0 and not rep["wgmma_serialized"], rep


@pytest.mark.skipif(not _has_nvcc(), reason="needs nvcc")
@pytest.mark.parametrize("causal", [False, True])
def test_generic_persistent_attention_keeps_its_wgmma_pipelined(causal, tmp_path, monkeypatch):
    """A generic attention kernel on persistent CTAs skips a tile by sizes it loads (varlen offsets): the branch must
    reach ptxas as warp-uniform, or it serialises the consumers' wgmma around it (C7520; the skeleton branches on
    lane 0's value). The d128 class's schedule, grid and persistent, both clean."""
    from codegen.plan import KernelPlan
    from codegen.runtime import compile_kernel
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    d = json.loads(serve.schedule(serve.attention_class("fp16", 128, causal, 32, 8)).to_json())
    for pers in (0, 1):
        d["tiling"].pop("persistent", None)
        d["tiling"] |= {"persistent": 1} if pers else {}
        ks = emit_ir(lower(KernelPlan.from_json(json.dumps(d)), "h200", generic=True))
        assert bool(ks.persistent_tiles) == bool(pers)
        rep = compile_kernel(ks).report
        assert rep["spill_stores"] == 0 and not rep["wgmma_serialized"], rep


@pytest.mark.skipif(not _has_nvcc(), reason="needs nvcc")
def test_second_process_compiles_nothing(tmp_path):
    env = {**os.environ, "PTSOLVE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1])["nvcc"])
    assert runs == [3, 0]


@pytest.mark.parametrize("p,t", [
    (_dp(4, 32, 8, 1, 32768), DEC | {"splits": 16}),
    (_dp(2, 28, 4, 4, 8192, 128, True), DEC | {"splits": 5}),
    (_dp(1, 71, 1, 2, 5000, 64, True), {"BM": 128, "BN": 64, "depth": 2, "groups": 2, "splits": 12}),
    (_dp(3, 14, 2, 5, 777, 64, True), DEC | {"splits": 3}),
])
@pytest.mark.parametrize("seqlen", [-3, 0, 1, 2, 63, 64, 65, 700, 777, 5000, 8191, 32768, 40000])
def test_length_pieces_cover_the_keys_each_sequence_sees(p, t, seqlen):
    """With per-sequence lengths (``codegen.cuda.decode._tile_blocks`` with ``seqlens``): each query tile's pieces
    are contiguous, non-empty, cover exactly the key blocks holding a key one of its rows sees (one masked block where
    none does), and number min(splits, blocks): the launch's parallelism, not more."""
    from ptsolve.ops.decode import length_pieces, packing, query_tiles
    BM, BN = t["BM"], t["BN"]
    n = min(max(seqlen, 0), p["seq_kv"])
    gbox, sbox = packing(p, BM)
    ngt = -(-(p["heads"] // p["kv_heads"]) // gbox)
    got = length_pieces(p, BM, BN, t["splits"], seqlen)
    for qt in range(query_tiles(p, BM)):
        mine = sorted((kb, T, ns, k) for q, kb, T, ns, k in got if q == qt)
        positions = range(qt // ngt * sbox, min(p["seq_q"], (qt // ngt + 1) * sbox))
        seen = max((min(n, s + n - p["seq_q"] + 1) if p["causal"] else n) for s in positions)
        blocks = max(1, -(-seen // BN)) if seen > 0 else 1
        assert [x[3] for x in mine] == list(range(len(mine))) and all(x[2] == len(mine) for x in mine)
        assert len(mine) == min(t["splits"], blocks)
        assert mine[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(mine, mine[1:]))
        assert mine[-1][0] + mine[-1][1] == blocks and min(x[1] for x in mine) >= 1


def test_generic_decode_reads_lengths_only_in_generic_builds():
    """The generic decode kernel takes ``seqlens`` (a null pointer: the dense cache) and masks by the sequence's
    length; an exact-shape build keeps its compile-time SKV."""
    c = serve.decode_class("fp16", 128, True, 32, 8, 4)
    src = serve.kernel(c).ks
    assert "ptr:seqlens" in src.args and "seqlens ? min(NSP, TT)" in src.source
    assert "key >= skv_" in src.source and "key > sq + off_" in src.source
    exact = emit_ir(lower(default_plan("flash_decode", _dp(1, 32, 8, 1, 4096), DEC), "h200"))
    assert "seqlens" not in exact.source and "key >= SKV" in exact.source


def test_table_only_takes_several_comma_separated_parts():
    """``table --only`` / ``precompile --only``: every class when empty, else the classes whose key contains one of
    the comma-separated parts (fp16 and bf16 of one family in one build, so the bf16 twins reuse the fp16 solves)."""
    from ptsolve.serve import classes
    from ptsolve.serve.build import _picked
    keys = [c.key for c in classes()]
    assert all(_picked(k, "") for k in keys)
    # plain, softcap, window, both
    got = [k for k in keys if _picked(k, "flash_attention/fp16/d128,flash_attention/bf16/d128")]
    assert len(got) == 4 * 12 and all(k.startswith("flash_attention/") and "/d128/" in k for k in got)
    assert {k.split("/")[1] for k in got} == {"fp16", "bf16"}
    assert not any(_picked(k, ",") for k in keys)


def test_class_fix_pins_what_each_generic_kernel_assumes():
    """A class's solve pins: GEMM one K range (and the TMA store off for the register-store class); decode its
    warpgroups, CTAs per SM and several pieces (one and
    persistent for a persistent class); attention nothing."""
    from ptsolve.serve import DECODE_REP_SPLITS, class_fix, classes
    seen = set()
    for c in classes():
        f = class_fix(c)
        seen.add(c.op)
        if c.op == "gemm":
            assert f == {"splits": 1} | ({"tma_store": 0} if c.epilogue == "regs" else {})
        elif c.op == "flash_decode":
            assert f["groups"] == c.groups and f["ctas"] == max(1, c.ctas)
            assert (f["splits"], f.get("persistent")) == ((1, 1) if c.persistent else (DECODE_REP_SPLITS, None))
        else:
            assert f is None
    assert {"gemm", "flash_decode", "flash_attention"} <= seen


def test_precompile_pack_holds_each_class_kernel_once(tmp_path, monkeypatch):
    """``python -m ptsolve.serve precompile --pack``: the tar.xz holds the picked classes' cubins and ptxas reports
    under .cubin_dev/cubin/ (the path a GPU checkout unpacks at its root), each key once, and nothing else."""
    import tarfile
    from types import SimpleNamespace

    import codegen.runtime as rt
    from ptsolve.serve import build, kernels

    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "cubin").mkdir(parents=True)
    for k in ("aa", "bb", "cc"):
        for ext in (".cubin", ".json"):
            (tmp_path / "cache" / "cubin" / f"{k}{ext}").write_text(k)
    keys = {"c1": "aa", "c2": "bb", "c3": "aa"}  # two classes sharing one kernel; cc belongs to none
    monkeypatch.setattr(kernels, "kernel", lambda c: SimpleNamespace(ks=c))
    monkeypatch.setattr(rt, "_key", lambda ks: keys[ks])
    n, size = build.pack(["c1", "c2", "c3"], tmp_path / "p" / "cache.tar.xz")
    with tarfile.open(tmp_path / "p" / "cache.tar.xz") as tf:
        names = sorted(tf.getnames())
    assert n == 2 and size > 0
    assert names == [f".cubin_dev/cubin/{k}{e}" for k in ("aa", "bb") for e in (".cubin", ".json")]
