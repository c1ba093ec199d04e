"""Mamba2 SSD ChunkState, per (batch, chunk, head): states = Σ_k B[k]ᵀ · (x[k] · exp(dA[last] − dA[k]) · dt[k]),
a d_state × head_dim tile; the loop runs over BK-position blocks: load_b, load_x, load_dA, load_dt, scale, mma.
Its parameters are Mamba2's (ptsolve.ops.mamba2).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import ShapeError
from ..hw import Hardware
from ..ir import Edge, STaskGraph
from .base import MMA_K, WG_ROWS, OpSpec, TextbookPlan, cdiv, reg, register, smem, task
from .mamba2 import KEYS, E, validate


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


register("mamba2_chunk_state", OpSpec(
    validate, _state_tilings, _state_build, aliases=("chunk_state",), plan=_state_textbook,
    out_tile=lambda t: (t["BM"],), from_out_tile=lambda p, o: {"BM": o[0]}, optional={"ctas": 1}))
