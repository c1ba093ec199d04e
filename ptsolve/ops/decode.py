"""Split-KV attention (FlashDecoding): decode against a long KV cache and low-occupancy prefill.

One CTA owns a *query tile* of one (batch, kv head) and one *piece* of its key range. For GQA/MQA the
query tile packs the heads of the kv head's group with the query positions into the wgmma M dimension
(``packing``): row r of a tile is head ``j0 + r % gbox`` of the group at query position ``s0 + r // gbox``,
so decode (seq_q 1-16, 1-71 heads per kv head) fills one 64-row wgmma tile instead of wasting 63 of 64 rows
per head, and every K/V tile is read once for the whole group. The keys a query tile visits (``trip_counts``)
are cut into pieces of at most ``ceil(T_max / splits)`` key blocks (``pieces``); the longest tile gets
``splits`` pieces, shorter (causal) ones fewer, so a batch-1 causal prefill or a few-head decode fills the SMs.

A piece's loop is FlashAttention's (load_k, load_v by the producer; mma_qk, rowmax, exp2, rowsum, rescale,
mma_pv per consumer warpgroup). Its epilogue depends on whether its query tile has more than one piece:
- one piece: ``normalize`` and ``store`` of O (the plain attention epilogue);
- several: ``store`` writes the piece's O / l and its log-sum-exp (fp32, ``partial_bytes``) to a workspace and
  ``combine`` counts it done (a fence and one atomic per warpgroup). The merge itself runs in *merge CTAs*
  (``merge_units``), launched after every piece CTA: each waits for its tile's pieces and merges a few rows
  (``merge_rows``), all of them in parallel, so no single CTA reads back every piece's partial (the last-arriving
  piece used to: the merge of 32 pieces of 64 rows, 512 KB through one SM's L2 port, took ~10 µs on an H200).
  ``out`` stands for the merged O's store by the merge CTA.
The model charges the wait, one merge CTA's read of its rows of every piece and its store to every piece (a merge
CTA starts when the last piece of its tile is done; in a single wave, the low-occupancy shapes split-KV is for, the
kernel ends with it; with several waves that over-charges the pieces that are not last). Where the pieces and the merge
CTAs (``follow``) exceed the SM slots, the merge CTAs queue behind the pieces and the launch pays a tail after them
(ptsolve.program.follow_tail, fitted on measured launches: results/torch_decode/follow_fit.py).
Where every tile is one piece (no merge CTAs) the CTAs may be persistent (tiling ``persistent``): one per SM deals
itself the tiles, its producer loading the next tile's K/V while the consumers finish the last (program.handover).
A merge CTA spins on its tile's counter, so it must not keep the tile's own pieces from running: there are fewer
merge CTAs than SMs (``merge_units``), so whatever order the CTAs are dispatched in an SM is left for the pieces; where
even one merge CTA per tile is more (large batches, which rarely split), they have the highest CTA indices and the
hardware dispatches CTAs in index order.

Causal masking is bottom-right aligned: query position i sees keys <= i + seq_kv - seq_q.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import arguments
from ..errors import ShapeError
from ..hw import Hardware
from ..ir import DTYPE_BYTES, Edge, STaskGraph
from .attention import kept_pairs, qkv_loads, warpgroup_edges, warpgroup_tasks
from .attention import orders as orders_fa3
from .attention import textbook as textbook_fa
from .base import WG_ROWS, OpSpec, TextbookPlan, cdiv, check_keys, dtype_ok, positive, register, sms_of, task

KEYS = ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal", "dtype")
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # candidate pieces of the longest query tile
BNS = (64, 128)
DEPTHS = (2, 3, 4)


def _validate(p: dict[str, Any]) -> dict[str, Any]:
    if "heads" in p:
        p.setdefault("kv_heads", p["heads"])
    p = check_keys("flash_decode", p, ("batch", "heads", "seq_q", "seq_kv"),
                   {"kv_heads": None, "head_dim": 128, "causal": False, "dtype": "fp16"})
    positive(**{k: p[k] for k in KEYS[:6]})
    dtype_ok(p["dtype"])
    if p["heads"] % p["kv_heads"]:
        raise ShapeError(f"flash_decode: heads={p['heads']} is not divisible by kv_heads={p['kv_heads']}; "
                         "each kv head must serve a whole group of query heads")
    if p["head_dim"] not in (64, 128):
        raise ShapeError(f"flash_decode: head_dim={p['head_dim']}; the split-KV kernel supports 64 and 128")
    if not isinstance(p["causal"], bool):
        raise ShapeError(f"flash_decode: causal={p['causal']!r} must be true or false")
    if p["causal"] and p["seq_q"] > p["seq_kv"]:
        raise ShapeError(f"flash_decode: causal with seq_q={p['seq_q']} > seq_kv={p['seq_kv']} leaves query rows "
                         "with no key; use seq_q <= seq_kv")
    T = cdiv(p["seq_kv"], WG_ROWS)
    rows = p["heads"] // p["kv_heads"] * p["seq_q"]  # query rows of one (batch, kv head)
    # simulate replays one CTA per distinct trip count: a query tile's pieces take at most two lengths (as even as
    # whole blocks allow), so at most twice the query tiles' distinct counts of at most T blocks each
    distinct = min(T, 2 * query_tiles(p, WG_ROWS)) if p["causal"] else 2
    arguments.size("flash_decode", p["batch"] * p["kv_heads"] * max(SPLITS) * cdiv(rows, WG_ROWS),
                "batch·kv_heads·seq_q·heads/kv_heads", 30 * T * distinct,
                "seq_kv" + (" (causal)" if p["causal"] else ""))
    return p


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


def split_counts(p: dict[str, Any], BM: int, BN: int) -> list[int]:
    """The distinct piece counts of the longest query tile that SPLITS gives (a count the tile's key blocks cannot
    make, e.g. 64 pieces of 40 blocks, is the count it does make)."""
    tmax = max(trip_counts(p, BM, BN))
    return sorted({cdiv(tmax, cdiv(tmax, s)) for s in SPLITS})


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


def _tilings(p: dict[str, Any]) -> Iterator[dict[str, int]]:
    rows = (p["heads"] // p["kv_heads"]) * p["seq_q"]
    for groups in (1, 2) if rows > WG_ROWS else (1,):  # a second warpgroup only when one tile has > 64 rows
        for bn in BNS:
            for splits in split_counts(p, WG_ROWS * groups, bn):
                for depth in DEPTHS:
                    t = {"BM": WG_ROWS * groups, "BN": bn, "depth": depth, "groups": groups, "splits": splits}
                    yield t
                    if groups == 1:  # two resident CTAs (half the register file each): two warpgroups would spill
                        yield t | {"ctas": 2}
                    # persistent CTAs (program.persistent: the producer loads the next tile while the consumers
                    # finish one) where every query tile is one piece (merge CTAs would wait for pieces a
                    # persistent CTA has not reached) and there is more than one
                    if splits == 1 and p["batch"] * p["kv_heads"] * query_tiles(p, WG_ROWS * groups) > 1:
                        yield t | {"persistent": 1}


def partial_bytes(rows: int, D: int) -> int:
    """Bytes of one piece's partial result for ``rows`` query rows: O / l and the log-sum-exp, fp32."""
    return rows * (D + 1) * 4


