"""GEMM C[M,N] = A[M,K] · B[K,N]: fp16/bf16 in, fp32 accumulate, fp16/bf16 out.

One CTA computes a BM×BN tile of C; its consumer warpgroups split the BM rows (cooperative). The
reduction over K is the loop: load_a, load_b (TMA, producer) and one mma per warpgroup per BK step.

Ping-pong (tiling key ``pingpong`` = 1, default 0; with ``groups`` = 1): two consumer warpgroups each own a *different*
BM×BN tile of a persistent CTA (local tiles 0, 2, 4, ... and 1, 3, 5, ...); their main loops take the tensor cores
in turn (``tc_order`` mma@0, mma@1 at tile granularity) and one's epilogue (convert + store) overlaps the other's
main loop; the producer fills one ring in tile order (CUTLASS's Hopper ping-pong kernel schedule). The graph is one
warpgroup's tile; the model runs it in two slots per SM that share the tensor cores, copy engine and MUFU
(``Tiling.slots``: the busiest slot or the shared units' floor, whichever is longer), with the registers of two
consumer warpgroups (``Tiling.kernel_groups``). Its epilogue stores from registers and takes no shared memory.

Clusters (tiling key ``cluster`` = 2, default 1; not with split-K): the two CTAs of a thread-block cluster compute
M-neighbour tiles with the same B columns; each loads half of the B tile and multicasts it into both (TMA
multicast), so B is read from L2 once per pair. The M tiles are rounded up to pairs (an odd last one has a partner
past M that loads zeros and stores nothing). ``STask.multicast`` marks load_b; the model charges it as before (each
SM still receives the whole tile through its L2 share, which is what bounds these loops), and on an H200 clusters
measured 3% slower than the same tilings without (15% faster only where K's rows are misaligned,
bench study gemm_skinny): an opt-in structure (OpSpec.opt_in), searched only when ``fix`` or tune's ``per`` names it.

Split-K (tiling key ``splits`` = S, default 1): the K steps of a tile are divided into S contiguous ranges, one
CTA each (S times the CTAs, each with ~1/S of the trips), for shapes with too few output tiles to fill the SMs
(M of 1-128 with large K). Every split writes its fp32 partial tile to a global workspace (``partial@g``) and
counts itself done; *reduce CTAs* (``reduce_ctas`` per tile, launched after every split) wait for their tile's
splits, sum a share of its elements over the S partials in split order (deterministic) and store them. The last
split to arrive used to sum the whole tile alone: S × BM × BN × 4 bytes through one SM (16 × 64 KB at BN = 128),
which kept the small split-K GEMMs far from cuBLAS. The model charges each split its partial's write and one
partial's read (what the reduce CTAs read, spread over them).

TMA-store epilogue (tiling key ``tma_store`` = 1, default 0; not with split-K; N a multiple of 8, the 16-byte row
pitch a tensor map needs): instead of storing its accumulators from registers (``store@g``: 4-byte stores, eight
rows of 16 bytes per warp instruction), each consumer warpgroup writes them in 64-column chunks into a staging
buffer in shared memory (stmatrix, the 128-byte swizzle of the tensor map) and one thread hands each chunk to the
copy engine (``store_tma@g``: a TMA tensor store; rows past M and columns past N are clipped by it). The buffer
(``cs@g``: ``STAGE_SLOTS`` chunks of rows × 64 per kernel warpgroup, so twice that in a ping-pong graph, whose one
warpgroup stands for two) belongs to the CTA for its whole life, not to the epilogue: in a persistent kernel the
copy engine still reads it while the warpgroup runs the next tile's main loop, so it cannot overlay the ring the way
an epilogue-only buffer does; ``zero@g`` (pre) allocates it with the accumulators. The model prices the two stores
by the rates the profiler measured (``Hardware.reg_store_bytes_per_clk`` / ``staged_store_bytes_per_clk``,
``STask.staged``) against the shared memory the staging takes from the ring; on the H200 the TMA store measured
1.067x (cooperative) and 1.026x (ping-pong) the register store's speed, same tilings (bench study tma_store).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from .. import arguments
from ..errors import ShapeError
from ..geometry.gemm import STAGE_COLS, STAGE_SLOTS, a_rows, reduce_ctas, split_trips, stage_bytes  # noqa: F401  (re-exported for its readers)
from ..hw import Hardware
from ..ir import DTYPE_BYTES, Edge, STaskGraph
from .base import (
    MMA_K,
    WG_ROWS,
    OpSpec,
    TextbookPlan,
    cdiv,
    check_keys,
    dtype_ok,
    positive,
    reg,
    register,
    smem,
    sms_of,
    task,
)


def _validate(p: dict[str, Any]) -> dict[str, Any]:
    p = check_keys("gemm", p, ("M", "N", "K"), {"dtype": "fp16"})
    positive(M=p["M"], N=p["N"], K=p["K"])
    dtype_ok(p["dtype"])
    if p["K"] % 8:
        raise ShapeError(f"gemm: K={p['K']} must be a multiple of 8 (16-byte TMA rows of A and B in fp16); pad K")
    arguments.size("gemm", cdiv(p["M"], WG_ROWS) * cdiv(p["N"], 64), "M·N", 12 * cdiv(p["K"], 64), "K")
    return p


SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
MIN_SPLIT_TRIPS = 4  # K steps per split at least: below, the pipeline fill and the partial traffic dominate
MAX_UNITS = 320  # CTAs a split tiling may launch: past about one wave of the largest GPU table (MI300X: 304 CUs),
# dividing K further cannot fill more SMs, it only adds partial tiles
DEPTHS = (2, 3, 4, 5)  # ring depths searched; the winner's ring is then deepened where that pays (hw.deep_ring_max)
SPLIT_DEPTHS = (3, 4)  # ring depths searched with split-K (short loops: 2 starves, 5 buys nothing; keeps the
# space, and the search time, about 3x the unsplit one at most)


def _tilings(p: dict[str, Any]) -> Iterator[dict[str, int]]:
    for groups in (1, 2):
        for rows in (64, 128):
            for bn in (64, 128, 192, 256):
                for bk in (64,):
                    tiles, kt = cdiv(p["M"], rows * groups) * cdiv(p["N"], bn), cdiv(p["K"], bk)
                    for splits in SPLITS:
                        if splits > 1 and (kt < MIN_SPLIT_TRIPS * splits or tiles * splits > MAX_UNITS):
                            continue
                        for depth in DEPTHS if splits == 1 else SPLIT_DEPTHS:
                            t = {"BM": rows * groups, "BN": bn, "BK": bk, "depth": depth, "groups": groups}
                            yield t | {"splits": splits}
                            if groups == 1 and splits == 1 and tiles > 1:  # two warpgroups, a tile each
                                yield t | {"splits": 1, "pingpong": 1}
                            if splits == 1 and p["N"] % 8 == 0:  # staged through shared memory, stored by TMA
                                yield t | {"splits": 1, "tma_store": 1}
                                if groups == 1 and tiles > 1:
                                    yield t | {"splits": 1, "pingpong": 1, "tma_store": 1}
                            if splits == 1 and cdiv(p["M"], rows * groups) > 1:  # M-neighbours share B
                                yield t | {"splits": 1, "cluster": 2}
                                if groups == 1 and tiles > 1:
                                    yield t | {"splits": 1, "pingpong": 1, "cluster": 2}


def store_task(tiling: dict[str, int]) -> str:
    """The name (without ``@g``) of a tiling's store task: ``store_tma`` with the TMA-store epilogue, else ``store``;
    the graph's and the code generator's plans use it."""
    return "store_tma" if int(tiling.get("tma_store", 0)) else "store"


def _structure(p: dict[str, Any], t: dict[str, int]) -> tuple[int, int, int]:
    """The kernel structure a tiling asks for, checked: (pingpong, cluster, tma_store). Each key stays in ``t`` only
    when set, so the graphs of the plain cooperative kernel keep the tiling (and the names) they had before it."""
    BN, W, S = t["BN"], t["groups"], t.get("splits", 1)
    pp = t.pop("pingpong", 0)  # kept in the graph's tiling only when set (cooperative graphs stay as they were)
    if pp not in (0, 1) or isinstance(pp, bool):
        raise ShapeError(f"gemm tiling: pingpong={pp!r} must be 0 (cooperative) or 1 (ping-pong)")
    if pp and (W != 1 or S != 1):
        raise ShapeError(f"gemm tiling: pingpong=1 gives each of two warpgroups its own tile: it takes groups=1 "
                         f"(the warpgroups of one tile) and splits=1, got groups={W}, splits={S}")
    if pp:
        t["pingpong"] = 1
    cl = t.pop("cluster", 1)
    if cl not in (1, 2) or isinstance(cl, bool):
        raise ShapeError(f"gemm tiling: cluster={cl!r} must be 1 (no cluster) or 2 (M-neighbour tiles share B)")
    if cl > 1 and S != 1:
        raise ShapeError(f"gemm tiling: cluster={cl} multicasts B to M-neighbour output tiles; split-K units "
                         f"(splits={S}) are not paired that way: use splits=1 or cluster=1")
    if cl > 1:
        t["cluster"] = cl
    ts = t.pop("tma_store", 0)
    if ts not in (0, 1) or isinstance(ts, bool):
        raise ShapeError(f"gemm tiling: tma_store={ts!r} must be 0 (store from registers) or 1 (stage the tile in "
                         "shared memory, store it by TMA)")
    if ts and (S != 1 or p["N"] % 8 or BN % STAGE_COLS):
        raise ShapeError(f"gemm tiling: tma_store=1 stores whole {STAGE_COLS}-column chunks of C through a tensor map: "
                         f"it takes splits=1 (got {S}), N a multiple of 8 (its 16-byte row pitch; got N={p['N']}) and "
                         f"BN a multiple of {STAGE_COLS} (got {BN})")
    if ts:
        t["tma_store"] = 1
    return pp, cl, ts


def _build(p: dict[str, Any], t: dict[str, int], hw: Hardware | None = None) -> STaskGraph:
    M, N, K, dt = p["M"], p["N"], p["K"], p["dtype"]
    BM, BN, BK, D, W, S = t["BM"], t["BN"], t["BK"], t["depth"], t["groups"], t.get("splits", 1)
    positive(BM=BM, BN=BN, BK=BK, depth=D, groups=W, splits=S)
    pp, cl, ts = _structure(p, t)
    rows = BM // W
    if BM % W or rows % WG_ROWS:
        raise ShapeError(f"gemm tiling: BM={BM} over {W} warpgroups must give rows that are a multiple of {WG_ROWS}")
    if BK % MMA_K or BN % 8 or BN > 256:
        raise ShapeError(f"gemm tiling: BK={BK} must be a multiple of {MMA_K}, BN={BN} a multiple of 8 up to 256")
    trip = cdiv(K, BK)
    if S > trip:
        raise ShapeError(f"gemm tiling: splits={S} exceeds the {trip} K steps of BK={BK}; use splits <= {trip}")
    e = DTYPE_BYTES[dt]
    tm, tn = cdiv(M, BM), cdiv(N, BN)
    tm_units = cdiv(tm, cl) * cl  # a cluster's CTAs come in M-pairs: an odd last M tile gets an empty partner
    # the SMs' concurrent CTAs form about a square of the grid: each A/B tile is reread that often from L2
    side = math.isqrt(sms_of(hw) * (2 if pp else 1))
    off = K * e % 32 != 0  # A's and B's rows (K-major) start off the L2's 32-byte sectors: bench study gemm_heldout
    tasks = [
        task("load_a", "load", tile=(BM, BK), dtype=dt, bytes=a_rows(M, BM) * BK * e, reuse=min(tn, side),
             is_async=True, misaligned=off,
             allocs=(smem("a", BM * BK * e),)),
        task("load_b", "load", tile=(BK, BN), dtype=dt, bytes=BK * BN * e, reuse=min(tm, side), is_async=True,
             multicast=cl, misaligned=off, allocs=(smem("b", BK * BN * e),)),
    ]
    edges = []
    stage = stage_bytes(rows, BN, dt) * (2 if pp else 1)  # a ping-pong graph's warpgroup stands for two
    st = store_task(t)
    for g in range(W):
        s = f"@{g}"
        tasks += [
            task("zero" + s, "vector", phase="pre", tile=(rows, BN), dtype="fp32", flops=rows * BN, group=g,
                 allocs=(reg("acc" + s, rows * BN * 4),) + ((smem("cs" + s, stage),) if ts else ())),
            task("mma" + s, "mma", tile=(rows, BN, BK), dtype=dt, flops=2 * rows * BN * BK, is_async=True, group=g,
                 reads=("a", "b", "acc" + s), frees=("a", "b")),
            task("epilogue" + s, "vector", phase="post", tile=(rows, BN), dtype=dt, flops=2 * rows * BN, group=g,
                 reads=("acc" + s,), allocs=() if pp or ts else (smem("c" + s, rows * BN * e),)),
            task(st + s, "store", phase="post", tile=(rows, BN), dtype=dt,
                 bytes=rows * BN * e, is_async=True, group=g, staged=bool(ts),
                 reads=("acc" + s, "cs" + s) if ts else ("acc" + s,) if pp else ("c" + s,)),
        ]
        edges += [Edge("zero" + s, "mma" + s), Edge("load_a", "mma" + s), Edge("load_b", "mma" + s),
                  Edge("mma" + s, "mma" + s, 1), Edge("epilogue" + s, st + s)]
        if S == 1:
            edges.append(Edge("mma" + s, "epilogue" + s))
            continue
        # split-K: this split's fp32 partial goes out (rows < M only), and on average one partial comes back (the
        # last of S splits reads all S, in split order); the traffic is charged at the DRAM share, although the
        # partials mostly stay in L2
        live = min(rows, max(1, M - g * rows))
        tasks.append(task("partial" + s, "store", phase="post", tile=(rows, BN), dtype="fp32",
                          bytes=2 * live * BN * 4, is_async=False, group=g, reads=("acc" + s,)))
        edges += [Edge("mma" + s, "partial" + s), Edge("partial" + s, "epilogue" + s)]
    return STaskGraph(name=f"gemm_{M}x{N}x{K}_{dt}" + (f"_split{S}" if S > 1 else "") + ("_pingpong" if pp else "")
                      + (f"_cluster{cl}" if cl > 1 else "") + ("_tmastore" if ts else ""),
                      op="gemm", params=dict(p),
                      tiling=dict(t), tasks=tuple(tasks), edges=tuple(edges), row=split_trips(trip, S),
                      rows=tm_units * tn, useful_flops=2 * M * N * K)


def textbook(params: dict[str, Any], tiling: dict[str, int], overlap: bool) -> TextbookPlan:
    """The textbook order (codegen.plan.default_plan): the producer loads A and B, each warpgroup zeroes, runs its
    mma and stores; split-K meets in the workspace before the epilogue. ``overlap`` changes nothing here."""
    wgs = range(int(tiling["groups"]))
    pre: dict[str, list[tuple[str, int]]] = {f"wg{g}": [(f"zero@{g}", 0)] for g in wgs}
    loop: dict[str, list[tuple[str, int]]] = {"producer": [("load_a", 0), ("load_b", 0)]}
    loop |= {f"wg{g}": [(f"mma@{g}", 0)] for g in wgs}
    split = [("partial@{g}", 0)] if int(tiling.get("splits", 1)) > 1 else []  # split-K meets before the epilogue
    post = {f"wg{g}": [(n.format(g=g), st) for n, st in split] + [(f"epilogue@{g}", 0),
                                                                   (f"{store_task(tiling)}@{g}", 0)]
            for g in wgs}
    return TextbookPlan({"pre": pre, "loop": loop, "post": post}, [f"mma@{g}" for g in wgs])


register("gemm", OpSpec(
    _validate, _tilings, _build,
    out_tile=lambda t: (t["BM"], t["BN"]),
    from_out_tile=lambda p, o: {"BM": o[0], "BN": o[1]},
    optional={"splits": 1, "pingpong": 0, "cluster": 1, "tma_store": 0},
    opt_in=("cluster",),
    persistent=1,  # persistent CTAs unless told otherwise (a split-K tiling launches a grid)
    plan=textbook,
))
