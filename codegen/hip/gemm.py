"""GEMM task bodies for gfx942: C[M,N] = A[M,K] · B[N,K]^T ("TN": both K-contiguous), fp16/bf16 in, fp32 accumulate.

A tile is BM×BN of C (grouped rasterisation of GROUP_M M-tiles, as the CUDA kernel); consumer group g owns BM/groups
of its rows, its four waves a 2×2 grid of (rows/2)×(BN/2) wave tiles. ``load_a`` / ``load_b``: the producer copies
the A and B tiles (16-byte global loads, zero outside the tensors) into swizzled LDS slots. ``mma@g``: per BK step,
ds_read_b64 fragments and MFMA 32x32x8 (16x16x16 for 16-wide wave tiles) computing Cᵀ tiles (A operand = rows of
B, B operand = rows of A), so each lane ends up holding 4 consecutive columns of C: ``epilogue@g`` packs them,
``store@g`` writes 8 bytes per lane and group (rows past M and columns past N skipped).
"""
from __future__ import annotations

from ptsolve.errors import CodegenError, UnsupportedOperatorError

from ..kernel_ir import KernelIR, Role
from .common import GROUP_WAVES, LdsTile, acc_regs, acc_row, copy_rows, copy_rows_regs, mfma_k, mfma_shape
from .skeleton import REGISTRY, OpKernel, Task

GROUP_M = 8  # M-tiles per rasterisation group


def _geom(ir: KernelIR) -> dict[str, int]:
    t = ir.tiling
    rows = t["BM"] // t["groups"]
    mw, nw = rows // 2, t["BN"] // 2  # 2x2 waves per group
    ts = mfma_shape(nw, mw)
    return {"rows": rows, "MW": mw, "NW": nw, "TS": ts, "KS": mfma_k(ts), "NTT": nw // ts, "MTT": mw // ts,
            "NR": acc_regs(ts)}


