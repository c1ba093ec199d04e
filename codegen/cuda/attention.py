"""FlashAttention forward task bodies (GQA, causal bottom-right aligned, ragged sequence lengths).

Layout: q/o [B, Sq, H, D], k/v [B, Skv, Hkv, D] (FlashAttention's), softmax scale 1/sqrt(D) in an exact-shape build.
A shape-generic build (``KernelIR.generic``) takes batch, heads, kv_heads, seq_q, seq_kv (the longest, for varlen)
as arguments, plus the softmax scale (``SCALE_LOG2`` = scale · log2 e) and optional ``cu_q`` / ``cu_k`` (int32
[B+1] prefix sums: varlen, q/k/v packed [total, H(kv), D], tensor maps of one "batch" over the packed rows). Causal
is bottom-right aligned per sequence for any seq_q, seq_kv: a query block that sees no key (seq_q > seq_kv) is
stored as zeros, as FlashAttention does. With varlen a tile's last K/V block may read the next sequence's rows:
their scores are masked to -inf, so they count only through P = 0 (finite values assumed). A tile is BM query
rows of one (batch, head); consumer warpgroup g owns rows 64g..64g+63. A generic build also takes ``used_q`` /
``used_k`` (int32 [B], FlashAttention's ``seqused_q`` / ``seqused_k``: a varlen sequence's rows that count, from its
``cu_*`` start; rows past them are neither read as keys nor written). A sliding window (``window_left`` /
``window_right`` in the parameters; ``WL`` / ``WR``, -1 unbounded) starts a query block's loop at its band's first
key block ``T0`` and masks the band's edges; a softcap (``softcap``) caps each score in rowmax,
tanh(s · scale / softcap) through ``SOFTCAP_PRE`` = scale / softcap, the exp2 domain's scale then being softcap ·
log2 e. Either is built in only where the parameters ask for it.
Per key block of BN keys: S = Q Kᵀ
(``mma_qk``: wgmma, both operands in shared memory, K-major), the online softmax in registers in the exp2
domain (``rowmax``, ``exp2``, ``rowsum``, which packs P into wgmma A fragments, ``rescale`` of O), O += P V
(``mma_pv``: wgmma with P from registers, V MN-major). Ragged tails: TMA zero-fills out-of-range rows,
scores of keys >= seq_kv (and above the causal diagonal) become -inf, rows >= seq_q are not stored. A
double-buffered score or P buffer (the schedule's copies) is picked by the parity of the iteration.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ptsolve.errors import CodegenError, UnsupportedOperatorError
from ptsolve.geometry.attention import head_cols
from ptsolve.ir import DTYPE_BYTES

from ..kernel_ir import KernelIR, Role
from .common import CTYPE, PACK2, PTXTYPE, TensorMapSpec, check_dtype, wgmma_rs, wgmma_ss
from .skeleton import REGISTRY, OpKernel, Task


def check_tile(op: str, ir: KernelIR) -> None:
    """CodegenError unless the task bodies (shared with flash_decode) take the dtype, head_dim and query rows."""
    p, t = ir.params, ir.tiling
    check_dtype(p)
    D = p["head_dim"]
    if D % 16 or not 64 <= D <= 256 or (op != "flash_attention" and D not in (64, 128)):
        what = "a multiple of 16 from 64 to 256" if op == "flash_attention" else "64 or 128"
        raise UnsupportedOperatorError(f"{op}: the CUDA generator supports head_dim {what}, got {D}")
    tile_rows(op, p, t)


def tile_rows(op: str, p: Mapping[str, Any], t: Mapping[str, int]) -> None:
    """CodegenError unless each consumer warpgroup owns one 64-row M tile (the bodies index rows as 64g + ...): the
    tilings of two M tiles per warpgroup, which MI300X's generator builds, are not this one's."""
    if t["BM"] != 64 * t["groups"]:
        raise CodegenError(f"{op}: BM={t['BM']} must be 64 query rows per consumer warpgroup")


def _check(ir: KernelIR) -> None:
    p = ir.params
    check_tile("flash_attention", ir)
    # element offsets into o are 64-bit (``store``) and q/k/v go through TMA coordinates, so tensors of 2^31 elements
    # and more run; what stays 32-bit is a row index batch·seq (and each TMA coordinate)
    if p["batch"] * max(p["seq_q"], p["seq_kv"]) >= 1 << 31:
        rows = p["batch"] * max(p["seq_q"], p["seq_kv"])
        raise UnsupportedOperatorError(f"flash_attention: batch·seq = {rows} rows; the kernel's row indices are "
                                       "32-bit: split the batch into launches of fewer than 2^31 rows")


def _copies(ir: KernelIR, buf: str, g: int) -> int:
    return ir.copies.get(f"{buf}@{g}", 1)


SIZE_PARAMS = ("batch", "heads", "kv_heads", "seq_q", "seq_kv")


def sizes(p: Mapping[str, Any], t: Mapping[str, int]) -> dict[str, int]:
    """The sizes a generic build takes at launch (seq_q / seq_kv: the longest sequence for varlen), NTILES last."""
    nmb = -(-p["seq_q"] // t["BM"])
    return {"B_": p["batch"], "H": p["heads"], "HKV": p["kv_heads"], "SQ": p["seq_q"], "SKV": p["seq_kv"],
            "NMB": nmb, "NTILES": nmb * p["heads"] * p["batch"]}


def _dp(ir: KernelIR) -> str:
    """The head-dim columns of the tiles and of O in the kernel's source: ``D``, or ``DP`` where head_dim is not whole
    swizzle atoms (geometry.attention.head_cols; a head_dim-64/128 kernel's source does not change)."""
    return "D" if head_cols(ir.params["head_dim"]) == ir.params["head_dim"] else "DP"


def _window(ir: KernelIR) -> bool:
    return "window_left" in ir.params


def _consts(ir: KernelIR) -> str:
    p, t = ir.params, ir.tiling
    D = p["head_dim"]
    dp = "" if _dp(ir) == "D" else f"DP = {head_cols(D)}, "
    sc = p.get("softcap", 0.0)
    log2s = math.log2(math.e) * (sc if sc else 1 / math.sqrt(D))
    scale = ("" if ir.generic else
             f"  constexpr float SCALE_LOG2 = {log2s!r}f;  // log2(e) / sqrt(D), or log2(e) · softcap\n"
             "  constexpr int* cu_q = nullptr; constexpr int* cu_k = nullptr;\n"
             "  constexpr int* used_q = nullptr; constexpr int* used_k = nullptr;\n"
             + (f"  constexpr int WL = {p['window_left']}, WR = {p['window_right']};\n" if _window(ir) else "")
             + (f"  constexpr float SOFTCAP_PRE = {1 / (math.sqrt(D) * sc)!r}f;\n" if sc else ""))
    return (f"  constexpr int D = {D}, {dp}DCH = {_dp(ir)} / 64, BM = {t['BM']}, BN = {t['BN']};\n"
            f"  constexpr bool CAUSAL = {'true' if p['causal'] else 'false'};\n" + scale +
            "  const bool VARLEN = cu_q != nullptr; (void)VARLEN;")


def _tiles(ir: KernelIR) -> tuple[int | str, str]:
    n = "NTILES" if ir.generic else sizes(ir.params, ir.tiling)["NTILES"]
    # causal: the longest query blocks (most keys) first: within a (head, batch) on a grid, over all tiles when
    # persistent
    split = ("  const int mb_ = tile / (H * B_), hq = tile % H, bz = (tile / H) % B_;\n" if ir.persistent else
             "  const int mb_ = tile % NMB, hq = (tile / NMB) % H, bz = tile / (NMB * H);\n")
    # this sequence: its lengths, its first row and batch coordinate in the tensor maps (varlen: one batch of packed
    # rows), the output row of its query 0
    seq = ("  const int QR = VARLEN ? cu_q[bz] : 0, KR = VARLEN ? cu_k[bz] : 0, QB = VARLEN ? 0 : bz, "
           "KB = VARLEN ? 0 : bz;\n"
           "  const int SQB = VARLEN ? (used_q != nullptr ? used_q[bz] : cu_q[bz + 1] - QR) : SQ;\n"
           "  const int SKVB = VARLEN ? (used_k != nullptr ? used_k[bz] : cu_k[bz + 1] - KR) : SKV;\n"
           "  const size_t OROW = (size_t)QB * SQ + QR;\n  (void)OROW; (void)KR; (void)KB; (void)QR;\n")
    # only a generic build meets a query block beyond a shorter sequence or one that sees no key (causal, seq_q >
    # seq_kv: stored as zeros, as FlashAttention's); an exact build needs seq_q <= seq_kv and keeps these branches
    # out of its tile loop (ptxas serialises a persistent kernel's wgmma across them)
    skip = "" if not ir.generic else "  if (m0 >= SQB) skip_ = true;  // varlen: a shorter sequence than the longest\n"
    # a window's band: the blocks from the first row's first key (T0) to the last row's last; a block none of whose
    # rows sees a key is stored as zeros, in an exact build too
    band = "" if not _window(ir) else (
        "  int T0 = 0;\n"
        "  if (WL >= 0) { const int lo = m0 + OFF - WL; T0 = lo > 0 ? lo / BN : 0; }\n"
        "  if (!CAUSAL && WR >= 0) { const int hi = m0 + BM - 1 + OFF + WR; const int lim = hi < 0 ? 0 : hi / BN + 1;"
        " T = lim < T ? lim : T; }\n"
        "  T -= T0;\n")
    # where a generic build writes the log-sum-exp of its rows: [B, H, SQ], or [H, total_q] for varlen (FA3's)
    lse = "" if not ir.generic else (
        "  const size_t LSE_B = lse == nullptr ? 0 : VARLEN ? (size_t)hq * cu_q[B_] + QR\n"
        "                                                   : ((size_t)bz * H + hq) * SQ;\n"
        "  (void)LSE_B;\n")
    zero = "" if not (ir.generic or _window(ir)) else (
        "  if (!skip_ && T <= 0) {  // no key for this query block: zeros\n"
        "    if (wg > 0)\n"
        f"      for (int i = threadIdx.x - 128; i < BM * (D / 8); i += {ir.threads - 128}) {{\n"
        "        const int r = m0 + i / (D / 8);\n"
        "        if (r < SQB) reinterpret_cast<uint4*>(out + ((OROW + r) * H + hq) * D)[i % (D / 8)] = "
        "make_uint4(0u, 0u, 0u, 0u);\n"
        "      }\n"
        + ("    if (wg > 0 && lse != nullptr)  // FlashAttention's log-sum-exp of a row that sees no key: +inf\n"
           f"      for (int r = m0 + threadIdx.x - 128; r < m0 + BM && r < SQB; r += {ir.threads - 128}) "
           "lse[LSE_B + r] = INFINITY;\n" if ir.generic else "") +
        "    skip_ = true;\n  }")
    return n, (split + seq + "  const int mb = CAUSAL ? (NMB - 1 - mb_) : mb_;\n"
               "  const int m0 = mb * BM, hkv = hq / (H / HKV);\n  (void)hkv;\n" + skip + lse +
               "  const int OFF = SKVB - SQB;  // bottom-right aligned causal mask: query i sees keys <= i + OFF\n"
               "  int T = (SKVB + BN - 1) / BN;  // key blocks this query block visits\n"
               "  if (CAUSAL) { const int lim = (m0 + BM + OFF + BN - 1) / BN; T = lim < T ? lim : T; }\n" + band
               + zero)


def _decls(ir: KernelIR, role: Role) -> str:
    g = role.group
    out = [f"constexpr int ROW0 = {64 * g};", f"float o[{_dp(ir)} / 2];",
           "float m_r[2], l_r[2], alpha[2], muse[2], inv_l[2];"]
    for i in range(_copies(ir, "p", g)):
        out += [f"uint32_t pf{i}_flat[BN / 4];",
                f"uint32_t (&pf{i})[BN / 16][4] = *reinterpret_cast<uint32_t (*)[BN / 16][4]>(pf{i}_flat);"]
    out += [f"float sacc{i}[BN / 2];" for i in range(_copies(ir, "s", g))]
    return "\n".join(out)


def _buf(t: Task, buf: str) -> str:
    """The register copy of ``buf`` (``sacc`` / ``pf``) iteration ``t`` uses."""
    c = _copies(t.ir, "s" if buf == "sacc" else "p", t.role.group)
    return f"{buf}{t.parity if c == 2 and t.parity is not None else 0}"


def row_max(S: str) -> list[str]:
    """The running row max of the (masked) scores ``S`` and the rescale factor of O (also the split-KV bodies')."""
    return ["#pragma unroll", "  for (int hh = 0; hh < 2; ++hh) {",
            f"    float mx = {S}[2 * hh];", "#pragma unroll", "    for (int j = 0; j < BN / 8; ++j)",
            f"      mx = fmaxf(mx, fmaxf({S}[4 * j + 2 * hh], {S}[4 * j + 2 * hh + 1]));",
            "    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));",
            "    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));",
            "    const float mn = fmaxf(m_r[hh], mx * SCALE_LOG2);",
            "    const float mu = (mn == -INFINITY) ? 0.f : mn;  // a fully masked row so far: keep exp2 finite",
            "    alpha[hh] = fast_exp2(m_r[hh] - mu);", "    m_r[hh] = mn;", "    muse[hh] = mu;", "  }"]


def _mask(S: str) -> list[str]:
    """Scores past the sequence's keys and above the causal diagonal to -inf (only in a tile that crosses an edge)."""
    return [
        "  const int kb = it_ * BN;",
        "  if (kb + BN > SKVB || (CAUSAL && kb + BN - 1 > m0 + ROW0 + OFF)) {  // the tile crosses a mask edge",
        # key = kb + 2 (lane & 3) + 8 j + c, row = m0 + ROW0 + 16 w + (lane >> 2) + 8 hh. Each test is one
        # compare of a per-tile value against a constant (equal constants shared across elements); causal
        # masks key > row + OFF, which covers key >= SKVB for every row < SQB, the only rows stored. In
        # key/row form ptxas proved the operands non-negative, compared unsigned and kept two ISETP per
        # element (65 instead of 35 in FlashAttention's steady loop).
        "    const int k0 = kb + 2 * (lane & 3), kl = SKVB - k0;",
        "    const int kr = m0 + ROW0 + w * 16 + (lane >> 2) + OFF - k0; (void)kr; (void)kl;",
        "#pragma unroll", "    for (int j = 0; j < BN / 8; ++j)", "#pragma unroll",
        "      for (int hh = 0; hh < 2; ++hh)", "#pragma unroll", "        for (int c = 0; c < 2; ++c) {",
        "          const int dk = 8 * j + c - 8 * hh;  // key - row, less this thread's kr: a constant",
        f"          if (CAUSAL ? dk > kr : dk + 8 * hh >= kl) {S}[4 * j + 2 * hh + c] = -INFINITY;",
        "        }", "  }"]


def _window_mask(S: str) -> list[str]:
    """``_mask`` with a sliding window's band: a key is kept where row + OFF - WL <= key <= row + OFF + RR and key <
    SKVB (RR: 0 for causal, else WR; -1 edges unbounded); the same per-tile constants, compared once per score."""
    return [
        "  const int kb = (T0 + it_) * BN, RR = CAUSAL ? 0 : WR;",
        "  if (kb + BN > SKVB || (RR >= 0 && kb + BN - 1 > m0 + ROW0 + OFF + RR)",
        "      || (WL >= 0 && kb < m0 + ROW0 + 63 + OFF - WL)) {  // the tile crosses an edge of the band",
        "    const int k0 = kb + 2 * (lane & 3), kl = SKVB - k0;",
        "    const int kr = m0 + ROW0 + w * 16 + (lane >> 2) + OFF - k0;",
        "    const int kR = RR >= 0 ? kr + RR : (1 << 30), kL = WL >= 0 ? kr - WL : -(1 << 30);",
        "#pragma unroll", "    for (int j = 0; j < BN / 8; ++j)", "#pragma unroll",
        "      for (int hh = 0; hh < 2; ++hh)", "#pragma unroll", "        for (int c = 0; c < 2; ++c) {",
        "          const int dk = 8 * j + c - 8 * hh;  // key - row - OFF, less this thread's kr",
        f"          if (dk > kR || dk < kL || dk + 8 * hh >= kl) {S}[4 * j + 2 * hh + c] = -INFINITY;",
        "        }", "  }"]


def _softcap(ir: KernelIR, S: str) -> list[str]:
    """Each score capped, tanh(s · SOFTCAP_PRE), before the mask (a masked score is -inf whatever it was); the
    softcap itself is in SCALE_LOG2."""
    if not ir.params.get("softcap"):
        return []
    return ["#pragma unroll", "  for (int i = 0; i < BN / 2; ++i)", f"    {S}[i] = fast_tanh({S}[i] * SOFTCAP_PRE);"]


TANH = """
__device__ __forceinline__ float fast_tanh(float x) {  // MUFU.TANH, as FlashAttention's softcap
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""


def _pack(t: Task, S: str) -> list[str]:
    """P (rowsum's register buffer) packed into the wgmma A fragments: the fp32 accumulator layout of S is the
    A-fragment layout once packed in pairs."""
    P, dt = _buf(t, "pf"), t.ir.params["dtype"]
    lines = [f"  fence_regs({P}_flat);"]
    for kk in range(t.ir.tiling["BN"] // 16):
        for r in range(4):
            lines.append(f"  {P}[{kk}][{r}] = {PACK2[dt]}({S}[{8 * kk + 2 * r}], {S}[{8 * kk + 2 * r + 1}]);")
    return lines


def _body(t: Task) -> str:
    ir, b = t.ir, t.base
    p, BN = ir.params, ir.tiling["BN"]
    D, dt = p["head_dim"], p["dtype"]
    if b in ("load_q", "load_k", "load_v"):
        kb = "(T0 + it_) * BN" if _window(ir) else "it_ * BN"
        dst, row, rows = {"load_q": ("q_s", "m0", "BM"), "load_k": ("k_cur", kb, "BN"),
                          "load_v": ("v_cur", kb, "BN")}[b]
        head, r0, bb = ("hq", "QR", "QB") if b == "load_q" else ("hkv", "KR", "KB")
        return ("#pragma unroll\n  for (int c = 0; c < DCH; ++c)\n"
                f"    tma_load_4d({dst} + c * {rows} * 128, &tm_{b[-1]}, fbar_, c * 64, {head}, {r0} + {row}, {bb});")
    S = _buf(t, "sacc")
    if b == "init":
        return (f"#pragma unroll\nfor (int i = 0; i < {_dp(ir)} / 2; ++i) o[i] = 0.f;\n"
                "m_r[0] = m_r[1] = -INFINITY; l_r[0] = l_r[1] = 0.f; alpha[0] = alpha[1] = 0.f; "
                "muse[0] = muse[1] = 0.f;")
    if b == "mma_qk":
        lines = ["  const uint32_t sq = smem_u32(q_s) + ROW0 * 128, sk = smem_u32(k_cur);", "  wg_fence();"]
        for kk in range(D // 16):
            c, off = divmod(kk, 4)
            fn, last = (f"wgmma_ss_n{BN}_{PTXTYPE[dt]}", ", 1") if kk else (f"wgmma_ss_n{BN}_{PTXTYPE[dt]}_z", "")
            lines.append(f"  {fn}({S}, make_desc(sq + {c * ir.tiling['BM'] * 128 + off * 32}, 16, 1024), "
                         f"make_desc(sk + {c * BN * 128 + off * 32}, 16, 1024){last});")
        return "\n".join([*lines, "  wg_commit();"])
    if b == "rowmax":
        return "\n".join([f"  fence_regs({S});", *_softcap(ir, S), *(_window_mask(S) if _window(ir) else _mask(S)),
                          *row_max(S)])
    if b == "exp2":
        return "\n".join([
            "#pragma unroll", "  for (int j = 0; j < BN / 8; ++j)", "#pragma unroll", "    for (int i = 0; i < 4; ++i)",
            f"      {S}[4 * j + i] = fast_exp2(fmaf({S}[4 * j + i], SCALE_LOG2, -muse[i >> 1]));",
            *(_pack(t, S) if t.early else [])])
    if b == "rowsum":
        # per-thread partial sums (the 4 lanes of a row are combined once, in normalize); then P is packed into
        # the wgmma A fragments, unless exp2 did (OpKernel.early: the skeleton found it free there)
        lines = ["#pragma unroll", "  for (int hh = 0; hh < 2; ++hh) {", "    float sm = 0.f;", "#pragma unroll",
                 "    for (int j = 0; j < BN / 8; ++j)", f"      sm += {S}[4 * j + 2 * hh] + {S}[4 * j + 2 * hh + 1];",
                 "    l_r[hh] = l_r[hh] * alpha[hh] + sm;", "  }"]
        return "\n".join(lines + ([] if t.early else _pack(t, S)))
    if b == "rescale":
        # all of O, the padded columns too (head_dim 96: DP = 128; they hold P·0): a rescale of part of an accumulator
        # a wgmma then accumulates into makes ptxas serialise the pipeline (C7511; bench study compile_verdicts)
        return "\n".join(["  fence_regs(o);", "#pragma unroll", f"  for (int j = 0; j < {_dp(ir)} / 8; ++j)",
                          "#pragma unroll", "    for (int i = 0; i < 4; ++i)", "      o[4 * j + i] *= alpha[i >> 1];"])
    if b == "mma_pv":
        P = _buf(t, "pf")
        lines = ["  const uint32_t sv = smem_u32(v_cur);", "  wg_fence();"]
        for kk in range(BN // 16):
            lines.append(f"  wgmma_rs_n{head_cols(D)}_{PTXTYPE[dt]}_t1(o, {P}[{kk}], make_desc(sv + {kk * 16 * 128}, "
                         "BN * 128, 1024));")
        return "\n".join([*lines, "  wg_commit();"])
    if b == "normalize":
        return "\n".join([
            "fence_regs(o);", "#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {",
            "  float l = l_r[hh];", "  l += __shfl_xor_sync(0xffffffff, l, 1);",
            "  l += __shfl_xor_sync(0xffffffff, l, 2);", "  inv_l[hh] = l > 0.f ? 1.f / l : 0.f;", "}",
            "#pragma unroll", "for (int j = 0; j < D / 8; ++j)", "#pragma unroll", "  for (int i = 0; i < 4; ++i)",
            "    o[4 * j + i] *= inv_l[i >> 1];"])
    assert b == "store", b
    return _store(t)


def _store(t: Task) -> str:
    """O's rows to global memory (rows past seq_q are not written); a generic build also writes the rows'
    log-sum-exp where the caller asks (lse != nullptr): ln(l) + m ln 2, the running max m being in the exp2 domain;
    +inf for a row that saw no key, as FlashAttention-3 returns."""
    ir, dt = t.ir, t.ir.params["dtype"]
    lse = ["  if (lse != nullptr && (lane & 3) == 0 && row < SQB)",
           "    lse[LSE_B + row] = inv_l[hh] > 0.f ? m_r[hh] * 0.6931471805599453f - __logf(inv_l[hh]) : INFINITY;"
           ] if ir.generic else []
    return "\n".join([
        "#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {",
        "  const int row = m0 + ROW0 + w * 16 + (lane >> 2) + 8 * hh;",
        "  if (row < SQB) {  // ragged tail: rows past seq_q are not written",
        "    uint32_t* orow = reinterpret_cast<uint32_t*>(out + ((OROW + row) * H + hq) * D);",
        "#pragma unroll", "    for (int j = 0; j < D / 8; ++j)",
        f"      orow[4 * j + (lane & 3)] = {PACK2[dt]}(o[4 * j + 2 * hh], o[4 * j + 2 * hh + 1]);",
        "  }", *lse, "}"])


def tensor_map(name: str, dt: str, D: int, heads: int, rows: int, batches: int, strides: tuple[int, int, int],
               box_rows: int) -> TensorMapSpec:
    """The tensor map of q, k or v viewed as [batches, rows, heads, D] with element ``strides`` (batch, row, head;
    D contiguous); varlen is one batch of packed rows."""
    sb, sr, sh = strides
    return TensorMapSpec(name, dt, (D, heads, rows, batches), (sh * 2, sr * 2, sb * 2), (64, 1, box_rows, 1))


def maps(p: Mapping[str, Any], t: Mapping[str, int]) -> tuple[TensorMapSpec, ...]:
    """Tensor maps of contiguous q [B, Sq, H, D] and k, v [B, Skv, Hkv, D]."""
    B, H, Hkv, SQ, SKV, D, dt = (p[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "dtype"))
    return (tensor_map("q", dt, D, H, SQ, B, (SQ * H * D, H * D, D), t["BM"]),
            tensor_map("k", dt, D, Hkv, SKV, B, (SKV * Hkv * D, Hkv * D, D), t["BN"]),
            tensor_map("v", dt, D, Hkv, SKV, B, (SKV * Hkv * D, Hkv * D, D), t["BN"]))


def _fill_bytes(ir: KernelIR, task: str) -> str | None:
    """TMA counts the whole box, zero-filled columns past head_dim included: where the tiles are padded
    (geometry.attention.head_cols) a fill delivers more bytes than the load reads from memory (the task's bytes)."""
    p, t = ir.params, ir.tiling
    cols = head_cols(p["head_dim"])
    if cols == p["head_dim"]:
        return None
    return str((t["BM"] if task == "load_q" else t["BN"]) * cols * DTYPE_BYTES[p["dtype"]])


def _signature(ir: KernelIR) -> tuple[tuple[str, str], ...]:
    out = (("ptr:o", f"{CTYPE[ir.params['dtype']]}* __restrict__ out"),)
    if ir.generic:
        out += (("ptr:cu_q", "const int* __restrict__ cu_q"), ("ptr:cu_k", "const int* __restrict__ cu_k"),
                ("f32:scale_log2", "const float SCALE_LOG2"), ("ptr:lse", "float* __restrict__ lse"),
                ("ptr:used_q", "const int* __restrict__ used_q"), ("ptr:used_k", "const int* __restrict__ used_k"))
        if _window(ir):
            out += (("i32:wl", "const int WL"), ("i32:wr", "const int WR"))
        if ir.params.get("softcap"):
            out += (("f32:softcap_pre", "const float SOFTCAP_PRE"),)
    return out


REGISTRY["flash_attention"] = OpKernel(
    op="flash_attention", check=_check,
    device=lambda ir: wgmma_ss(ir.tiling["BN"], ir.params["dtype"]) + wgmma_rs(head_cols(ir.params["head_dim"]),
                                                                                ir.params["dtype"], 1)
    + (TANH if ir.params.get("softcap") else ""),
    consts=_consts, maps=lambda ir: maps(ir.params, ir.tiling), signature=_signature,
    # a query block that sees no key is stored as zeros and skipped (T <= 0), so every tile that runs has T >= 1
    tiles=_tiles, decls=_decls, body=_body, early={"rowsum": "exp2"}, min_trips=1,
    info=lambda ir: {"score_buffers": [_copies(ir, "s", g) for g in range(ir.groups)]},
    sizes=sizes, size_params=SIZE_PARAMS, fill_bytes=_fill_bytes,
    tiling_check=lambda p, t: tile_rows("flash_attention", p, t))