def _build(p: dict[str, Any], t: dict[str, int], hw: Hardware | None = None) -> STaskGraph:
    B, H, Hkv, D, dt = p["batch"], p["heads"], p["kv_heads"], p["head_dim"], p["dtype"]
    BM, BN, depth, W, splits = t["BM"], t["BN"], t["depth"], t["groups"], t["splits"]
    positive(BM=BM, BN=BN, depth=depth, groups=W, splits=splits)
    if BM != WG_ROWS * W:
        raise ShapeError(f"flash_decode tiling: BM={BM} must be {WG_ROWS} rows per consumer warpgroup ({W})")
    if BN % 16 or BN > 256:
        raise ShapeError(f"flash_decode tiling: BN={BN} must be a multiple of 16 up to 256")
    gbox, sbox = packing(p, BM)
    used = gbox * sbox
    if used <= WG_ROWS * (W - 1):
        raise ShapeError(f"flash_decode tiling: {W} warpgroups for {used} packed query rows leaves a warpgroup idle; "
                         f"use groups={cdiv(used, WG_ROWS)}")
    e = DTYPE_BYTES[dt]
    reuse = min(query_tiles(p, BM), sms_of(hw))  # at most the CTAs resident at once reread a K/V tile from L2
    work = pieces(p, BM, BN, splits)
    nmax = max(w[3] for w in work)
    if nmax != splits:
        raise ShapeError(f"flash_decode tiling: splits={splits} cuts the longest query tile ({max(w[2] for w in work)}"
                         f" key blocks of {BN} per piece at most) into {nmax} pieces; use splits={nmax}")
    # TMA delivers the whole box (gbox x sbox = ``used`` rows; the rest of the 64-row wgmma tile is never read back);
    # the query tiles of one (batch, kv head) read the same K/V tiles, the pieces of a tile disjoint ones
    tasks = qkv_loads(BM, BN, D, dt, used, reuse)
    edges = []
    if nmax > 1:
        # rows of the longest merge CTA
        mr = max(u[2] for u in merge_units(p, BM, BN, splits, 128 * (W + 1), sms_of(hw)))
    for g in range(W):
        s, r = f"@{g}", WG_ROWS
        rows = min(WG_ROWS, used - WG_ROWS * g)  # rows of this warpgroup that hold a query
        tasks += warpgroup_tasks(g, r, D, BN, dt, out=False)
        edges += warpgroup_edges(g)
        if nmax == 1:
            tasks.append(task("store" + s, "store", phase="post", tile=(rows, D), dtype=dt, bytes=rows * D * e,
                              is_async=True, group=g, reads=("o" + s,)))
            continue
        # the partial write; a merge CTA's read of its rows of every piece (just written: L2) and its store of them
        tasks += [
            task("store" + s, "store", phase="post", tile=(rows, D + 1), dtype="fp32",
                 bytes=partial_bytes(rows, D), is_async=True, group=g, reads=("o" + s, "ml" + s)),
            task("combine" + s, "load", phase="post", tile=(nmax * mr, D + 1), dtype="fp32",
                 bytes=nmax * partial_bytes(mr, D), reuse=nmax, group=g, reads=("o" + s,)),
            task("out" + s, "store", phase="post", tile=(mr, D), dtype=dt, bytes=mr * D * e, is_async=True,
                 group=g, reads=("o" + s,)),
        ]
        edges += [Edge("store" + s, "combine" + s), Edge("combine" + s, "out" + s)]
    flops = 4 * B * H * D * kept_pairs(p)
    name = f"fd_b{B}_h{H}_kv{Hkv}_q{p['seq_q']}_k{p['seq_kv']}_d{D}{'_causal' if p['causal'] else ''}_{dt}"
    return STaskGraph(name=name, op="flash_decode", params=dict(p), tiling=dict(t), tasks=tuple(tasks),
                      edges=tuple(edges), row=tuple(w[2] for w in work), rows=B * Hkv, useful_flops=flops)


