"""Mamba2 SSD ChunkScan, per (batch, chunk, head) and BM positions of the chunk:
  out[m] = Σ_{k≤m} CB[m,k] · exp(dA[m] − dA[k]) · dt[k] · x[k]  +  exp(dA[m]) · (C[m] · states)
The loop runs over BK-position blocks k ≤ m (causal inside the chunk): load_cb, load_dA, load_dt,
decay (exp on the CUDA cores and MUFU), load_x, mma. The state contribution C·states is the prologue.
Its parameters are Mamba2's (ptsolve.ops.mamba2), plus an optional ``epilogue`` (``EPILOGUES``): mamba_ssm's D skip
and z gate fused into the store, out = (out + D·x)·silu(z), which reads x (and z) once more per output tile; and an
optional ``cb_dtype`` (``ptsolve.geometry.mamba2``): "fp32" reads CB as float32, twice the CB tile's bytes and
shared memory, so that the decayed P is the only rounding; the input dtype (or its absence) reads CB as it is.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import ShapeError
from ..geometry.mamba2 import CB_FP32, EPILOGUES, cb_box_cols, cb_bytes
from ..hw import Hardware
from ..ir import Edge, STaskGraph
from .base import MMA_K, WG_ROWS, OpSpec, TextbookPlan, cdiv, reg, register, smem, task
from .mamba2 import KEYS, E, validate


def _scan_validate(p: dict[str, Any]) -> dict[str, Any]:
    """Mamba2's parameters (``validate``) and ChunkScan's optional ``epilogue`` and ``cb_dtype``, each kept only when
    it changes the kernel (an epilogue asked; CB in float32)."""
    ep, cbd = p.pop("epilogue", ""), p.pop("cb_dtype", None)
    if ep and ep not in EPILOGUES:
        raise ShapeError(f"mamba2_chunk_scan: epilogue={ep!r} must be one of {EPILOGUES} (or absent)")
    p = validate(p)
    if cbd not in (None, CB_FP32, p["dtype"]):
        raise ShapeError(f"mamba2_chunk_scan: cb_dtype={cbd!r} must be {CB_FP32!r} (CB read as float32) or the input "
                         f"dtype {p['dtype']!r} (or absent: the input dtype)")
    return p | ({"epilogue": ep} if ep else {}) | ({"cb_dtype": CB_FP32} if cbd == CB_FP32 else {})


def _store_bytes(p: dict[str, Any], rows: int) -> int:
    """The store task's bytes: the output tile, and the x (D skip) and z tiles a fused epilogue reads."""
    ep = p.get("epilogue", "")
    return rows * p["head_dim"] * E * (1 + ("D" in ep) + ("z" in ep))


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
    cb_tile = BM * max(BK, cb_box_cols(p)) * cb_bytes(p)
    tasks = [
        task("load_c", "load", phase="pre", tile=(BM, N), bytes=BM * N * E, reuse=share, is_async=True,
             allocs=(smem("c", BM * N * E),)),
        task("load_states", "load", phase="pre", tile=(N, P), bytes=N * P * E, is_async=True,
             allocs=(smem("states", N * P * E),)),
        task("load_dacs", "load", phase="pre", tile=(BM,), dtype="fp32", bytes=BM * 4, is_async=True,
             allocs=(smem("dacs", BM * 4),)),
        # CB comes in 128-byte swizzled boxes (64 columns of fp16/bf16, 32 of float32) whatever BK: that many bytes
        # move and sit in the slot (the task's dtype is the element's width, "fp16" for either 16-bit type as above)
        task("load_cb", "load", tile=(BM, BK), dtype="fp32" if cb_bytes(p) == 4 else "fp16", bytes=cb_tile,
             reuse=share, is_async=True, allocs=(smem("cb", cb_tile),)),
        task("load_dA", "load", tile=(BK,), dtype="fp32", bytes=BK * 4, is_async=True, allocs=(smem("da", BK * 4),)),
        task("load_dt", "load", tile=(BK,), dtype="fp32", bytes=BK * 4, is_async=True, allocs=(smem("dt", BK * 4),)),
        task("load_x", "load", tile=(BK, P), bytes=BK * P * E, is_async=True, allocs=(smem("x", BK * P * E),)),
    ]
    edges = []
    for g in range(W):
        s = f"@{g}"
        tasks += [
            # decay's float32 working set (the W values before packing): BK/4 + 8 registers a thread beyond the
            # buffers and the table's reg_overhead, as ptxas's demand shows (codegen.regfit, bench study regfit)
            task("mma_state" + s, "mma", phase="pre", tile=(rows, P, N), flops=2 * rows * N * P, is_async=True,
                 group=g, reads=("c", "states"),
                 allocs=(reg("acc" + s, rows * P * 4), reg("tmp" + s, (BK // 4 + 8) * 4 * 128))),
            task("scale_state" + s, "vector", phase="pre", tile=(rows, P), dtype="fp32", flops=rows * P, sfu=rows,
                 group=g, reads=("acc" + s, "dacs")),
            task("decay" + s, "vector", tile=(rows, BK), dtype="fp32", flops=4 * rows * BK, sfu=rows * BK, group=g,
                 reads=("cb", "da", "dt", "dacs"), frees=("cb", "da", "dt"), allocs=(reg("w" + s, rows * BK * E),)),
            task("mma" + s, "mma", tile=(rows, P, BK), flops=2 * rows * BK * P, is_async=True, group=g,
                 reads=("w" + s, "x", "acc" + s), frees=("w" + s, "x")),
            task("store" + s, "store", phase="post", tile=(rows, P), bytes=_store_bytes(p, rows), is_async=True,
                 group=g, reads=("acc" + s,)),
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


register("mamba2_chunk_scan", OpSpec(
    _scan_validate, _scan_tilings, _scan_build, aliases=("chunk_scan",), plan=_scan_textbook,
    out_tile=lambda t: (t["BM"],), from_out_tile=lambda p, o: {"BM": o[0]}, optional={"ctas": 1}))
