"""FlashAttention forward (GQA, causal, sliding window, softcap, ragged sequence lengths).

One CTA owns BM query rows of one (batch, head); its consumer warpgroups split those rows. The loop
runs over BN-key blocks: load_k, load_v (producer, TMA, shared by the warpgroups), then per warpgroup
mma_qk → rowmax → exp2 → rowsum, rescale of O, mma_pv. Causal masking keeps key j ≤ query i
(bottom-right aligned when seq_q < seq_kv), so CTAs have unequal trip counts. A sliding window
(FlashAttention's ``window_size``: ``window_left`` / ``window_right``, -1 unbounded) keeps keys
i + off - left ≤ j ≤ i + off + right (off = seq_kv - seq_q): a query block visits only the key blocks of its
band. ``softcap`` > 0 caps the scores, softcap · tanh(s · scale / softcap) (Gemma-2's), a tanh per score that
rowmax pays on the SFU. Both are parameters only where they ask something, so a graph without them is the
one it always was.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import arguments
from ..errors import ShapeError
from ..geometry.attention import head_cols
from ..hw import Hardware
from ..ir import DTYPE_BYTES, Edge, STask, STaskGraph
from .base import WG_ROWS, OpSpec, TextbookPlan, cdiv, check_keys, dtype_ok, positive, reg, register, smem, sms_of, task

KEYS = ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal", "dtype")


def _validate(p: dict[str, Any]) -> dict[str, Any]:
    feats = {k: p.pop(k) for k in ("softcap", "window_left", "window_right") if k in p}
    if "seq" in p:
        s = p.pop("seq")
        clash = {k: p[k] for k in ("seq_q", "seq_kv") if k in p and p[k] != s}
        if clash:  # which one was meant is the user's to say, not ours to guess
            raise ShapeError(f"flash_attention: seq={s!r} sets both seq_q and seq_kv, but "
                             + " and ".join(f"{k}={v!r}" for k, v in clash.items())
                             + " too; give seq alone, or seq_q and seq_kv")
        p.setdefault("seq_q", s)
        p.setdefault("seq_kv", s)
    if "heads" in p:
        p.setdefault("kv_heads", p["heads"])
    p = check_keys("flash_attention", p, ("batch", "heads", "seq_q", "seq_kv"),
                   {"kv_heads": None, "head_dim": 128, "causal": False, "dtype": "fp16"})
    positive(**{k: p[k] for k in KEYS[:6]})
    dtype_ok(p["dtype"])
    if p["heads"] % p["kv_heads"]:
        raise ShapeError(f"flash_attention: heads={p['heads']} is not divisible by kv_heads={p['kv_heads']}; "
                         "each kv head must serve a whole group of query heads")
    d = p["head_dim"]
    if d % 16 or d > 256:
        raise ShapeError(f"flash_attention: head_dim={d} cannot be served by the tensor cores; use a multiple of "
                         "16 up to 256 (64 and 128 are the common ones)")
    if not isinstance(p["causal"], bool):
        raise ShapeError(f"flash_attention: causal={p['causal']!r} must be true or false")
    T = cdiv(p["seq_kv"], WG_ROWS)  # most key blocks a CTA visits (smallest BN); causal CTAs visit 1..T of them
    arguments.size("flash_attention", p["batch"] * p["heads"] * cdiv(p["seq_q"], WG_ROWS), "batch·heads·seq_q",
                30 * (T * (T + 1) // 2 if p["causal"] else T), "seq_kv" + (" (causal)" if p["causal"] else ""))
    if p["causal"] and p["seq_q"] > p["seq_kv"]:
        raise ShapeError(f"flash_attention: causal with seq_q={p['seq_q']} > seq_kv={p['seq_kv']} leaves query rows "
                         "with no key; use seq_q <= seq_kv")
    return p | features(p, **feats)


def features(p: dict[str, Any], softcap: float = 0.0, window_left: int = -1, window_right: int = -1
             ) -> dict[str, Any]:
    """The softcap and sliding-window parameters that ask something of shape ``p`` (FlashAttention-3's
    normalisation: causal is a right window of 0, a window that covers every key is none); ShapeError for a
    negative or non-finite softcap or a window size below -1."""
    softcap = softcap_value("flash_attention", softcap)
    for k, v in (("window_left", window_left), ("window_right", window_right)):
        if isinstance(v, bool) or not isinstance(v, int) or v < -1:
            raise ShapeError(f"flash_attention: {k}={v!r} must be an integer >= -1 (-1: unbounded)")
    left = -1 if window_left >= p["seq_kv"] - 1 else window_left
    right = -1 if p["causal"] or window_right >= p["seq_q"] - 1 else window_right
    out: dict[str, Any] = {"softcap": float(softcap)} if softcap else {}
    return out | ({"window_left": left, "window_right": right} if left >= 0 or right >= 0 else {})


def softcap_value(op: str, softcap: Any) -> float:
    """``softcap`` as a float (0: none; a score cap, unitless like the scores); ShapeError naming ``op`` for a
    negative, non-finite or non-numeric one (flash_attention's and flash_decode's rule)."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0 <= softcap < float("inf"):
        raise ShapeError(f"{op}: softcap={softcap!r} must be a finite number >= 0 (0: no softcap)")
    return float(softcap)


