"""Split-KV attention task bodies (``ptsolve.ops.decode``: FlashDecoding, GQA-packed query tiles).

Layout: q/o [B, Sq, H, D], k/v [B, Skv, Hkv, D] as in FlashAttention; scale 1/sqrt(D); causal bottom-right.
A CTA is one entry of the operator's work table (``ptsolve.ops.decode.pieces``, emitted as ``dec_work``) for
one (batch, kv head): query tile ``qt``, key blocks ``kb0 .. kb0 + T - 1``, ``ns`` pieces of that tile, this
one ``piece``. The tile's row r is head ``j0 + r % GB`` of the group at position ``s0 + r / GB``: ``load_q`` is
one 5-D TMA box (64 columns, GB heads, 1 kv head, SB positions, 1 batch) that lands in exactly that row order.

The loop's tasks (S = QKᵀ, the online softmax in the exp2 domain, O += PV) are FlashAttention's bodies
(``codegen.cuda.attention``); only the producer's key-block coordinate and the mask differ here. Epilogue of a
tile with one piece: ``store`` writes O. Of a tile with several: ``store`` writes this piece's O / l and its
log-sum-exp (log2 domain) in fp32 to the workspace and ``combine`` counts the piece done (a fence, one atomic per
warpgroup). The merge runs in the merge CTAs (``ptsolve.ops.decode.merge_units``, the grid's last CTAs, the
operator's ``entry``): each spins until its tile's pieces are all counted, merges its rows (weights
exp2(lse_k - max lse), partials read through L2 as float4, a row's pieces spread over several thread groups whose
results meet in shared memory) and stores them; the tile's last merge CTA resets the counters for the next launch.
``out`` has nothing left to do in a piece. Offsets into q/o and the workspace are 64-bit. A softcap (``softcap`` in
the parameters) caps each score in rowmax before the mask, FlashAttention's way (``attention._softcap``:
tanh(s · SOFTCAP_PRE), SOFTCAP_PRE = scale / softcap, the exp2 domain's scale then softcap · log2 e); the pieces'
log-sum-exps are of the capped scores, so the merge is unchanged.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ptsolve.errors import CodegenError
from ptsolve.geometry.decode import (
    MERGE_PIECES,
    merge_grid,
    merge_units,
    packing,
    piece_blocks,
    pieces,
    query_tiles,
)
from ptsolve.tiling import cdiv

from ..kernel_ir import KernelIR
from . import attention
from .common import CTYPE, FAST_DIV, LD_ACQUIRE, PACK2, TensorMapSpec, fast_div, wgmma_rs, wgmma_ss
from .skeleton import REGISTRY, OpKernel, Task

OP = "flash_decode"

DEVICE = r"""
__device__ __forceinline__ void tma_load_5d(void* dst, const pts_tmap* map, uint64_t* bar,
                                            int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];"
               :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)),
                  "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}
