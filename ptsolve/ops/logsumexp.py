"""Row-wise log-sum-exp, the reduction under cross-entropy and softmax: lse[r] = log Σ_c exp(x[r, c]) of an fp16/bf16
``rows × cols`` matrix (row-major, contiguous), fp32 out.

The worked example of ARCHITECTURE.md's "Adding an operator": no tensor-core task. A CTA owns BM rows; its loop runs
over BK-column blocks: ``load_x`` (one TMA tile, BM × BK) and, per consumer warpgroup g, ``reduce@g`` folding its
BM/groups rows of the tile into a running (max, sum) per row in registers (the online log-sum-exp); ``init@g`` sets
them before the loop, ``store@g`` combines them across threads and writes max + log(sum) after it. Task bodies:
codegen.cuda.logsumexp.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import arguments
from ..errors import ShapeError
from ..hw import Hardware
from ..ir import Edge, STaskGraph
from .base import Operator, OpSpec, TextbookPlan, cdiv, check_keys, dtype_ok, make, positive, reg, register, smem, task

E = 2  # bytes of an fp16/bf16 element
VEC = 8  # elements of one 16-byte vector: what a thread reads from shared memory at a time
WG_THREADS = 128
RING_BYTES = 192 * 1024  # the ring of x tiles leaves room for the barriers within one SM's shared memory


def validate(p: dict[str, Any]) -> dict[str, Any]:
    """``rows``, ``cols`` (elements) and ``dtype`` checked; cols a multiple of 8 (a row is whole 16-byte vectors,
    which the TMA's row stride needs)."""
    p = check_keys("logsumexp", p, ("rows", "cols"), {"dtype": "fp16"})
    dtype_ok(p["dtype"])
    positive(rows=p["rows"], cols=p["cols"])
    if p["cols"] % VEC:
        raise ShapeError(f"logsumexp: cols={p['cols']} must be a multiple of {VEC} (rows of whole 16-byte vectors)")
    if p["rows"] >= 1 << 31 or p["cols"] >= 1 << 31:
        raise ShapeError("logsumexp: rows and cols must stay below 2^31 (the TMA's 32-bit coordinates)")
    arguments.size("logsumexp", cdiv(p["rows"], 64), "rows", cdiv(p["cols"], 64), "cols")
    return p


def _tilings(p: dict[str, Any]) -> Iterator[dict[str, int]]:
    # a warpgroup owns 64 or 128 rows of the tile; a row block of BK columns is 8..32 threads' 16-byte vectors,
    # so the threads sharing a row sit in one warp (their partial sums combine by shuffles)
    for groups in (1, 2):
        for bm in (64, 128, 256):
            for bk in (64, 128, 256):
                for depth in (2, 3, 4):
                    for ctas in (1, 2):
                        rows = bm // groups
                        if (rows in (64, 128) and bk <= max(64, p["cols"]) and bm <= max(64, 2 * p["rows"])
                                and ctas * depth * bm * bk * E <= RING_BYTES):
                            yield {"BM": bm, "BK": bk, "depth": depth, "groups": groups, "ctas": ctas}


def _build(p: dict[str, Any], t: dict[str, int], hw: Hardware | None = None) -> STaskGraph:
    R, C = p["rows"], p["cols"]
    BM, BK, W = t["BM"], t["BK"], t["groups"]
    rows = BM // W
    if BM % W or rows not in (64, 128) or BK % 64 or BK > 256:
        raise ShapeError(f"logsumexp tiling: BM={BM} over {W} warpgroups must give 64 or 128 rows each; BK={BK} a "
                         "multiple of 64 up to 256")
    # (max, sum) of every (row, 16-byte column vector) a thread folds: two fp32 per row and vector
    partials = rows * (BK // VEC) * 2 * 4
    tasks = [task("load_x", "load", tile=(BM, BK), bytes=BM * BK * E, is_async=True, allocs=(smem("x", BM * BK * E),))]
    edges = []
    for g in range(W):
        s = f"@{g}"
        tasks += [
            task("init" + s, "vector", phase="pre", tile=(rows,), dtype="fp32", flops=rows, group=g,
                 allocs=(reg("ms" + s, partials),)),
            # per element: a max, a subtract-multiply, an exp2 and an add; per vector one rescale exp2
            task("reduce" + s, "vector", tile=(rows, BK), dtype="fp32", flops=4 * rows * BK,
                 sfu=rows * BK + rows * BK // VEC, group=g, reads=("x", "ms" + s), frees=("x",)),
            task("store" + s, "store", phase="post", tile=(rows,), dtype="fp32", bytes=rows * 4, group=g,
                 reads=("ms" + s,)),
        ]
        edges += [Edge("init" + s, "reduce" + s), Edge("load_x", "reduce" + s), Edge("reduce" + s, "reduce" + s, 1),
                  Edge("reduce" + s, "store" + s)]
    return STaskGraph(name=f"logsumexp_r{R}_c{C}", op="logsumexp", params=dict(p), tiling=dict(t), tasks=tuple(tasks),
                      edges=tuple(edges), row=(cdiv(C, BK),), rows=cdiv(R, BM), useful_flops=2 * R * C)


def _textbook(params: dict[str, Any], tiling: dict[str, int], overlap: bool) -> TextbookPlan:
    """Load, then every warpgroup folds it; with no tensor-core task there is nothing to overlap (``overlap`` is the
    same order) and no turn order."""
    wgs = range(int(tiling["groups"]))
    return TextbookPlan({"pre": {f"wg{g}": [(f"init@{g}", 0)] for g in wgs},
                         "loop": {"producer": [("load_x", 0)]} | {f"wg{g}": [(f"reduce@{g}", 0)] for g in wgs},
                         "post": {f"wg{g}": [(f"store@{g}", 0)] for g in wgs}}, [])


def logsumexp(rows: int, cols: int, dtype: str = "fp16") -> Operator:
    """lse[r] = log Σ_c exp(x[r, c]) of a rows × cols fp16/bf16 matrix (cols a multiple of 8), fp32 out."""
    return make("logsumexp", rows=rows, cols=cols, dtype=dtype)


register("logsumexp", OpSpec(
    validate, _tilings, _build, aliases=("lse",), plan=_textbook, builder=logsumexp,
    out_tile=lambda t: (t["BM"],), from_out_tile=lambda p, o: {"BM": o[0]}, optional={"ctas": 1}))