def key_band(p: dict[str, Any], row: int) -> tuple[int, int]:
    """The keys [lo, hi] query ``row`` sees (empty where hi < lo): causal and the window, bottom-right aligned."""
    off = p["seq_kv"] - p["seq_q"]
    right = 0 if p["causal"] else p.get("window_right", -1)
    hi = p["seq_kv"] - 1 if right < 0 else min(p["seq_kv"] - 1, row + off + right)
    left = p.get("window_left", -1)
    return (0 if left < 0 else max(0, row + off - left)), hi


def _tilings(p: dict[str, Any]) -> Iterator[dict[str, int]]:
    for groups in (1, 2, 3):
        for rows in (64, 128):
            # BN=32: MI300X's 64 KB of LDS holds no head_dim-128 tiling with 64-key K/V blocks (Q 16 KB + two
            # stages of K and V at 16 KB each); 32-key blocks fit (codegen.hip)
            for bn in (32, 64, 128, 176, 192, 256):
                for depth in (2, 3):
                    t = {"BM": rows * groups, "BN": bn, "depth": depth, "groups": groups}
                    yield t
                    if _tiles(p, t["BM"]) > 1:  # persistent CTAs (program.persistent): not for a single tile
                        yield t | {"persistent": 1}


def _tiles(p: dict[str, Any], BM: int) -> int:
    """Query tiles of the whole launch (batch x heads x query blocks)."""
    return p["batch"] * p["heads"] * cdiv(p["seq_q"], BM)