"""


def _work(ir: KernelIR) -> list[tuple[int, int, int, int, int]]:
    p, t = ir.params, ir.tiling
    return pieces(p, t["BM"], t["BN"], t["splits"])


def _nmax(ir: KernelIR) -> int:
    """The most pieces of a query tile (a generic build has the several-piece epilogue unless it is persistent: its
    launches take one piece per tile, ``ptsolve.serve.decode.decode_pick``)."""
    if ir.generic:
        return 1 if ir.persistent else 2
    return max(w[3] for w in _work(ir))


def _merges(ir: KernelIR) -> list[tuple[int, int, int, int]]:
    p, t = ir.params, ir.tiling
    return merge_units(p, t["BM"], t["BN"], t["splits"], ir.threads, ir.sms)


def _bases(ir: KernelIR) -> tuple[list[int], int]:
    """Per query tile, its first workspace slot among the slots of one (batch, kv head) (only tiles of several
    pieces have slots, one per piece), and the slots per (batch, kv head)."""
    n = {q: ns for q, _, _, ns, _ in _work(ir)}
    out, at = [], 0
    for q in range(query_tiles(ir.params, ir.tiling["BM"])):
        out.append(at)
        at += n[q] if n[q] > 1 else 0
    return out, at


def _check(ir: KernelIR) -> None:
    p, t = ir.params, ir.tiling
    attention.check_tile(OP, ir)
    gbox, sbox = packing(p, t["BM"])
    if gbox > 256 or sbox > 256:
        raise CodegenError(f"{OP}: a query tile of {gbox} heads x {sbox} positions exceeds the TMA box (256 per "
                           "dimension)")
    if _nmax(ir) > 1 and ir.persistent:
        raise CodegenError(f"{OP}: splits={t['splits']} on persistent CTAs; the merge CTAs wait for pieces a "
                           "persistent CTA may not have run yet: use persistent=0")
    err = index_error(p, t)
    if err:
        raise CodegenError(err)


def index_error(p: Mapping[str, Any], t: Mapping[str, int]) -> str:
    """Why the kernel's 32-bit indices cannot take shape ``p`` ("" when they can): TMA coordinates and the per-tensor
    row counts stay 32-bit (element offsets are 64-bit), and so does the grid."""
    n = p["batch"] * p["kv_heads"] * query_tiles(p, t["BM"])
    if max(p["batch"] * p["seq_q"], n * t["splits"] * 2, p["seq_kv"]) >= 1 << 31:
        return (f"{OP}: batch·seq_q = {p['batch'] * p['seq_q']}, twice batch·kv_heads·query tiles·pieces = "
                f"{n * t['splits'] * 2} and seq_kv = {p['seq_kv']} must stay below 2^31")
    if t["splits"] * -(-p["seq_kv"] // t["BN"]) >= 1 << 31:  # the generic kernel's piece bounds, 32-bit
        return f"{OP}: {t['splits']} pieces of seq_kv = {p['seq_kv']} overflow the kernel's 32-bit key-block bounds"
    return ""


SIZE_PARAMS = ("batch", "heads", "kv_heads", "seq_q", "seq_kv")


def sizes(p: Mapping[str, Any], t: Mapping[str, int], sms: int = 132, paging: tuple[int, int] = (0, 0)
          ) -> dict[str, int]:
    """What a generic build takes at launch for shape ``p`` and tiling ``t`` (its ``splits`` chosen per shape,
    ``ptsolve.serve``): the sizes, the query-tile packing (``packing``), NSP pieces of the longest tile, CHUNK key
    blocks per piece at most (``piece_blocks``: the kernel cuts each tile as ``pieces`` does), the merge grid
    (``merge_grid``: MRR rows per merge CTA, NMU merge CTAs per query tile, fewer than ``sms`` in all), a paged
    cache's (PAGE keys per page, MAXP pages per sequence in the table; 0, 0 without), NTILES piece CTAs last; the grid
    is NTILES + B_·HKV·NQT·NMU."""
    BM, BN, W = t["BM"], t["BN"], t["groups"]
    gbox, sbox = packing(p, BM)
    nqt = query_tiles(p, BM)
    mrr, nmu = merge_grid(p, BM, BN, t["splits"], 128 * (W + 1), sms)
    chunk = piece_blocks(p, BM, BN, t["splits"])
    sz = {"B_": p["batch"], "H": p["heads"], "HKV": p["kv_heads"], "SQ": p["seq_q"], "SKV": p["seq_kv"],
          "GB": gbox, "SB": sbox, "NGT": -(-(p["heads"] // p["kv_heads"]) // gbox), "NQT": nqt,
          "NSP": t["splits"], "CHUNK": chunk, "MRR": mrr, "NMU": nmu,
          # without causal every tile visits all key blocks: its pieces, the same for all
          "NS0": 1 if p["causal"] else cdiv(cdiv(p["seq_kv"], BN), chunk)}
    # the tile decode's divisors (``FAST_DIV``), so the producer reaches its first load without division routines
    for name, d in (("NE", nqt * t["splits"]), ("HKV", p["kv_heads"]), ("NSP", t["splits"]), ("NGT", sz["NGT"]),
                    ("NS0", sz["NS0"]), ("GB", gbox)):
        sz[f"{name}_M"], sz[f"{name}_S"] = fast_div(d)
    return sz | {"PAGE": paging[0], "MAXP": paging[1], "NTILES": p["batch"] * p["kv_heads"] * nqt * t["splits"]}


def grid(sz: Mapping[str, int]) -> int:
    """CTAs of a generic launch with sizes ``sz``: the pieces, then the merge CTAs."""
    return sz["NTILES"] + sz["B_"] * sz["HKV"] * sz["NQT"] * sz["NMU"]


def _consts(ir: KernelIR) -> str:
    p, t = ir.params, ir.tiling
    D, BM = p["head_dim"], t["BM"]
    if ir.generic:
        return (f"  constexpr int D = {D}, DCH = D / 64, BM = {BM}, BN = {t['BN']};\n"
                "  const int G = H / HKV, PR = GB * SB, NE = NQT * NSP, NSLOT = NE, TILES_ = B_ * HKV * NQT;\n"
                f"  constexpr bool CAUSAL = {'true' if p['causal'] else 'false'};\n"
                "  (void)G; (void)PR; (void)NSLOT; (void)TILES_;")
    gbox, sbox = packing(p, BM)
    G, sc = p["heads"] // p["kv_heads"], p.get("softcap", 0.0)
    return (f"  constexpr int H = {p['heads']}, HKV = {p['kv_heads']}, G = {G}, SQ = {p['seq_q']}, "
            f"SKV = {p['seq_kv']};\n"
            f"  constexpr int D = {D}, DCH = D / 64, BM = {BM}, BN = {t['BN']}, B_ = {p['batch']};\n"
            f"  constexpr int GB = {gbox}, SB = {sbox}, PR = GB * SB, NGT = {-(-G // gbox)}, "
            f"NQT = {query_tiles(p, BM)};\n"
            f"  constexpr int NE = {len(_work(ir))}, NMAX = {_nmax(ir)}, NSLOT = {_bases(ir)[1]}, NM = "
            f"{len(_merges(ir))};  // per (batch, kv head): piece CTAs, the most pieces of a tile, workspace slots, "
            "merge CTAs\n"
            f"  constexpr int TILES_ = B_ * HKV * NQT;  // query tiles (their counters)\n"
            f"  constexpr bool CAUSAL = {'true' if p['causal'] else 'false'};\n"
            "  constexpr int OFF = SKV - SQ;  // bottom-right aligned causal mask: position i sees keys <= i + OFF\n"
            f"  constexpr float SCALE_LOG2 = {math.log2(math.e) * (sc or 1 / math.sqrt(D))!r}f;"
            "  // log2(e) / sqrt(D), or log2(e) · softcap\n"
            + (f"  constexpr float SOFTCAP_PRE = {1 / (math.sqrt(D) * sc)!r}f;\n" if sc else "") +
            "  (void)B_; (void)NMAX; (void)NSLOT; (void)NM; (void)TILES_;")


def _device(ir: KernelIR) -> str:
    tanh = attention.TANH if ir.params.get("softcap") else ""
    if ir.generic:
        return (wgmma_ss(ir.tiling["BN"], ir.params["dtype"]) + wgmma_rs(ir.params["head_dim"], ir.params["dtype"], 1)
                + DEVICE + LD_ACQUIRE + FAST_DIV + tanh)
    table = ", ".join(f"{{{q}, {kb}, {n}, {ns | (k << 16)}}}" for q, kb, n, ns, k in _work(ir))
    bases = _bases(ir)[0]
    nsp = {q: ns for q, _, _, ns, _ in _work(ir)}
    merge = ", ".join(f"{{{q}, {r0}, {n}, {nu}}}" for q, r0, n, nu in _merges(ir)) or "{0, 0, 0, 0}"
    return (wgmma_ss(ir.tiling["BN"], ir.params["dtype"]) + wgmma_rs(ir.params["head_dim"], ir.params["dtype"], 1)
            + DEVICE + LD_ACQUIRE + tanh
            + "// (query tile, first key block, key blocks, pieces of the tile | piece << 16): "
            "ptsolve.ops.decode.pieces\n"
            f"__device__ const int4 dec_work[{len(_work(ir))}] = {{{table}}};\n"
            "// first workspace slot of each query tile (tiles of several pieces only)\n"
            f"__device__ const int dec_base[{len(bases)}] = {{{', '.join(map(str, bases))}}};\n"
            "// pieces of each query tile\n"
            f"__device__ const int dec_nsp[{len(bases)}] = {{{', '.join(str(nsp[q]) for q in range(len(bases)))}}};\n"
            "// merge CTAs (query tile, first row, rows, merge CTAs of the tile): ptsolve.ops.decode.merge_units\n"
            f"__device__ const int4 dec_merge[{max(1, len(_merges(ir)))}] = {{{merge}}};\n")


def _tile_blocks() -> str:
    """C++ (generic build): for query tile ``qt`` (``qg_``: its position group ``qt / NGT``) of batch ``bz``, the
    keys ``skv_`` it attends to (``seqlens[bz]`` clamped to the cache's SKV where the launch has per-sequence lengths,
    else SKV) and the causal offset ``off_``, its head tile and position ``j0``, ``s0``, the key blocks ``TT`` it
    visits and its pieces ``ns``, as ``ptsolve.ops.decode.trip_counts`` and ``pieces``; with per-sequence lengths
    (``ptsolve.ops.decode.length_pieces``) as many pieces as the launch has (NSP), at least one key block each. A
    tile that sees no key still visits one block, all masked: its rows are zeros."""
    return ("  const int skv_ = seqlens ? min(max(__ldg(seqlens + bz), 0), SKV) : SKV, off_ = skv_ - SQ;\n"
            "  const int j0 = (qt - qg_ * NGT) * GB, s0 = qg_ * SB;\n"
            "  int TT = (skv_ + BN - 1) / BN;\n"
            "  if (CAUSAL) { const int last_ = min(SQ, (qg_ + 1) * SB) - 1; TT = min(TT, (last_ + off_ + BN) / BN); }\n"
            "  TT = max(TT, 1);\n"
            "  const int ns = seqlens ? min(NSP, TT) : CAUSAL ? (TT + CHUNK - 1) / CHUNK : NS0;")


def _tiles(ir: KernelIR) -> tuple[int | str, str]:
    p = ir.params
    if ir.generic:  # tile = ((batch, kv head), query tile from the last (the most keys, causal), piece)
        return "NTILES", ("  const int row_ = fdiv(tile, NE, NE_M, NE_S), e_ = tile - row_ * NE;\n"
                          "  const int bz = fdiv(row_, HKV, HKV_M, HKV_S), hkv = row_ - bz * HKV;\n"
                          "  const int qq_ = fdiv(e_, NSP, NSP_M, NSP_S), piece = e_ - qq_ * NSP, qt = NQT - 1 - qq_;\n"
                          "  const int qg_ = fdiv(qt, NGT, NGT_M, NGT_S);\n" + _tile_blocks() + "\n"
                          "  if (piece >= ns) skip_ = true;  // the tile has fewer pieces than the longest\n"
                          # 32-bit: piece < NSP <= 64 and TT < 2^25 (index_error)
                          "  const bool cut_ = CAUSAL || seqlens;  // ns known only here: a division\n"
                          "  const int kb0 = cut_ ? piece * TT / ns : fdiv(piece * TT, NS0, NS0_M, NS0_S);\n"
                          "  const int T = (cut_ ? (piece + 1) * TT / ns : fdiv((piece + 1) * TT, NS0, NS0_M, NS0_S))"
                          " - kb0;\n"
                          "  const long long ctr = (long long)row_ * NQT + qt;  // the tile's counter of pieces done\n"
                          "  const int base_ = qt * NSP;  // its first workspace slot\n"
                          "  (void)ns; (void)piece; (void)ctr; (void)base_;")
    n = len(_work(ir)) * p["batch"] * p["kv_heads"]  # the merge CTAs come after them (``_entry``)
    return n, ("  const int e_ = tile % NE, row_ = tile / NE;  // row_: (batch, kv head)\n"
               "  const int hkv = row_ % HKV, bz = row_ / HKV;\n"
               "  const int4 wk_ = dec_work[e_];\n"
               "  const int qt = wk_.x, kb0 = wk_.y, T = wk_.z, ns = wk_.w & 0xffff, piece = wk_.w >> 16;\n"
               "  const int j0 = (qt % NGT) * GB, s0 = (qt / NGT) * SB;\n"
               "  const long long ctr = (long long)row_ * NQT + qt;  // the tile's counter of pieces done\n"
               "  const int base_ = dec_base[qt];  // its first workspace slot\n"
               "  (void)ns; (void)piece; (void)ctr; (void)base_;")


def _by_gb(ir: KernelIR, x: str) -> str:
    """C++: ``x / GB`` (a launch's divisor in a generic build: ``fdiv``)."""
    return f"fdiv({x}, GB, GB_M, GB_S)" if ir.generic else f"({x}) / GB"


def _rows(ir: KernelIR) -> list[str]:
    """Per thread and row half ``hh``: the tile row, whether it holds a query, its head and position."""
    pos = ([f"    const int rq_ = {_by_gb(ir, 'r')}, jq = j0 + r - rq_ * GB, sq = s0 + rq_;"] if ir.generic else
           ["    const int jq = j0 + r % GB, sq = s0 + r / GB;"])
    return ["    const int r = ROW0 + w * 16 + (lane >> 2) + 8 * hh;", *pos,
            "    const bool valid = r < PR && jq < G && sq < SQ;"]


def _slot(piece: str) -> str:
    """64-bit workspace row of tile row ``r`` for piece ``piece``."""
    return f"(((long long)row_ * NSLOT + base_ + ({piece})) * PR + r)"


def _o_row() -> str:
    """Address of O's row for head ``jq`` of the group at position ``sq`` (64-bit)."""
    return "out + (((long long)bz * SQ + sq) * H + (long long)hkv * G + jq) * D"


def _store_o(dt: str) -> list[str]:
    return ["    if (valid) {",
            f"      uint32_t* orow = reinterpret_cast<uint32_t*>({_o_row()});",
            "#pragma unroll", "      for (int j = 0; j < D / 8; ++j)",
            f"        orow[4 * j + (lane & 3)] = {PACK2[dt]}(o[4 * j + 2 * hh], o[4 * j + 2 * hh + 1]);", "    }"]


def _body(t: Task) -> str:
    ir, b = t.ir, t.base
    dt = ir.params["dtype"]
    if b == "load_q":
        return ("#pragma unroll\n  for (int c = 0; c < DCH; ++c)\n"
                "    tma_load_5d(q_s + c * BM * 128, &tm_q, fbar_, c * 64, j0, hkv, s0, bz);")
    if b in ("load_k", "load_v"):
        x = b[-1]
        dense = ("#pragma unroll\n  for (int c = 0; c < DCH; ++c)\n"
                 f"    tma_load_4d({x}_cur + c * BN * 128, &tm_{x}, fbar_, c * 64, hkv, (kb0 + it_) * BN, bz);")
        if not ir.generic:
            return dense
        # a paged cache (page_table: int32 [B, MAXP] page numbers; the map over [pages, PAGE, Hkv, D]): each box of
        # min(PAGE, BN) keys comes from its page (PAGE and BN powers of two, checked at launch); a box past the
        # sequence's last page reads its last table entry, whose keys the mask drops
        return "\n".join([
            "  if (page_table) {", "    const int kb_ = (kb0 + it_) * BN, pr_ = min(PAGE, BN);",
            "    for (int r = 0; r < BN; r += pr_) {",
            "      const int key_ = kb_ + r;",
            "      const int pg_ = __ldg(page_table + (long long)bz * MAXP + min(key_ / PAGE, MAXP - 1));",
            "#pragma unroll", "      for (int c = 0; c < DCH; ++c)",
            f"        tma_load_4d({x}_cur + c * BN * 128 + r * 128, &tm_{x}, fbar_, c * 64, hkv, key_ % PAGE, pg_);",
            "    }", "  } else {", dense, "  }"])
    if b == "rowmax":
        S = attention._buf(t, "sacc")
        skv, off = ("skv_", "off_") if ir.generic else ("SKV", "OFF")  # a generic build's are per sequence
        return "\n".join([
            f"  fence_regs({S});", *attention._softcap(ir, S), "  const int kb = (kb0 + it_) * BN;",
            # the warpgroup's first row has the smallest position: no key of the block is masked for any row
            f"  if (kb + BN > {skv} || (CAUSAL && kb + BN - 1 > s0 + "
            f"{_by_gb(ir, 'ROW0') if ir.generic else 'ROW0 / GB'} + {off})) {{  // the block crosses a mask edge",
            "#pragma unroll", "    for (int hh = 0; hh < 2; ++hh) {",
            f"      const int sq = s0 + {_by_gb(ir, 'ROW0 + w * 16 + (lane >> 2) + 8 * hh')};",
            "#pragma unroll", "      for (int j = 0; j < BN / 8; ++j)", "#pragma unroll",
            "        for (int c = 0; c < 2; ++c) {",
            "          const int key = kb + 8 * j + 2 * (lane & 3) + c;",
            f"          if (key >= {skv} || (CAUSAL && key > sq + {off})) {S}[4 * j + 2 * hh + c] = -INFINITY;",
            "        }", "    }", "  }",
            *attention.row_max(S)])
    if b in ("init", "mma_qk", "exp2", "rowsum", "rescale", "mma_pv", "normalize"):
        return attention._body(t)
    if b == "store" and _nmax(ir) == 1:
        return "\n".join(["#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {", *_rows(ir), *_store_o(dt), "}"])
    if b == "store":  # a tile of one piece stores O; of several, this piece's O / l and log-sum-exp
        return "\n".join([
            "#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {", *_rows(ir),
            "  if (ns == 1) {", *_store_o(dt), "  } else if (r < PR) {",
            f"    const long long sl = {_slot('piece')};",
            "    lse[sl] = inv_l[hh] > 0.f ? m_r[hh] - __log2f(inv_l[hh]) : -INFINITY;",
            "    float2* prow = reinterpret_cast<float2*>(ws + sl * D);  // the row's columns in order",
            "#pragma unroll", "    for (int j = 0; j < D / 8; ++j)",
            "      prow[4 * j + (lane & 3)] = make_float2(o[4 * j + 2 * hh], o[4 * j + 2 * hh + 1]);",
            "  }", "}"])
    if b == "combine":  # count the piece done; the tile's merge CTAs wait for the count (``_entry``)
        return "\n".join([
            "if (ns > 1) {",
            "  __threadfence();  // this piece's partial is visible before it is counted",
            "  asm volatile(\"bar.sync %0, 128;\" :: \"r\"(WG_BAR) : \"memory\");",
            "  if ((threadIdx.x & 127) == 0) atomicAdd(&cnt[ctr], 1);",
            "}"])
    assert b == "out", b
    return "// the merge CTA stores the merged O" if _nmax(ir) > 1 else ""


def _entry(ir: KernelIR) -> str:
    """The merge CTAs' whole code (ptsolve.ops.decode.merge_units): before any barrier is set up, they leave."""
    if _nmax(ir) == 1:
        return ""
    W = ir.tiling["groups"]
    return "\n".join([
        *_merge_unit(ir),
        "    const long long ctr = (long long)row_ * NQT + qt;",
        f"    if (threadIdx.x == 0) while (ld_acquire(&cnt[ctr]) < ns * {W}) __nanosleep(64);  // every warpgroup",
        "    __syncthreads();",
        "    __threadfence();",
        # thread groups of D / 4 threads, one float4 of a row each; P groups share a row's pieces (ptsolve.ops.decode
        # .merge_rows: the same P and rows per CTA)
        f"    constexpr int C4 = D / 4, NG = {ir.threads} / C4, MP = {MERGE_PIECES};",
        "    const int P = min(NG, (ns + MP - 1) / MP);",
        "    const int RR = NG / P;  // rows merged at a time",
        "    const int c4 = threadIdx.x % C4, grp = threadIdx.x / C4, rr = grp / P, pp = grp % P;",
        "    float* red = reinterpret_cast<float*>(smem_raw);  // the P groups of a row meet here: (m, l, acc)",
        f"    constexpr int NT = {ir.threads};",
        *_merge_rows(ir),
        "    __syncthreads();",
        "    if (threadIdx.x == 0 && atomicAdd(&cnt[TILES_ + ctr], 1) == nu - 1) {",
        "      cnt[ctr] = 0;  // the tile's last merge CTA: every one has seen the count; ready for the next launch",
        "      cnt[TILES_ + ctr] = 0;",
        "    }",
        "    return;",
        "  }"])




def _merge_unit(ir: KernelIR) -> list[str]:
    """Which rows of which query tile this merge CTA merges, and the tile's pieces: from the launch sizes (generic)
    or the baked merge table."""
    if ir.generic:  # merge CTA u of every query tile: rows u·MRR.. (none: it still counts in the reset)
        head = ["  if (blockIdx.x >= NTILES) {  // a merge CTA: merge rows r0 .. r0 + nr - 1 of query tile qt",
                "    const int m_ = blockIdx.x - NTILES, row_ = m_ / (NQT * NMU);",
                "    const int hkv = row_ % HKV, bz = row_ / HKV;",
                "    const int qt = (m_ % (NQT * NMU)) / NMU, u_ = m_ % NMU, qg_ = qt / NGT;",
                _tile_blocks(),
                "    if (ns <= 1) return;  // one piece stored O itself",
                "    const int rows_ = min(GB, G - (qt - qg_ * NGT) * GB) * min(SB, SQ - s0);",
                "    const int r0 = u_ * MRR, nr = min(MRR, rows_ - r0), nu = NMU, base_ = qt * NSP;"]
    else:
        head = ["  if (blockIdx.x >= NTILES) {  // a merge CTA: merge rows r0 .. r0 + nr - 1 of query tile qt",
                "    const int m_ = blockIdx.x - NTILES, row_ = m_ / NM;",
                "    const int hkv = row_ % HKV, bz = row_ / HKV;",
                "    const int4 mu_ = dec_merge[m_ % NM];",
                "    const int qt = mu_.x, r0 = mu_.y, nr = mu_.z, nu = mu_.w, ns = dec_nsp[qt];",
                "    const int j0 = (qt % NGT) * GB, s0 = (qt / NGT) * SB, base_ = dec_base[qt];"]
    return head


def _merge_rows(ir: KernelIR) -> list[str]:
    """Rows merged RR at a time: each row's pieces over P thread groups (MP pieces' loads in flight per group),
    which meet in shared memory; the first group of a row stores it."""
    dt = ir.params["dtype"]
    return [
        "    for (int rb = 0; rb < nr; rb += RR) {",
        "      const int r = r0 + rb + rr;",
        "      const bool act = grp < RR * P && rb + rr < nr;",
        "      float m = -INFINITY, l = 0.f;",
        "      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);",
        "      if (act) {",
        "        for (int k0 = pp; k0 < ns; k0 += P * MP) {  // MP pieces' loads in flight together",
        "          float lk[MP];", "          float4 v[MP];",
        "#pragma unroll", "          for (int u = 0; u < MP; ++u) {",
        "            const int k = k0 + u * P;",
        f"            const long long sl = {_slot('k')};",
        "            lk[u] = k < ns ? __ldcg(lse + sl) : -INFINITY;",
        "            v[u] = k < ns ? __ldcg(reinterpret_cast<const float4*>(ws + sl * D) + c4) "
        ": make_float4(0.f, 0.f, 0.f, 0.f);",
        "          }",
        "          float mn = m;",
        "#pragma unroll", "          for (int u = 0; u < MP; ++u) mn = fmaxf(mn, lk[u]);",
        "          const float mu = mn == -INFINITY ? 0.f : mn, sc = fast_exp2(m - mu);  // sc: 0 before any piece",
        "          l *= sc; acc.x *= sc; acc.y *= sc; acc.z *= sc; acc.w *= sc;",
        "#pragma unroll", "          for (int u = 0; u < MP; ++u) {",
        "            const float wk = fast_exp2(lk[u] - mu);",
        "            l += wk;",
        "            acc.x = fmaf(wk, v[u].x, acc.x); acc.y = fmaf(wk, v[u].y, acc.y);",
        "            acc.z = fmaf(wk, v[u].z, acc.z); acc.w = fmaf(wk, v[u].w, acc.w);",
        "          }",
        "          m = mn;",
        "        }",
        "      }",
        "      if (rb) __syncthreads();  // the previous rows' reads of red are done",
        "      red[threadIdx.x] = m; red[NT + threadIdx.x] = l;",
        "      red[2 * NT + threadIdx.x] = acc.x; red[3 * NT + threadIdx.x] = acc.y;",
        "      red[4 * NT + threadIdx.x] = acc.z; red[5 * NT + threadIdx.x] = acc.w;",
        "      __syncthreads();",
        "      if (act && pp == 0) {",
        "        float mx = -INFINITY;",
        "        for (int q = 0; q < P; ++q) mx = fmaxf(mx, red[threadIdx.x + q * C4]);",
        "        const float mu = mx == -INFINITY ? 0.f : mx;",
        "        float L = 0.f, o0 = 0.f, o1 = 0.f, o2 = 0.f, o3 = 0.f;",
        "        for (int q = 0; q < P; ++q) {",
        "          const int i = threadIdx.x + q * C4;",
        "          const float wq = fast_exp2(red[i] - mu);",
        "          L = fmaf(wq, red[NT + i], L);",
        "          o0 = fmaf(wq, red[2 * NT + i], o0); o1 = fmaf(wq, red[3 * NT + i], o1);",
        "          o2 = fmaf(wq, red[4 * NT + i], o2); o3 = fmaf(wq, red[5 * NT + i], o3);",
        "        }",
        "        const float inv = L > 0.f ? 1.f / L : 0.f;",
        "        const int jq = j0 + r % GB, sq = s0 + r / GB;",
        f"        uint2* orow = reinterpret_cast<uint2*>({_o_row()});",
        f"        orow[c4] = make_uint2({PACK2[dt]}(o0 * inv, o1 * inv), {PACK2[dt]}(o2 * inv, o3 * inv));",
        "      }",
        "    }"]


def maps(p: Mapping[str, Any], t: Mapping[str, int], strides: Mapping[str, tuple[int, int, int]] | None = None,
         paged: tuple[int, int] | None = None) -> tuple[TensorMapSpec, ...]:
    """Tensor maps of q [B, Sq, H, D] and k, v [B, Skv, Hkv, D] with element ``strides`` per tensor (batch,
    position, head; the last dim contiguous), contiguous where not given; ``paged`` (pages, page size): k and v are
    a paged cache [pages, PAGE, Hkv, D] (``strides`` then per page, key, head), boxes of min(PAGE, BN) keys."""
    B, H, Hkv, SQ, SKV, D, dt = (p[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "dtype"))
    G, e = H // Hkv, 2
    gbox, sbox = packing(p, t["BM"])
    st = {"q": (SQ * H * D, H * D, D), "k": (SKV * Hkv * D, Hkv * D, D), "v": (SKV * Hkv * D, Hkv * D, D)}
    st |= strides or {}
    kv = {n: kv_map(p, t, n, st[n]) if paged is None else paged_map(p, t, n, st[n], *paged) for n in ("k", "v")}
    sb, ss, sh = st["q"]
    # q as (d, head in group, kv head, position, batch): one box is a packed query tile
    return (TensorMapSpec("q", dt, (D, G, Hkv, SQ, B), (sh * e, G * sh * e, ss * e, sb * e), (64, gbox, 1, sbox, 1)),
            kv["k"], kv["v"])


def kv_map(p: Mapping[str, Any], t: Mapping[str, int], name: str, strides: tuple[int, int, int]) -> TensorMapSpec:
    """``maps``' map of k or v (``name``) [B, Skv, Hkv, D] with element ``strides`` (batch, position, head)."""
    e = 2
    return TensorMapSpec(name, p["dtype"], (p["head_dim"], p["kv_heads"], p["seq_kv"], p["batch"]),
                         (strides[2] * e, strides[1] * e, strides[0] * e), (64, 1, t["BN"], 1))


def paged_map(p: Mapping[str, Any], t: Mapping[str, int], name: str, strides: tuple[int, int, int], pages: int,
              page: int) -> TensorMapSpec:
    """``maps``' map of a paged k or v [pages, page, Hkv, D] with element ``strides`` (page, key, head)."""
    e = 2
    return TensorMapSpec(name, p["dtype"], (p["head_dim"], p["kv_heads"], page, pages),
                         (strides[2] * e, strides[1] * e, strides[0] * e), (64, 1, min(page, t["BN"]), 1))


def sizes_at(sz: Mapping[str, int], skv: int) -> dict[str, int]:
    """``sizes`` of the same shape with ``skv`` keys, from ``sz`` of a key count in the same BN-wide key block
    (the sizes depend on the key count only through its key blocks, but SKV itself: tests/codegen)."""
    return dict(sz, SKV=skv)


def generic_workspace(p: Mapping[str, Any], sz: Mapping[str, int]) -> dict[str, int]:
    """``workspace`` of a generic launch with sizes ``sz``: a slot per (batch, kv head, query tile, piece)."""
    rows = sz["B_"] * sz["HKV"] * sz["NQT"] * sz["NSP"] * sz["GB"] * sz["SB"]
    return {"ws": 4 * rows * p["head_dim"], "lse": 4 * rows, "cnt": 2 * 4 * sz["B_"] * sz["HKV"] * sz["NQT"]}


def workspace(ir: KernelIR) -> dict[str, int]:
    """Bytes of the scratch buffers a launch needs (codegen.runtime.workspace_ptrs zero-fills them once):
    ``ws`` (fp32 partial O, D per row), ``lse`` (fp32), ``cnt`` (int32 counters per query tile: its pieces done, then
    its merge CTAs done; zero before the first launch, and the kernel leaves them zero)."""
    p, t = ir.params, ir.tiling
    tiles = p["batch"] * p["kv_heads"] * query_tiles(p, t["BM"])
    rows = max(1, p["batch"] * p["kv_heads"] * _bases(ir)[1] * packing(p, t["BM"])[0] * packing(p, t["BM"])[1])
    return {"ws": 4 * rows * p["head_dim"], "lse": 4 * rows, "cnt": 2 * 4 * tiles}


def _signature(ir: KernelIR) -> tuple[tuple[str, str], ...]:
    out = (("ptr:o", f"{CTYPE[ir.params['dtype']]}* __restrict__ out"), ("ptr:ws", "float* __restrict__ ws"),
           ("ptr:lse", "float* __restrict__ lse"), ("ptr:cnt", "int* __restrict__ cnt"))
    # a generic build: seqlens (int32 per batch, the keys each sequence attends to; null: all SKV) and a paged
    # cache's page table (int32 [B, MAXP]; null: a dense cache)
    if not ir.generic:
        return out
    # a softcap build: the cap's value is a launch argument (SOFTCAP_PRE = scale / softcap; SCALE_LOG2 then
    # softcap · log2 e), so one binary serves every model's cap
    cap = (("f32:softcap_pre", "const float SOFTCAP_PRE"),) if ir.params.get("softcap") else ()
    return out + (("f32:scale_log2", "const float SCALE_LOG2"), ("ptr:seqlens", "const int* __restrict__ seqlens"),
                  ("ptr:page_table", "const int* __restrict__ page_table")) + cap


def _fill_bytes(ir: KernelIR, task: str) -> str | None:
    """A generic build's query tile is the shape's packed box (``packing``: PR rows), not the whole tile."""
    return "PR * D * 2" if ir.generic and task == "load_q" else None


def _info(ir: KernelIR) -> dict[str, Any]:
    if ir.generic:  # the launcher sizes the workspace and the grid per shape (ptsolve.serve)
        return {"pieces": "per shape"}
    return {"workspace": workspace(ir), "pieces": _nmax(ir), "ctas_per_row": len(_work(ir)),
            "merge_ctas_per_row": len(_merges(ir))}


REGISTRY[OP] = OpKernel(
    op=OP, check=_check, device=_device, consts=_consts, maps=lambda ir: maps(ir.params, ir.tiling),
    signature=_signature, tiles=_tiles, decls=attention._decls, body=_body, entry=_entry,
    # a generic launch adds its merge CTAs to the grid itself (``grid``)
    extra_ctas=lambda ir: 0 if ir.generic else len(_merges(ir)) * ir.params["batch"] * ir.params["kv_heads"],
    min_trips=1,  # every piece that runs has at least one key block
    info=_info, sizes=sizes, size_params=SIZE_PARAMS, launch_tiling=("splits",), exact_consts=True,
    fill_bytes=_fill_bytes)