def follow(p: dict[str, Any], t: dict[str, int], hw: Hardware | None) -> int:
    """The merge CTAs of a launch (OpSpec.follow): ``merge_units`` of every (batch, kv head); none with one piece."""
    return p["batch"] * p["kv_heads"] * len(merge_units(p, t["BM"], t["BN"], t["splits"], 128 * (t["groups"] + 1),
                                                        sms_of(hw)))


def orders(groups: int) -> dict[str, dict[str, list[tuple[str, int]]]]:
    """The hand-known issue orders (OpSpec.orders): FlashAttention-3's (attention.orders) and FlashAttention-2's,
    each warpgroup's iteration in dependence order at one stage. ptxas serialises the wgmma pipeline of many of
    the free optimum's orders here (its stage copies of S and P), and the compiler in the loop then keeps the
    first rejected tiling with the best of these orders instead of dropping it (ptsolve.optimize)."""
    plain = {f"wg{g}": [(f"{t}@{g}", 0) for t in ("mma_qk", "rowmax", "exp2", "rowsum", "rescale", "mma_pv")]
             for g in range(groups)}
    return orders_fa3(groups) | {"fa2": plain | {"tc": [(f"{t}@{g}", 0) for g in range(groups)
                                                       for t in ("mma_qk", "mma_pv")]}}


def textbook(params: dict[str, Any], tiling: dict[str, int], overlap: bool) -> TextbookPlan:
    """FlashAttention's textbook order (attention.textbook); a tiling that cuts some query tile into several pieces
    ends with the partial, the combine and the merged O."""
    p = _validate(dict(params))
    split = max(w[3] for w in pieces(p, tiling["BM"], tiling["BN"], tiling["splits"])) > 1
    return textbook_fa(p, tiling, overlap, ("store", "combine", "out") if split else ("store",))


register("flash_decode", OpSpec(
    _validate, _tilings, _build,
    orders=orders,
    out_tile=lambda t: (t["BM"], 0),
    from_out_tile=lambda p, o: {"BM": o[0]},
    # two CTAs per SM: the model prices it (DRAM shared by the busy SMs, policies.model.floor_of; the merge CTAs'
    # tail, follow) and the generic classes' choice of it measured faster (results/torch_decode/pick_ab.py), but only
    # the generic binaries were measured, so the exact-shape search offers it only when asked (the generic classes ask)
    optional={"ctas": 1}, opt_in=("ctas",), follow=follow,
    aliases=("decode",), plan=textbook,
))
