"""Mamba2 SSD chunk kernels (the two the paper schedules).

ChunkScan, per (batch, chunk, head) and BM positions of the chunk:
  out[m] = Σ_{k≤m} CB[m,k] · exp(dA[m] − dA[k]) · dt[k] · x[k]  +  exp(dA[m]) · (C[m] · states)
The loop runs over BK-position blocks k ≤ m (causal inside the chunk): load_cb, load_dA, load_dt,
decay (exp on the CUDA cores and MUFU), load_x, mma. The state contribution C·states is the prologue.

ChunkState, per (batch, chunk, head): states = Σ_k B[k]ᵀ · (x[k] · exp(dA[last] − dA[k]) · dt[k]),
a d_state × head_dim tile; the loop runs over BK-position blocks: load_b, load_x, load_dA, load_dt,
scale, mma.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import arguments
from ..errors import ShapeError
from ..hw import Hardware
from ..ir import Edge, STaskGraph
from .base import MMA_K, WG_ROWS, OpSpec, TextbookPlan, cdiv, check_keys, dtype_ok, positive, reg, register, smem, task

KEYS = ("batch", "seq", "heads", "head_dim", "d_state", "chunk", "groups")
E = 2  # fp16/bf16 activations; dA cumsum and dt are fp32


def _validate(p: dict[str, Any]) -> dict[str, Any]:
    p = check_keys("mamba2", p, KEYS[:-1], {"groups": 1, "dtype": "fp16"})
    dtype_ok(p["dtype"])  # fp16 and bf16 move the same bytes: the model does not depend on which
    positive(**{k: p[k] for k in KEYS})
    if p["heads"] % p["groups"]:
        raise ShapeError(f"mamba2: heads={p['heads']} is not divisible by groups={p['groups']}")
    for k in ("head_dim", "d_state", "chunk"):
        if p[k] % 16:
            raise ShapeError(f"mamba2: {k}={p[k]} must be a multiple of 16 for the tensor cores")
    if p["chunk"] < 64:
        raise ShapeError(f"mamba2: chunk={p['chunk']} must be at least 64")
    blocks = max(cdiv(p["chunk"], WG_ROWS), cdiv(p["d_state"], WG_ROWS))  # CTAs per (batch, chunk, head), at most
    T = cdiv(p["chunk"], 32)
    arguments.size("mamba2", p["batch"] * cdiv(p["seq"], p["chunk"]) * p["heads"] * blocks,
                "batch·seq·heads (and chunk or d_state)", 20 * T * T, "chunk")
    return p


def _scan_tilings(p: dict[str, Any]) -> Iterator[dict[str, int]]:
    # one 64-row wgmma block per consumer warpgroup, and up to 3 resident CTAs per SM with one warpgroup (two
    # warpgroups in a share of the register file spill): the tilings codegen.cuda.chunk_scan emits
    for groups in (1, 2):
        bm = WG_ROWS * groups
        for bk in (32, 64, 128):
            for depth in (2, 3):
                for ctas in ((1, 2, 3) if groups == 1 else (1,)):
                    if bm <= p["chunk"] and bk <= p["chunk"] and p["chunk"] % bm == 0 and p["chunk"] % bk == 0:
                        yield {"BM": bm, "BK": bk, "depth": depth, "groups": groups, "ctas": ctas}


def _scan_build(p: dict[str, Any], t: dict[str, int], hw: Hardware | None = None) -> STaskGraph:
    B, L, H, P, N, Q, G = (p[k] for k in KEYS)
    BM, BK, W = t["BM"], t["BK"], t["groups"]
    rows = BM // W
    if BM % W or rows % WG_ROWS or BK % MMA_K:
        raise ShapeError(f"chunk_scan tiling: BM={BM}/{W} warpgroups must be a multiple of {WG_ROWS} rows, "
                         f"BK={BK} a multiple of {MMA_K}")
    share = H // G  # heads of a group read the same C, B and CB tiles
    nchunks = cdiv(L, Q)
    mblocks = cdiv(Q, BM)
    trips = [cdiv(min(Q, (i + 1) * BM), BK) for i in range(mblocks)]
    tasks = [
        task("load_c", "load", phase="pre", tile=(BM, N), bytes=BM * N * E, reuse=share, is_async=True,
             allocs=(smem("c", BM * N * E),)),
        task("load_states", "load", phase="pre", tile=(N, P), bytes=N * P * E, is_async=True,
             allocs=(smem("states", N * P * E),)),
        task("load_dacs", "load", phase="pre", tile=(BM,), dtype="fp32", bytes=BM * 4, is_async=True,
             allocs=(smem("dacs", BM * 4),)),
        # CB comes in 64-column (128-byte swizzled) boxes whatever BK: that many bytes move and sit in the slot
        task("load_cb", "load", tile=(BM, BK), bytes=BM * max(BK, 64) * E, reuse=share, is_async=True,
             allocs=(smem("cb", BM * max(BK, 64) * E),)),
        task("load_dA", "load", tile=(BK,), dtype="fp32", bytes=BK * 4, is_async=True, allocs=(smem("da", BK * 4),)),
        task("load_dt", "load", tile=(BK,), dtype="fp32", bytes=BK * 4, is_async=True, allocs=(smem("dt", BK * 4),)),
        task("load_x", "load", tile=(BK, P), bytes=BK * P * E, is_async=True, allocs=(smem("x", BK * P * E),)),
    ]
    edges = []
    for g in range(W):
        s = f"@{g}"
        tasks += [
            # decay's float32 working set (the W values before packing): BK/4 + 8 registers a thread beyond the
            # buffers and the table's reg_overhead, as ptxas's demand shows (codegen.regfit, results/regfit_h100.md)
            task("mma_state" + s, "mma", phase="pre", tile=(rows, P, N), flops=2 * rows * N * P, is_async=True,
                 group=g, reads=("c", "states"),
                 allocs=(reg("acc" + s, rows * P * 4), reg("tmp" + s, (BK // 4 + 8) * 4 * 128))),
            task("scale_state" + s, "vector", phase="pre", tile=(rows, P), dtype="fp32", flops=rows * P, sfu=rows,
                 group=g, reads=("acc" + s, "dacs")),
            task("decay" + s, "vector", tile=(rows, BK), dtype="fp32", flops=4 * rows * BK, sfu=rows * BK, group=g,
                 reads=("cb", "da", "dt", "dacs"), frees=("cb", "da", "dt"), allocs=(reg("w" + s, rows * BK * E),)),
            task("mma" + s, "mma", tile=(rows, P, BK), flops=2 * rows * BK * P, is_async=True, group=g,
                 reads=("w" + s, "x", "acc" + s), frees=("w" + s, "x")),
            task("store" + s, "store", phase="post", tile=(rows, P), bytes=rows * P * E, is_async=True, group=g,
                 reads=("acc" + s,)),
        ]
        edges += [
            Edge("load_c", "mma_state" + s), Edge("load_states", "mma_state" + s),
            Edge("mma_state" + s, "scale_state" + s), Edge("load_dacs", "scale_state" + s),
            Edge("load_cb", "decay" + s), Edge("load_dA", "decay" + s), Edge("load_dt", "decay" + s),
            Edge("load_dacs", "decay" + s), Edge("decay" + s, "mma" + s), Edge("load_x", "mma" + s),
            Edge("scale_state" + s, "mma" + s), Edge("mma" + s, "mma" + s, 1), Edge("mma" + s, "store" + s),
        ]
    flops = B * nchunks * H * (P * Q * (Q + 1) + 2 * Q * N * P)
    return STaskGraph(name=f"chunk_scan_b{B}_l{L}_h{H}_p{P}_n{N}_q{Q}", op="mamba2_chunk_scan", params=dict(p),
                      tiling=dict(t), tasks=tuple(tasks), edges=tuple(edges), row=tuple(trips), rows=B * nchunks * H,
                      useful_flops=flops)


def _state_tilings(p: dict[str, Any]) -> Iterator[dict[str, int]]:
    # ctas: resident CTAs per SM (codegen.cuda.chunk_state builds 1 or 2); the model checks their budgets
    for groups in (1, 2):
        for bm in (64, 128):
            for bk in (32, 64, 128):
                for depth in (2, 3, 4):
                    for ctas in (1, 2):
                        if bm <= p["d_state"] and bk <= p["chunk"] and bm % (WG_ROWS * groups) == 0:
                            yield {"BM": bm, "BK": bk, "depth": depth, "groups": groups, "ctas": ctas}


def _state_build(p: dict[str, Any], t: dict[str, int], hw: Hardware | None = None) -> STaskGraph:
    B, L, H, P, N, Q, G = (p[k] for k in KEYS)
    BM, BK, W = t["BM"], t["BK"], t["groups"]
    rows = BM // W
    if BM % W or rows % WG_ROWS or BK % MMA_K or BM > N:
        raise ShapeError(f"chunk_state tiling: BM={BM} (d_state rows, at most {N}) over {W} warpgroups must give a "
                         f"multiple of {WG_ROWS} rows; BK={BK} a multiple of {MMA_K}")
    share = H // G
    nchunks = cdiv(L, Q)
    trip = cdiv(Q, BK)
    tasks = [
        # the chunk's last dA_cumsum comes as the 16-byte bulk copy that ends on it
        task("load_dalast", "load", phase="pre", tile=(1,), dtype="fp32", bytes=16, is_async=True,
             allocs=(smem("dalast", 16),)),
        task("load_b", "load", tile=(BK, BM), bytes=BK * BM * E, reuse=share, is_async=True,
             allocs=(smem("b", BK * BM * E),)),
        task("load_x", "load", tile=(BK, P), bytes=BK * P * E, is_async=True, allocs=(smem("x", BK * P * E),)),
        task("load_dA", "load", tile=(BK,), dtype="fp32", bytes=BK * 4, is_async=True, allocs=(smem("da", BK * 4),)),
        task("load_dt", "load", tile=(BK,), dtype="fp32", bytes=BK * 4, is_async=True, allocs=(smem("dt", BK * 4),)),
    ]
    edges = []
    for g in range(W):
        s = f"@{g}"
        tasks += [
            task("zero" + s, "vector", phase="pre", tile=(rows, P), dtype="fp32", flops=rows * P, group=g,
                 allocs=(reg("acc" + s, rows * P * 4),)),
            # every warpgroup scales the whole x tile into its own xs (no cross-group barrier); the scale is the
            # last reader of x / dA / dt, so their slot is free when it ends
            task("scale" + s, "vector", tile=(BK, P), dtype="fp32", flops=3 * BK * P // W, sfu=BK // W, group=g,
                 reads=("x", "da", "dt", "dalast"), frees=("x", "da", "dt"), allocs=(smem("xs" + s, BK * P * E),)),
            task("mma" + s, "mma", tile=(rows, P, BK), flops=2 * rows * BK * P, is_async=True, group=g,
                 reads=("b", "xs" + s, "acc" + s), frees=("b", "xs" + s)),
            task("store" + s, "store", phase="post", tile=(rows, P), dtype="fp32", bytes=rows * P * 4, is_async=True,
                 group=g, reads=("acc" + s,)),
        ]
        edges += [
            Edge("zero" + s, "mma" + s), Edge("load_dalast", "scale" + s), Edge("load_x", "scale" + s),
            Edge("load_dA", "scale" + s), Edge("load_dt", "scale" + s), Edge("scale" + s, "mma" + s),
            Edge("load_b", "mma" + s), Edge("mma" + s, "mma" + s, 1), Edge("mma" + s, "store" + s),
        ]
    flops = B * nchunks * H * 2 * Q * N * P
    return STaskGraph(name=f"chunk_state_b{B}_l{L}_h{H}_p{P}_n{N}_q{Q}", op="mamba2_chunk_state", params=dict(p),
                      tiling=dict(t), tasks=tuple(tasks), edges=tuple(edges), row=(trip,) * cdiv(N, BM),
                      rows=B * nchunks * H, useful_flops=flops)


def _scan_textbook(params: dict[str, Any], tiling: dict[str, int], overlap: bool) -> TextbookPlan:
    """ChunkScan's textbook order (codegen.plan.default_plan); ``overlap`` puts the mma one stage behind the decay
    that feeds it, with two copies of the W fragment it hands over."""
    wgs, s = range(int(tiling["groups"])), 1 if overlap else 0
    pre = {"producer": [("load_c", 0), ("load_states", 0), ("load_dacs", 0)]}
    pre |= {f"wg{g}": [(f"mma_state@{g}", 0), (f"scale_state@{g}", 0)] for g in wgs}
    loop = {"producer": [("load_cb", 0), ("load_dA", 0), ("load_dt", 0), ("load_x", 0)]}
    loop |= {f"wg{g}": [(f"mma@{g}", 1), (f"decay@{g}", 0)] if overlap else [(f"decay@{g}", 0), (f"mma@{g}", 0)]
             for g in wgs}
    post = {f"wg{g}": [(f"store@{g}", 0)] for g in wgs}
    return TextbookPlan({"pre": pre, "loop": loop, "post": post}, [f"mma@{g}" for g in wgs],
                        {f"w@{g}": 1 + s for g in wgs})


def _state_textbook(params: dict[str, Any], tiling: dict[str, int], overlap: bool) -> TextbookPlan:
    """ChunkState's textbook order; ``overlap`` puts the mma one stage behind the scale that feeds it, with two
    copies of the scaled x it hands over."""
    wgs, s = range(int(tiling["groups"])), 1 if overlap else 0
    pre = {"producer": [("load_dalast", 0)]} | {f"wg{g}": [(f"zero@{g}", 0)] for g in wgs}
    loop = {"producer": [("load_b", 0), ("load_x", 0), ("load_dA", 0), ("load_dt", 0)]}
    loop |= {f"wg{g}": [(f"mma@{g}", 1), (f"scale@{g}", 0)] if overlap else [(f"scale@{g}", 0), (f"mma@{g}", 0)]
             for g in wgs}
    post = {f"wg{g}": [(f"store@{g}", 0)] for g in wgs}
    return TextbookPlan({"pre": pre, "loop": loop, "post": post}, [f"mma@{g}" for g in wgs],
                        {f"xs@{g}": 1 + s for g in wgs})


register("mamba2_chunk_scan", OpSpec(
    _validate, _scan_tilings, _scan_build, aliases=("chunk_scan",), plan=_scan_textbook,
    out_tile=lambda t: (t["BM"],), from_out_tile=lambda p, o: {"BM": o[0]}, optional={"ctas": 1}))
register("mamba2_chunk_state", OpSpec(
    _validate, _state_tilings, _state_build, aliases=("chunk_state",), plan=_state_textbook,
    out_tile=lambda t: (t["BM"],), from_out_tile=lambda p, o: {"BM": o[0]}, optional={"ctas": 1}))
