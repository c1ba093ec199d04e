"""FlashAttention forward task bodies for gfx942 (GQA, causal bottom-right aligned, ragged sequence lengths).

Layouts as the CUDA kernel: q/o [B, Sq, H, D], k/v [B, Skv, Hkv, D], softmax scale 1/sqrt(D). A tile is BM query
rows of one (batch, head); consumer group g owns BM/groups rows, each of its four waves a quarter (16 or 32 rows).
The producer copies Q (once per tile), K (row-major) and V (transposed: Vᵀ[d][key]) into swizzled LDS slots, zero
outside the sequences.

Per key block a wave computes Sᵀ = K·Qᵀ with MFMA 32x32x8 (16x16x16 for 16-row waves or 16-wide blocks): lane
``lane % TM`` of every accumulator holds one query, so the online softmax (``rowmax``, ``exp2``, ``rowsum``,
``rescale``) works on that lane's registers plus shuffles across the 2 or 4 lanes sharing the query; the
probabilities packed from 4 consecutive accumulator registers are exactly the B fragments of Oᵀ += Vᵀ·Pᵀ
(``mma_pv``), and every Oᵀ register of a lane again belongs to its query. Scores of keys >= seq_kv (and above the
causal diagonal) become -inf; rows >= seq_q are not stored. A score or P buffer with two copies (the schedule's
``copies``) is picked by the parity of the iteration.
"""
from __future__ import annotations

import math

from ptsolve.errors import CodegenError, UnsupportedOperatorError

from ..kernel_ir import KernelIR, Role
from .common import (
    GROUP_WAVES,
    LdsTile,
    acc_regs,
    acc_row,
    copy_rows,
    copy_rows_regs,
    copy_transposed,
    copy_transposed_regs,
    mfma_k,
)
from .skeleton import REGISTRY, OpKernel, Task


