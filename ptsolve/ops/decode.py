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
(ptsolve.program.follow_tail, fitted on measured launches: bench study torch_decode).
Where every tile is one piece (no merge CTAs) the CTAs may be persistent (tiling ``persistent``): one per SM deals
itself the tiles, its producer loading the next tile's K/V while the consumers finish the last (program.handover).
A merge CTA spins on its tile's counter, so it must not keep the tile's own pieces from running: there are fewer
merge CTAs than SMs (``merge_units``), so whatever order the CTAs are dispatched in an SM is left for the pieces; where
even one merge CTA per tile is more (large batches, which rarely split), they have the highest CTA indices and the
hardware dispatches CTAs in index order.

Causal masking is bottom-right aligned: query position i sees keys <= i + seq_kv - seq_q. ``softcap`` > 0 caps the
scores, softcap · tanh(s · scale / softcap) (Gemma-2's, as ``ptsolve.ops.attention``): a multiply and a tanh per score
that rowmax pays on the SFU; the merge is unchanged (it combines the pieces' log-sum-exps of the capped scores). A
parameter only where it asks something, so a graph without it is the one it always was.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import arguments
from ..errors import ShapeError
from ..geometry.decode import (  # noqa: F401  (re-exported for its readers)
    MERGE_PIECES,
    length_pieces,
    merge_grid,
    merge_rows,
    merge_units,
    packing,
    piece_blocks,
    pieces,
    query_tiles,
    tile_rows,
    trip_counts,
)
from ..hw import Hardware
from ..ir import DTYPE_BYTES, Edge, STaskGraph
from .attention import kept_pairs, qkv_loads, softcap_value, warpgroup_edges, warpgroup_tasks
from .attention import orders as orders_fa3
from .attention import textbook as textbook_fa
from .base import WG_ROWS, OpSpec, TextbookPlan, cdiv, check_keys, dtype_ok, positive, register, sms_of, task

KEYS = ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal", "dtype")
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # candidate pieces of the longest query tile
BNS = (64, 128)
DEPTHS = (2, 3, 4)


def _validate(p: dict[str, Any]) -> dict[str, Any]:
    softcap = softcap_value("flash_decode", p.pop("softcap", 0.0))
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
    return p | ({"softcap": softcap} if softcap else {})


def split_counts(p: dict[str, Any], BM: int, BN: int) -> list[int]:
    """The distinct piece counts of the longest query tile that SPLITS gives (a count the tile's key blocks cannot
    make, e.g. 64 pieces of 40 blocks, is the count it does make)."""
    tmax = max(trip_counts(p, BM, BN))
    return sorted({cdiv(tmax, cdiv(tmax, s)) for s in SPLITS})


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
        tasks += warpgroup_tasks(g, r, D, BN, dt, out=False, softcap="softcap" in p)
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
    sc = f"_sc{p['softcap']:g}" if "softcap" in p else ""
    name = f"fd_b{B}_h{H}_kv{Hkv}_q{p['seq_q']}_k{p['seq_kv']}_d{D}{'_causal' if p['causal'] else ''}{sc}_{dt}"
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
    # tail, follow) and the generic classes' choice of it measured faster (bench study torch_decode), but only
    # the generic binaries were measured, so the exact-shape search offers it only when asked (the generic classes ask)
    optional={"ctas": 1}, opt_in=("ctas",), follow=follow,
    aliases=("decode",), plan=textbook,
))