def trip_counts(p: dict[str, Any], BM: int, BN: int) -> list[int]:
    """Key blocks each query block visits, for one (batch, head)."""
    sq, skv = p["seq_q"], p["seq_kv"]
    full = cdiv(skv, BN)
    if "window_left" in p:  # the blocks from the first row's first key to the last row's last
        return [max(0, key_band(p, min(sq, (i + 1) * BM) - 1)[1] // BN + 1 - key_band(p, i * BM)[0] // BN)
                for i in range(cdiv(sq, BM))]
    if not p["causal"]:
        return [full] * cdiv(sq, BM)
    off = skv - sq  # query i sees keys 0 .. i + off
    return [min(full, cdiv(min(skv, (i + 1) * BM + off), BN)) for i in range(cdiv(sq, BM))]


def kept_pairs(p: dict[str, Any]) -> int:
    """(query, key) pairs attention computes for one (batch, head)."""
    sq, skv = p["seq_q"], p["seq_kv"]
    if "window_left" in p:
        return sum(max(0, hi - lo + 1) for lo, hi in (key_band(p, i) for i in range(sq)))
    if not p["causal"]:
        return sq * skv
    off = skv - sq
    return sum(min(skv, i + off + 1) for i in range(sq))


def qkv_loads(BM: int, BN: int, D: int, dt: str, q_rows: int, reuse: float, cols: int | None = None) -> list[STask]:
    """The producer's loads (FlashAttention's and flash_decode's): the BM x D query tile once per CTA, of which
    ``q_rows`` rows carry data, and a BN x D key and value tile per iteration, each reread ``reuse`` times from L2;
    each tile takes ``cols`` (geometry.attention.head_cols, default D) columns of shared memory."""
    e, c = DTYPE_BYTES[dt], cols or D
    return [
        task("load_q", "load", phase="pre", tile=(BM, D), dtype=dt, bytes=q_rows * D * e, is_async=True,
             allocs=(smem("q", BM * c * e),)),
        task("load_k", "load", tile=(BN, D), dtype=dt, bytes=BN * D * e, reuse=reuse, is_async=True,
             allocs=(smem("k", BN * c * e),)),
        task("load_v", "load", tile=(BN, D), dtype=dt, bytes=BN * D * e, reuse=reuse, is_async=True,
             allocs=(smem("v", BN * c * e),)),
    ]


def warpgroup_tasks(g: int, r: int, D: int, BN: int, dt: str, out: bool, cols: int | None = None,
                    softcap: bool = False) -> list[STask]:
    """Consumer warpgroup ``g``'s online-softmax tasks over ``r`` query rows (FlashAttention's and flash_decode's):
    init, S = QKᵀ, rowmax, exp2, rowsum (packs P), rescale, O += PV, normalize; ``out``: normalize writes O to a
    shared-memory buffer for a TMA store. The softmax needs no working set beyond O, S, P and the table's
    reg_overhead: ptxas's demand is that sum (codegen.regfit, bench study regfit). O's accumulator and P·V span
    ``cols`` head-dim columns (geometry.attention.head_cols, default D). ``softcap``: rowmax first caps each score,
    a multiply and a tanh on the SFU."""
    s, e, c = f"@{g}", DTYPE_BYTES[dt], cols or D
    return [
        task("init" + s, "vector", phase="pre", tile=(r, D), dtype="fp32", flops=r * D + 2 * r, group=g,
             allocs=(reg("o" + s, r * c * 4), reg("ml" + s, 2 * r * 4))),
        task("mma_qk" + s, "mma", tile=(r, BN, D), dtype=dt, flops=2 * r * BN * D, is_async=True, group=g,
             reads=("q", "k"), frees=("k",), allocs=(reg("s" + s, r * BN * 4),)),
        task("rowmax" + s, "vector", tile=(r, BN), dtype="fp32", flops=(2 if softcap else 1) * r * BN,
             sfu=r * BN if softcap else 0, group=g, reads=("s" + s, "ml" + s)),
        # exp2(S - m) is computed in place in S; rowsum adds it up and packs it into P (fp16), freeing S, so FA3's
        # order (QK of j issued while P of j-1 waits for PV) holds one S and one P, not two S
        task("exp2" + s, "vector", tile=(r, BN), dtype="fp32", flops=2 * r * BN, sfu=r * BN, group=g,
             reads=("s" + s,)),
        task("rowsum" + s, "vector", tile=(r, BN), dtype="fp32", flops=2 * r * BN, group=g,
             reads=("s" + s, "ml" + s), frees=("s" + s,), allocs=(reg("p" + s, r * BN * e),)),
        task("rescale" + s, "vector", tile=(r, D), dtype="fp32", flops=r * D + r, sfu=r, group=g,
             reads=("o" + s, "ml" + s)),
        task("mma_pv" + s, "mma", tile=(r, c, BN), dtype=dt, flops=2 * r * BN * c, is_async=True, group=g,
             reads=("p" + s, "v", "o" + s), frees=("p" + s, "v")),
        task("normalize" + s, "vector", phase="post", tile=(r, D), dtype="fp32", flops=r * D, sfu=r, group=g,
             reads=("o" + s, "ml" + s), allocs=(smem("out" + s, r * D * e),) if out else ()),
    ]


def warpgroup_edges(g: int) -> list[Edge]:
    """The dependences of ``warpgroup_tasks(g, ...)`` and of their ``store@g`` (loop-carried ones with distance 1)."""
    s = f"@{g}"
    return [
        Edge("load_q", "mma_qk" + s), Edge("init" + s, "rowmax" + s), Edge("init" + s, "rescale" + s),
        Edge("load_k", "mma_qk" + s), Edge("mma_qk" + s, "rowmax" + s), Edge("rowmax" + s, "exp2" + s),
        Edge("exp2" + s, "rowsum" + s), Edge("rowmax" + s, "rescale" + s), Edge("rescale" + s, "mma_pv" + s),
        Edge("rowsum" + s, "mma_pv" + s), Edge("load_v", "mma_pv" + s),
        Edge("rowmax" + s, "rowmax" + s, 1), Edge("rowsum" + s, "rowsum" + s, 1),
        Edge("mma_pv" + s, "rescale" + s, 1), Edge("rowmax" + s, "rowsum" + s, 0),
        Edge("mma_pv" + s, "normalize" + s), Edge("rowsum" + s, "normalize" + s),
        Edge("normalize" + s, "store" + s),
    ]


def _build(p: dict[str, Any], t: dict[str, int], hw: Hardware | None = None) -> STaskGraph:
    B, H, Hkv, D, dt = p["batch"], p["heads"], p["kv_heads"], p["head_dim"], p["dtype"]
    BM, BN, depth, W = t["BM"], t["BN"], t["depth"], t["groups"]
    positive(BM=BM, BN=BN, depth=depth, groups=W)
    rows = BM // W
    if BM % W or rows % WG_ROWS:
        raise ShapeError(f"flash_attention tiling: BM={BM} over {W} warpgroups must give a multiple of {WG_ROWS} rows")
    if BN % 16 or BN > 256:
        raise ShapeError(f"flash_attention tiling: BN={BN} must be a multiple of 16 up to 256")
    e = DTYPE_BYTES[dt]
    # a query block whose rows see no key (a window's band can miss them) still runs its prologue and store
    trips = [max(1, n) for n in trip_counts(p, BM, BN)]
    group = H // Hkv
    reuse = min(len(trips) * group, sms_of(hw))  # Q blocks of a head and heads of a GQA group reread a K/V tile
    cols = head_cols(D, hw.arch if hw is not None else None)
    tasks = qkv_loads(BM, BN, D, dt, BM, reuse, cols)
    edges = []
    for g in range(W):
        s = f"@{g}"
        r = rows
        tasks += [*warpgroup_tasks(g, rows, D, BN, dt, out=True, cols=cols, softcap="softcap" in p),
                  task("store" + s, "store", phase="post", tile=(r, D), dtype=dt, bytes=r * D * e, is_async=True,
                       group=g, reads=("out" + s,))]
        edges += warpgroup_edges(g)
    flops = 4 * B * H * D * kept_pairs(p)
    feat = (f"_sc{p['softcap']:g}" if "softcap" in p else "") + \
        (f"_w{p['window_left']}_{p['window_right']}" if "window_left" in p else "")
    name = f"fa_b{B}_h{H}_kv{Hkv}_q{p['seq_q']}_k{p['seq_kv']}_d{D}{'_causal' if p['causal'] else ''}{feat}_{dt}"
    return STaskGraph(name=name, op="flash_attention", params=dict(p), tiling=dict(t), tasks=tuple(tasks),
                      edges=tuple(edges), row=tuple(trips), rows=B * H, useful_flops=flops)


def orders(groups: int) -> dict[str, dict[str, list[tuple[str, int]]]]:
    """FlashAttention-3's intra-warpgroup overlap: each warpgroup issues QK of j, then PV of j-1 (one stage behind),
    then the softmax of j, so the softmax runs while the tensor cores work on both; the warpgroups take the tensor
    cores in turn, QK and PV in one turn each (``tc``, a cyclic order, stages free)."""
    out = {f"wg{g}": [(f"mma_qk@{g}", 0), (f"mma_pv@{g}", 1), (f"rowmax@{g}", 0), (f"exp2@{g}", 0),
                      (f"rowsum@{g}", 0), (f"rescale@{g}", 0)] for g in range(groups)}
    return {"fa3": out | {"tc": [(f"{t}@{g}", 0) for g in range(groups) for t in ("mma_qk", "mma_pv")]}}


def textbook(params: dict[str, Any], tiling: dict[str, int], overlap: bool,
             tail: tuple[str, ...] = ("store",)) -> TextbookPlan:
    """The textbook order (codegen.plan.default_plan): QK, the softmax pieces and PV per warpgroup; ``overlap`` puts
    the softmax and PV one stage behind QK (FA3's intra-warpgroup overlap, two score buffers) and has the warpgroups
    take the tensor cores in turn; without it turns would serialise their softmaxes. ``tail``: the epilogue's tasks
    after normalize."""
    wgs = range(int(tiling["groups"]))
    s = 1 if overlap else 0
    pre = {"producer": [("load_q", 0)]} | {f"wg{g}": [(f"init@{g}", 0)] for g in wgs}
    loop: dict[str, list[tuple[str, int]]] = {"producer": [("load_k", 0), ("load_v", 0)]}
    loop |= {f"wg{g}": [(f"mma_qk@{g}", 0), (f"rowmax@{g}", s), (f"exp2@{g}", s), (f"rowsum@{g}", s),
                        (f"rescale@{g}", s), (f"mma_pv@{g}", s)] for g in wgs}
    post = {f"wg{g}": [(f"normalize@{g}", 0)] + [(f"{t}@{g}", 0) for t in tail] for g in wgs}
    tc = [f"{t}@{g}" for g in wgs for t in ("mma_qk", "mma_pv")] if overlap else []
    return TextbookPlan({"pre": pre, "loop": loop, "post": post}, tc)


register("flash_attention", OpSpec(
    _validate, _tilings, _build,
    out_tile=lambda t: (t["BM"], 0),
    from_out_tile=lambda p, o: {"BM": o[0]},
    orders=orders,
    aliases=("fa",),
    plan=textbook,
))