def _geom(ir: KernelIR) -> dict[str, int]:
    p, t = ir.params, ir.tiling
    D, BN = p["head_dim"], t["BN"]
    rg = t["BM"] // t["groups"]
    rw = rg // GROUP_WAVES
    tm = 32 if rw % 32 == 0 and BN % 32 == 0 and D % 32 == 0 else 16
    return {"D": D, "BN": BN, "RG": rg, "RW": rw, "TM": tm, "KS": mfma_k(tm), "QT": rw // tm, "KT": BN // tm,
            "DT": D // tm, "NR": acc_regs(tm), "NPF": BN // mfma_k(tm)}


def _check(ir: KernelIR) -> None:
    p, t = ir.params, ir.tiling
    rg = t["BM"] // t["groups"]
    if rg % (16 * GROUP_WAVES) or t["BN"] % 16 or p["head_dim"] % 16:
        raise CodegenError(f"flash_attention: BM/groups={rg} must be a multiple of {16 * GROUP_WAVES} (16 rows per "
                           f"wave) and BN={t['BN']}, head_dim={p['head_dim']} multiples of 16 (the MFMA tile)")
    if p["batch"] * p["heads"] * p["seq_q"] * p["head_dim"] >= 1 << 31 or \
            p["batch"] * p["kv_heads"] * p["seq_kv"] * p["head_dim"] >= 1 << 31:
        raise UnsupportedOperatorError("flash_attention: a tensor of 2^31 elements or more; the kernel's indices are "
                                       "32-bit")


def _copies(ir: KernelIR, buf: str, g: int) -> int:
    return ir.copies.get(f"{buf}@{g}", 1)


def _consts(ir: KernelIR) -> str:
    p, t = ir.params, ir.tiling
    D = p["head_dim"]
    return (f"  constexpr int H = {p['heads']}, HKV = {p['kv_heads']}, SQ = {p['seq_q']}, SKV = {p['seq_kv']};\n"
            f"  constexpr int D = {D}, BM = {t['BM']}, BN = {t['BN']}, B_ = {p['batch']};\n"
            f"  constexpr int NMB = {-(-p['seq_q'] // t['BM'])}, NKB = {-(-p['seq_kv'] // t['BN'])};\n"
            f"  constexpr bool CAUSAL = {'true' if p['causal'] else 'false'};\n"
            "  constexpr int OFF = SKV - SQ;  // bottom-right aligned causal mask: query i sees keys <= i + OFF\n"
            f"  constexpr float SCALE_LOG2 = {math.log2(math.e) / math.sqrt(D)!r}f;  // log2(e) / sqrt(D)")


def _tiles(ir: KernelIR) -> tuple[int, str]:
    p = ir.params
    n = -(-p["seq_q"] // ir.tiling["BM"]) * p["heads"] * p["batch"]
    split = ("  const int mb_ = tile / (H * B_), hq = tile % H, bz = (tile / H) % B_;\n" if ir.persistent else
             "  const int mb_ = tile % NMB, hq = (tile / NMB) % H, bz = tile / (NMB * H);\n")
    return n, (split + "  const int mb = CAUSAL ? (NMB - 1 - mb_) : mb_;  // causal: the longest query blocks first\n"
               "  const int m0 = mb * BM, hkv = hq / (H / HKV);\n  (void)hkv;\n"
               "  int T = NKB;  // key blocks this query block visits\n"
               "  if (CAUSAL) { const int lim = (m0 + BM + OFF + BN - 1) / BN; T = lim < T ? lim : T; }")


def _lds(ir: KernelIR, buf: str) -> LdsTile:
    q = _geom(ir)
    return {"q": LdsTile(ir.tiling["BM"], q["D"]), "k": LdsTile(q["BN"], q["D"]), "v": LdsTile(q["D"], q["BN"])}[buf]


def _copy(ir: KernelIR, task: str, it: str) -> tuple[str, str]:
    q = _geom(ir)
    if task == "load_q":
        src = "reinterpret_cast<const u32x4*>(qp + ((size_t)(bz * SQ + m0 + r_) * H + hq) * D + c_)"
        return copy_rows(_lds(ir, "q"), "stg_q", src, "m0 + r_ < SQ")
    x = task[-1]
    src = f"reinterpret_cast<const u32x4*>({x}p + ((size_t)(bz * SKV + ({it}) * BN + r_) * HKV + hkv) * D + c_)"
    ok = f"({it}) * BN + r_ < SKV"
    if x == "k":
        return copy_rows(_lds(ir, "k"), "stg_k", src, ok)
    stage, commit, _ = copy_transposed(q["BN"], q["D"], "stg_v", src, ok)
    return stage, commit


def _pdecls(ir: KernelIR) -> str:
    q = _geom(ir)
    return (f"    u32x4 stg_q[{copy_rows_regs(_lds(ir, 'q'))}]; u32x4 stg_k[{copy_rows_regs(_lds(ir, 'k'))}];\n"
            f"    u32x4 stg_v[{copy_transposed_regs(q['BN'], q['D'])}][4];")


def _decls(ir: KernelIR, role: Role) -> str:
    q = _geom(ir)
    g = role.group
    vec = "f32x16" if q["TM"] == 32 else "f32x4"
    out = [f"const int QROW = {g * q['RG']} + wq * {q['RW']};  // this wave's first query row in the tile",
           f"const int lg = lane / {q['TM']}, lc = lane % {q['TM']}; (void)lg; (void)lc;",
           f"{vec} oacc[{q['DT']}][{q['QT']}];",
           f"float m_r[{q['QT']}], l_r[{q['QT']}], alpha[{q['QT']}], muse[{q['QT']}];"]
    out += [f"{vec} sacc{i}[{q['KT']}][{q['QT']}];" for i in range(_copies(ir, "s", g))]
    out += [f"u32x2 pf{i}[{q['QT']}][{q['NPF']}];" for i in range(_copies(ir, "p", g))]
    return "\n".join(out)


def _buf(t: Task, buf: str) -> str:
    c = _copies(t.ir, "s" if buf == "sacc" else "p", t.role.group)
    return f"{buf}{t.parity if c == 2 and t.parity is not None else 0}"


def _reduce(q: dict[str, int], var: str, op: str) -> str:
    """Combine ``var`` over the lanes that hold the same query (lane bits >= log2(TM))."""
    masks = [32] if q["TM"] == 32 else [16, 32]
    return "\n".join(f"    {var} = {op.format(var, f'shfl_xor({var}, lane, {m})')};" for m in masks)


def _ctx(t: Task) -> tuple:
    """The geometry and names a task body uses: (geometry, TM, KS, QT, KT, DT, NR, dtype, the MFMA function, this
    iteration's score buffer, the three nested unrolled loops over a score block's registers)."""
    q = _geom(t.ir)
    TM, KS, QT, KT, DT, NR = q["TM"], q["KS"], q["QT"], q["KT"], q["DT"], q["NR"]
    dt = t.ir.params["dtype"]
    loops3 = (f"#pragma unroll\n  for (int kt = 0; kt < {KT}; ++kt)\n"
              f"#pragma unroll\n    for (int qt = 0; qt < {QT}; ++qt)"
              f"\n#pragma unroll\n      for (int r = 0; r < {NR}; ++r)")
    return q, TM, KS, QT, KT, DT, NR, dt, f"mma{TM}_{dt}", _buf(t, "sacc"), loops3


def _init(t: Task) -> str:
    """O, the running max and sum zeroed."""
    q, TM, KS, QT, KT, DT, NR, dt, mma, S, loops3 = _ctx(t)
    return (f"#pragma unroll\nfor (int i = 0; i < {DT}; ++i)\n#pragma unroll\n  for (int j = 0; j < {QT}; ++j)\n"
            f"#pragma unroll\n    for (int r = 0; r < {NR}; ++r) oacc[i][j][r] = 0.f;\n"
            f"#pragma unroll\nfor (int j = 0; j < {QT}; ++j) {{ m_r[j] = -__builtin_inff(); l_r[j] = 0.f; "
            "alpha[j] = 0.f; muse[j] = 0.f; }")


def _mma_qk(t: Task) -> str:
    """Sᵀ = K·Qᵀ of this key block."""
    ir = t.ir
    q, TM, KS, QT, KT, DT, NR, dt, mma, S, loops3 = _ctx(t)
    kt_, qt_ = _lds(ir, "k"), _lds(ir, "q")
    return "\n".join([
        f"{loops3} {S}[kt][qt][r] = 0.f;",
        f"#pragma unroll\n  for (int ds = 0; ds < {q['D'] // KS}; ++ds) {{",
        f"    u32x2 fk[{KT}], fq[{QT}];",
        f"#pragma unroll\n    for (int kt = 0; kt < {KT}; ++kt) "
        f"fk[kt] = {kt_.read8('k_cur', f'kt * {TM} + lc', f'ds * {KS} + 4 * lg')};",
        f"#pragma unroll\n    for (int qt = 0; qt < {QT}; ++qt) "
        f"fq[qt] = {qt_.read8('q_s', f'QROW + qt * {TM} + lc', f'ds * {KS} + 4 * lg')};",
        f"#pragma unroll\n    for (int kt = 0; kt < {KT}; ++kt)\n#pragma unroll\n"
        f"      for (int qt = 0; qt < {QT}; ++qt) {S}[kt][qt] = {mma}(fk[kt], fq[qt], {S}[kt][qt]);",
        "  }"])


def _rowmax(t: Task) -> str:
    """the masks on a block crossing an edge, the new running max and the rescale factor."""
    q, TM, KS, QT, KT, DT, NR, dt, mma, S, loops3 = _ctx(t)
    key = f"kb + kt * {TM} + {acc_row(TM, 'r', 'lg')}"
    return "\n".join([
        "  const int kb = it_ * BN;",
        "  if (kb + BN > SKV || (CAUSAL && kb + BN - 1 > m0 + QROW + OFF)) {  // the block crosses a mask edge",
        loops3 + " {",
        f"        const int key = {key}, row = m0 + QROW + qt * {TM} + lc;",
        f"        if (key >= SKV || (CAUSAL && key > row + OFF)) {S}[kt][qt][r] = -__builtin_inff();",
        "      }", "  }",
        f"#pragma unroll\n  for (int qt = 0; qt < {QT}; ++qt) {{",
        f"    float mx = {S}[0][qt][0];",
        f"#pragma unroll\n    for (int kt = 0; kt < {KT}; ++kt)\n#pragma unroll\n"
        f"      for (int r = 0; r < {NR}; ++r) mx = __builtin_fmaxf(mx, {S}[kt][qt][r]);",
        _reduce(q, "mx", "__builtin_fmaxf({0}, {1})"),
        "    const float mn = __builtin_fmaxf(m_r[qt], mx * SCALE_LOG2);",
        "    // a fully masked row so far: keep exp2 finite",
        "    const float mu = (mn == -__builtin_inff()) ? 0.f : mn;",
        "    alpha[qt] = fast_exp2(m_r[qt] - mu);", "    m_r[qt] = mn;", "    muse[qt] = mu;", "  }"])


def _exp2(t: Task) -> str:
    """the probabilities."""
    q, TM, KS, QT, KT, DT, NR, dt, mma, S, loops3 = _ctx(t)
    return f"{loops3} {S}[kt][qt][r] = fast_exp2(__builtin_fmaf({S}[kt][qt][r], SCALE_LOG2, -muse[qt]));"


def _rowsum(t: Task) -> str:
    """the running sum; P packed into MFMA B fragments."""
    q, TM, KS, QT, KT, DT, NR, dt, mma, S, loops3 = _ctx(t)
    # per-lane partial sums (the lanes of a query are combined once, in normalize); then P is packed: registers
    # 4m..4m+3 of Sᵀ block kt are 4 consecutive keys of the lane's query, the B fragment of k-step kt*(TM/KS)+m
    P, pk = _buf(t, "pf"), f"pack2_{dt}"
    per = TM // KS
    return "\n".join([
        f"#pragma unroll\n  for (int qt = 0; qt < {QT}; ++qt) {{", "    float sm = 0.f;",
        f"#pragma unroll\n    for (int kt = 0; kt < {KT}; ++kt)\n#pragma unroll\n"
        f"      for (int r = 0; r < {NR}; ++r) sm += {S}[kt][qt][r];",
        "    l_r[qt] = l_r[qt] * alpha[qt] + sm;",
        f"#pragma unroll\n    for (int kt = 0; kt < {KT}; ++kt)\n#pragma unroll\n"
        f"      for (int m = 0; m < {per}; ++m) {{",
        f"        {P}[qt][kt * {per} + m].x = {pk}({S}[kt][qt][4 * m], {S}[kt][qt][4 * m + 1]);",
        f"        {P}[qt][kt * {per} + m].y = {pk}({S}[kt][qt][4 * m + 2], {S}[kt][qt][4 * m + 3]);",
        "      }", "  }"])


def _rescale(t: Task) -> str:
    """O scaled by the max's change."""
    q, TM, KS, QT, KT, DT, NR, dt, mma, S, loops3 = _ctx(t)
    return (f"#pragma unroll\n  for (int i = 0; i < {DT}; ++i)\n"
            f"#pragma unroll\n    for (int qt = 0; qt < {QT}; ++qt)"
            f"\n#pragma unroll\n      for (int r = 0; r < {NR}; ++r) oacc[i][qt][r] *= alpha[qt];")


def _mma_pv(t: Task) -> str:
    """Oᵀ += Vᵀ·Pᵀ."""
    ir = t.ir
    q, TM, KS, QT, KT, DT, NR, dt, mma, S, loops3 = _ctx(t)
    P = _buf(t, "pf")
    vt = _lds(ir, "v")
    return "\n".join([
        f"#pragma unroll\n  for (int ks = 0; ks < {q['NPF']}; ++ks) {{",
        f"    u32x2 fv[{DT}];",
        f"#pragma unroll\n    for (int i = 0; i < {DT}; ++i) "
        f"fv[i] = {vt.read8('v_cur', f'i * {TM} + lc', f'ks * {KS} + 4 * lg')};",
        f"#pragma unroll\n    for (int i = 0; i < {DT}; ++i)\n#pragma unroll\n"
        f"      for (int qt = 0; qt < {QT}; ++qt) oacc[i][qt] = {mma}(fv[i], {P}[qt][ks], oacc[i][qt]);",
        "  }"])


def _normalize(t: Task) -> str:
    """O divided by the sum of its query's lanes."""
    q, TM, KS, QT, KT, DT, NR, dt, mma, S, loops3 = _ctx(t)
    return "\n".join([
        f"#pragma unroll\nfor (int qt = 0; qt < {QT}; ++qt) {{", "    float l = l_r[qt];",
        _reduce(q, "l", "{0} + {1}"),
        "    const float inv = l > 0.f ? 1.f / l : 0.f;",
        f"#pragma unroll\n    for (int i = 0; i < {DT}; ++i)\n#pragma unroll\n"
        f"      for (int r = 0; r < {NR}; ++r) oacc[i][qt][r] *= inv;", "}"])


def _store(t: Task) -> str:
    """O to memory (rows past seq_q left out)."""
    q, TM, KS, QT, KT, DT, NR, dt, mma, S, loops3 = _ctx(t)
    pk = f"pack2_{dt}"
    return "\n".join([
        f"#pragma unroll\nfor (int qt = 0; qt < {QT}; ++qt) {{",
        f"  const int row = m0 + QROW + qt * {TM} + lc;",
        "  if (row < SQ) {  // ragged tail: rows past seq_q are not written",
        "    u16* const orow = op + ((size_t)(bz * SQ + row) * H + hq) * D;",
        f"#pragma unroll\n    for (int i = 0; i < {DT}; ++i)\n",
        f"#pragma unroll\n      for (int r = 0; r < {NR // 4}; ++r) {{",
        "        u32x2 w_;",
        f"        w_.x = {pk}(oacc[i][qt][4 * r], oacc[i][qt][4 * r + 1]);",
        f"        w_.y = {pk}(oacc[i][qt][4 * r + 2], oacc[i][qt][4 * r + 3]);",
        f"        *reinterpret_cast<u32x2*>(orow + i * {TM} + {acc_row(TM, '4 * r', 'lg')}) = w_;",
        "      }", "  }", "}"])


_BODIES = {"init": _init, "mma_qk": _mma_qk, "rowmax": _rowmax, "exp2": _exp2, "rowsum": _rowsum, "rescale": _rescale,
           "mma_pv": _mma_pv, "normalize": _normalize, "store": _store}


def _body(t: Task) -> str:
    """The C++ of one task instance of a consumer group."""
    return _BODIES[t.base](t)


REGISTRY["flash_attention"] = OpKernel(
    op="flash_attention", check=_check, consts=_consts,
    signature=lambda ir: (("ptr:q", "const u16* __restrict__ qp"), ("ptr:k", "const u16* __restrict__ kp"),
                          ("ptr:v", "const u16* __restrict__ vp"), ("ptr:o", "u16* __restrict__ op")),
    tiles=_tiles, pdecls=_pdecls,
    stage=lambda ir, task, it: _copy(ir, task, it)[0], commit=lambda ir, task: _copy(ir, task, "it_")[1],
    decls=_decls, body=_body, min_trips=1,  # every query block sees key block 0 (seq_q <= seq_kv)
    info=lambda ir: {"mfma": f"{_geom(ir)['TM']}x{_geom(ir)['TM']}", "wave_rows": _geom(ir)["RW"],
                     "score_buffers": [_copies(ir, "s", g) for g in range(ir.groups)]})
