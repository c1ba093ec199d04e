"""GEMM's work decomposition (ptsolve.ops.gemm builds its graphs from it, codegen.cuda.gemm its tensor maps, grid
and epilogue): A's box rows for small M, the split-K ranges and reduce CTAs, the TMA-store staging. Pure functions
of the shape and tiling, so the model and the kernel follow one rule."""
from __future__ import annotations

from ..ir import DTYPE_BYTES
from ..tiling import cdiv

STAGE_COLS = 64  # columns of one staged chunk of the TMA-store epilogue: a 128-byte swizzled row of fp16/bf16
STAGE_SLOTS = 2  # chunks a warpgroup stages at once: it fills one while the copy engine reads the other


def a_rows(M: int, BM: int) -> int:
    """Rows of A's TMA box for a BM-row tile: all BM, or where M is smaller only M rounded up to 8 (one 128-byte
    swizzle atom). A box mostly past M is filled with zeros by the copy engine, and that fill is slow: a 1-row GEMM
    ran 18% slower than a 32-row one with the same 64-row box (bench study gemm_skinny, small_m.py). The rows past the
    box keep stale shared memory; wgmma's output row i reads A's row i only, and rows past M are never stored. The
    one rule the model's load bytes and the code generator's tensor map use."""
    return min(BM, -(-M // 8) * 8)


def reduce_ctas(M: int, N: int, t: dict[str, int], threads: int, sms: int) -> int:
    """Reduce CTAs per output tile of a split-K tiling: one float4 of the tile per thread (BM × BN / 4 / ``threads``),
    fewer where that would make the kernel's reduce CTAs as many as ``sms`` (each waits on an SM for its tile's
    splits; with fewer than SMs a split always finds an SM whatever order the CTAs are dispatched in), at least one.
    The one rule the code generator's grid and reduce loop use."""
    tiles = cdiv(M, t["BM"]) * cdiv(N, t["BN"])
    return max(1, min(cdiv(t["BM"] * t["BN"] // 4, threads), (sms - 1) // tiles))


def split_trips(kt: int, splits: int) -> tuple[int, ...]:
    """K steps of each split when ``kt`` steps are divided into ``splits`` contiguous ranges: split s runs steps
    [s·kt // splits, (s+1)·kt // splits) (the code generator's formula too), so each range has at least one step
    when splits <= kt."""
    return tuple((s + 1) * kt // splits - s * kt // splits for s in range(splits))


def stage_bytes(rows: int, BN: int, dtype: str) -> int:
    """Shared memory of one kernel warpgroup's TMA-store staging (tiling key ``tma_store``), bytes: STAGE_SLOTS
    chunks of ``rows`` × STAGE_COLS elements, fewer where the tile has fewer chunks. The one rule the model's ``cs@g``
    buffer and the code generator's chunk loop use."""
    return min(STAGE_SLOTS, BN // STAGE_COLS) * rows * STAGE_COLS * DTYPE_BYTES[dtype]
