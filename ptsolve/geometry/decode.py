"""Split-KV attention's work decomposition (ptsolve.ops.decode builds its graphs from it, codegen.cuda.decode its
work and merge tables): how the GQA group's heads and query positions pack into query tiles, which key blocks each
tile visits, how the longest tile's keys split into pieces and which merge CTAs combine them. Pure functions of the
operator's parameters ``p`` and tile sizes, so the model and the kernel follow one rule."""
from __future__ import annotations

from typing import Any

from ..tiling import cdiv


def packing(p: dict[str, Any], BM: int) -> tuple[int, int]:
    """(gbox, sbox): heads of the GQA group and query positions one BM-row tile packs (row r = head r % gbox at
    position r // gbox); gbox * sbox <= BM rows are used."""
    G = p["heads"] // p["kv_heads"]
    gbox = min(G, BM)
    return gbox, min(p["seq_q"], BM // gbox)


def query_tiles(p: dict[str, Any], BM: int) -> int:
    """Query tiles of one (batch, kv head): tile q covers heads (q % ngt)·gbox.. and positions (q // ngt)·sbox.."""
    gbox, sbox = packing(p, BM)
    return cdiv(p["heads"] // p["kv_heads"], gbox) * cdiv(p["seq_q"], sbox)


def trip_counts(p: dict[str, Any], BM: int, BN: int) -> list[int]:
    """Key blocks each query tile of one (batch, kv head) visits (causal: up to its last position's diagonal)."""
    gbox, sbox = packing(p, BM)
    ngt = cdiv(p["heads"] // p["kv_heads"], gbox)
    full = cdiv(p["seq_kv"], BN)
    off = p["seq_kv"] - p["seq_q"]
    out = []
    for q in range(query_tiles(p, BM)):
        last = min(p["seq_q"], (q // ngt + 1) * sbox) - 1  # the tile's last query position
        out.append(min(full, cdiv(last + off + 1, BN)) if p["causal"] else full)
    return out


def piece_blocks(p: dict[str, Any], BM: int, BN: int, splits: int) -> int:
    """Key blocks of the longest piece: ceil(T_max / splits)."""
    return cdiv(max(trip_counts(p, BM, BN)), splits)


def pieces(p: dict[str, Any], BM: int, BN: int, splits: int) -> list[tuple[int, int, int, int, int]]:
    """The CTAs of one (batch, kv head), in launch order (longest first): (query tile, first key block, key blocks,
    pieces of that tile, piece index). A tile of T blocks gets ceil(T / piece_blocks) pieces, as even as whole
    blocks allow. The one rule the graph (trip counts) and the kernel (its work table; the shape-generic kernel
    computes the same split from ``piece_blocks``, ``codegen.cuda.decode``) share."""
    trips = trip_counts(p, BM, BN)
    chunk = piece_blocks(p, BM, BN, splits)
    out = []
    for q, T in enumerate(trips):
        n = cdiv(T, chunk)
        out += [(q, k * T // n, (k + 1) * T // n - k * T // n, n, k) for k in range(n)]
    return sorted(out, key=lambda x: (-x[2], x[0], x[4]))


def length_pieces(p: dict[str, Any], BM: int, BN: int, splits: int, seqlen: int
                  ) -> list[tuple[int, int, int, int, int]]:
    """``pieces`` of a (batch, kv head) whose sequence attends to the first ``seqlen`` keys of a cache of
    ``p["seq_kv"]`` (a KV cache's per-sequence length, read by the kernel on the device: ``seqlens``), clamped to
    0 .. seq_kv. The launch's ``splits`` were chosen for the whole cache, the length is not known on the host: a
    tile of T blocks gets min(splits, T) pieces (at least one block each, the launch's parallelism kept for short
    sequences), and a tile that sees no key one piece of one block, all masked (zeros)."""
    out = []
    # a tile that sees no key has <= 0 trips here (the kernel's C division rounds toward zero): one masked block
    for qt, T in enumerate(trip_counts(dict(p, seq_kv=min(max(seqlen, 0), p["seq_kv"])), BM, BN)):
        T = max(T, 1)
        n = min(splits, T)
        out += [(qt, k * T // n, (k + 1) * T // n - k * T // n, n, k) for k in range(n)]
    return sorted(out, key=lambda x: (-x[2], x[0], x[4]))


MERGE_PIECES = 8  # pieces one thread of a merge CTA merges at most, their loads in flight together


def merge_rows(D: int, splits: int, threads: int) -> int:
    """Query rows one merge CTA of ``threads`` threads merges: the CTA's threads form threads / (D / 4) groups (one
    float4 of the row each), a row's pieces are shared by ceil(splits / MERGE_PIECES) groups, the rest merge
    other rows."""
    groups = threads // (D // 4)
    return max(1, groups // min(groups, cdiv(splits, MERGE_PIECES)))


def tile_rows(p: dict[str, Any], BM: int, q: int) -> int:
    """Rows of query tile ``q`` that hold a query (a prefix of the tile: with several head tiles a tile packs one
    position, else every head of the group)."""
    gbox, sbox = packing(p, BM)
    ngt = cdiv(p["heads"] // p["kv_heads"], gbox)
    return min(gbox, p["heads"] // p["kv_heads"] - (q % ngt) * gbox) * min(sbox, p["seq_q"] - (q // ngt) * sbox)


def merge_units(p: dict[str, Any], BM: int, BN: int, splits: int, threads: int,
                sms: int) -> list[tuple[int, int, int, int]]:
    """The merge CTAs of one (batch, kv head): (query tile, first row, rows, merge CTAs of that tile), for every tile
    of more than one piece. A merge CTA merges ``merge_rows`` rows at a time, as many times as it takes to keep the
    kernel's merge CTAs fewer than ``sms`` (each takes an SM's slot, waits and is short: more of them than SMs would
    queue behind each other, and with fewer a piece always finds an SM, see the module doc). The one rule the graph
    (the merge's cost) and the kernel (its merge table) share."""
    n = {q: ns for q, _, _, ns, _ in pieces(p, BM, BN, splits)}
    need = {q: (merge_rows(p["head_dim"], n[q], threads), tile_rows(p, BM, q)) for q in sorted(n) if n[q] > 1}
    if not need:
        return []
    most = max(cdiv(rows, R) for R, rows in need.values())  # rounds of the tile that takes the most
    k = next((k for k in range(1, most + 1) if p["batch"] * p["kv_heads"] * sum(
        cdiv(rows, k * R) for R, rows in need.values()) < sms), most)
    out = []
    for q, (R, rows) in need.items():
        out += [(q, r0, min(k * R, rows - r0), cdiv(rows, k * R)) for r0 in range(0, rows, k * R)]
    return out


def merge_grid(p: dict[str, Any], BM: int, BN: int, splits: int, threads: int, sms: int) -> tuple[int, int]:
    """The shape-generic kernel's merge CTAs (``codegen.cuda.decode``): (rows each merges, merge CTAs per query
    tile), the same for every tile: ``merge_units``' rule (a CTA merges ``merge_rows`` rows at a time, as many
    rounds as keep the kernel's merge CTAs fewer than ``sms``) applied to the longest tile's pieces and the most
    rows of a tile. (0, 0) where no tile has several pieces."""
    trips = trip_counts(p, BM, BN)
    chunk = piece_blocks(p, BM, BN, splits)
    if max(cdiv(T, chunk) for T in trips) <= 1:
        return 0, 0
    R = merge_rows(p["head_dim"], splits, threads)
    rows = max(tile_rows(p, BM, q) for q in range(len(trips)))
    tiles = p["batch"] * p["kv_heads"] * len(trips)
    k = next((k for k in range(1, cdiv(rows, R) + 1) if tiles * cdiv(rows, k * R) < sms), cdiv(rows, R))
    return k * R, cdiv(rows, k * R)