def _check(ir: KernelIR) -> None:
    p, t = ir.params, ir.tiling
    if GROUP_WAVES != 4:
        raise CodegenError("the HIP GEMM splits a group's tile over 2x2 waves")
    if t["BK"] % 16:
        raise CodegenError(f"gemm: BK={t['BK']} must be a multiple of 16 (the K of an f16 MFMA)")
    if (t["BM"] // t["groups"]) % 32 or t["BN"] % 32:
        raise CodegenError(f"gemm: BM/groups={t['BM'] // t['groups']} and BN={t['BN']} must be multiples of 32 "
                           "(2x2 waves of at least 16x16 each)")
    if max(p["M"], p["N"], p["K"]) >= 1 << 30 or p["M"] * p["K"] >= 1 << 31 or p["N"] * p["K"] >= 1 << 31 \
            or p["M"] * p["N"] >= 1 << 31:
        raise UnsupportedOperatorError("gemm: a matrix of 2^31 elements or more; the HIP kernel's indices are 32-bit")
    if p["N"] % 8:
        raise UnsupportedOperatorError(f"gemm: N={p['N']}; the HIP kernel stores C in 16-byte rows (N a multiple of 8)")
    if t.get("splits", 1) != 1:
        raise CodegenError(f"gemm: splits={t['splits']}; the HIP kernel has no split-K (use splits=1)")
    _geom(ir)


def _consts(ir: KernelIR) -> str:
    p, t = ir.params, ir.tiling
    return (f"  constexpr int M = {p['M']}, N = {p['N']}, K = {p['K']}, BM = {t['BM']}, BN = {t['BN']}, "
            f"BK = {t['BK']};\n"
            f"  constexpr int TM = {-(-p['M'] // t['BM'])}, TN = {-(-p['N'] // t['BN'])}, GROUP_M = {GROUP_M}, "
            f"KT = {-(-p['K'] // t['BK'])};")


def _tiles(ir: KernelIR) -> tuple[int, str]:
    p, t = ir.params, ir.tiling
    n = -(-p["M"] // t["BM"]) * -(-p["N"] // t["BN"])
    return n, ("  // grouped rasterisation: GROUP_M M-tiles sweep N together\n"
               "  const int per_group = GROUP_M * TN, first_m = (tile / per_group) * GROUP_M;\n"
               "  const int gsz = (TM - first_m) < GROUP_M ? (TM - first_m) : GROUP_M;\n"
               "  const int m0 = (first_m + (tile % per_group) % gsz) * BM, n0 = ((tile % per_group) / gsz) * BN;\n"
               "  constexpr int T = KT;")


def _tile(ir: KernelIR, task: str) -> LdsTile:
    t = ir.tiling
    return LdsTile(t["BM"] if task == "load_a" else t["BN"], t["BK"])


def _copy(ir: KernelIR, task: str, it: str) -> tuple[str, str]:
    x = task[-1]
    r0, lim = ("m0", "M") if x == "a" else ("n0", "N")
    src = f"reinterpret_cast<const u32x4*>({x} + (size_t)({r0} + r_) * K + ({it}) * BK + c_)"
    return copy_rows(_tile(ir, task), f"stg_{x}", src, f"{r0} + r_ < {lim} && ({it}) * BK + c_ < K")


def _pdecls(ir: KernelIR) -> str:
    return "\n".join(f"    u32x4 stg_{x}[{copy_rows_regs(_tile(ir, f'load_{x}'))}];" for x in "ab")


def _decls(ir: KernelIR, role: Role) -> str:
    q = _geom(ir)
    vec = "f32x16" if q["TS"] == 32 else "f32x4"
    return (f"const int ROW0 = {role.group * q['rows']} + (wq >> 1) * {q['MW']}, COL0 = (wq & 1) * {q['NW']};\n"
            f"const int lg = lane / {q['TS']}, lc = lane % {q['TS']}; (void)lg; (void)lc;\n"
            f"{vec} acc[{q['NTT']}][{q['MTT']}];\nu32x2 cpk[{q['NTT']}][{q['MTT']}][{q['NR'] // 4}];")


def _body(t: Task) -> str:
    ir, b = t.ir, t.base
    q = _geom(ir)
    TS, KS, NTT, MTT, NR = q["TS"], q["KS"], q["NTT"], q["MTT"], q["NR"]
    mma = f"mma{TS}_{ir.params['dtype']}"
    if b == "zero":
        return (f"#pragma unroll\nfor (int i = 0; i < {NTT}; ++i)\n#pragma unroll\n  for (int j = 0; j < {MTT}; ++j)\n"
                f"#pragma unroll\n    for (int r = 0; r < {NR}; ++r) acc[i][j][r] = 0.f;")
    if b == "mma":
        ta, tb = _tile(ir, "load_a"), _tile(ir, "load_b")
        return "\n".join([
            f"#pragma unroll\n  for (int ks = 0; ks < {ir.tiling['BK'] // KS}; ++ks) {{",
            f"    u32x2 fa[{NTT}], fb[{MTT}];",
            f"#pragma unroll\n    for (int i = 0; i < {NTT}; ++i) "
            f"fa[i] = {tb.read8('b_cur', f'COL0 + i * {TS} + lc', f'ks * {KS} + 4 * lg')};",
            f"#pragma unroll\n    for (int j = 0; j < {MTT}; ++j) "
            f"fb[j] = {ta.read8('a_cur', f'ROW0 + j * {TS} + lc', f'ks * {KS} + 4 * lg')};",
            f"#pragma unroll\n    for (int i = 0; i < {NTT}; ++i)\n#pragma unroll\n"
            f"      for (int j = 0; j < {MTT}; ++j) acc[i][j] = {mma}(fa[i], fb[j], acc[i][j]);",
            "  }"])
    if b == "epilogue":
        pk = f"pack2_{ir.params['dtype']}"
        return (f"#pragma unroll\nfor (int i = 0; i < {NTT}; ++i)\n#pragma unroll\n  for (int j = 0; j < {MTT}; ++j)\n"
                f"#pragma unroll\n    for (int r = 0; r < {NR // 4}; ++r) {{\n"
                f"      cpk[i][j][r].x = {pk}(acc[i][j][4 * r], acc[i][j][4 * r + 1]);\n"
                f"      cpk[i][j][r].y = {pk}(acc[i][j][4 * r + 2], acc[i][j][4 * r + 3]);\n    }}")
    assert b == "store", b
    # lane column lc of a Cᵀ tile is row m of C; its registers 4r..4r+3 are 4 consecutive columns n
    return (f"#pragma unroll\nfor (int j = 0; j < {MTT}; ++j) {{\n  const int m = m0 + ROW0 + j * {TS} + lc;\n"
            f"  if (m < M) {{\n#pragma unroll\n    for (int i = 0; i < {NTT}; ++i)\n#pragma unroll\n"
            f"      for (int r = 0; r < {NR // 4}; ++r) {{\n"
            f"        const int n = n0 + COL0 + i * {TS} + {acc_row(TS, '4 * r', 'lg')};\n"
            f"        if (n < N) *reinterpret_cast<u32x2*>(c + (size_t)m * N + n) = cpk[i][j][r];\n"
            f"      }}\n  }}\n}}")


REGISTRY["gemm"] = OpKernel(
    op="gemm", check=_check, consts=_consts,
    signature=lambda ir: (("ptr:a", "const u16* __restrict__ a"), ("ptr:b", "const u16* __restrict__ b"),
                          ("ptr:c", "u16* __restrict__ c")),
    tiles=_tiles, pdecls=_pdecls,
    stage=lambda ir, task, it: _copy(ir, task, it)[0], commit=lambda ir, task: _copy(ir, task, "it_")[1],
    decls=_decls, body=_body, trips=lambda ir: -(-ir.params["K"] // ir.tiling["BK"]), min_trips=1,
    info=lambda ir: {"trips": -(-ir.params["K"] // ir.tiling["BK"]), "mfma": f"{_geom(ir)['TS']}x{_geom(ir)['TS']}",
                     "wave_tile": [_geom(ir)["MW"], _geom(ir)["NW"]]})
