"""GEMM task bodies: C[M,N] = A[M,K] · B[N,K]^T ("TN": both K-contiguous), fp16/bf16 in, fp32 accumulate.

A tile is BM×BN of C (grouped rasterisation of GROUP_M M-tiles, so that consecutive tiles share B in L2);
consumer warpgroup g owns BM/groups of its rows. ``load_a`` / ``load_b``: 64-column (128-byte swizzled) TMA
boxes; ``mma@g``: wgmma from shared memory, both operands K-major; ``epilogue@g`` packs the accumulators,
``store@g`` writes them (rows past M and columns past N skipped).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ptsolve.errors import CodegenError

from ..kernel_ir import KernelIR, Role
from .common import CTYPE, PACK2, PTXTYPE, TensorMapSpec, check_dtype, wgmma_ss
from .skeleton import REGISTRY, OpKernel, Task

GROUP_M = 8  # M-tiles per rasterisation group


def _check(ir: KernelIR) -> None:
    p, t = ir.params, ir.tiling
    check_dtype(p)
    if t["BK"] != 64:
        raise CodegenError(f"gemm: BK={t['BK']}; the generator loads 64-column (128-byte) K boxes")
    if max(p["M"], p["N"], p["K"]) >= 1 << 30:
        raise CodegenError("gemm: M, N and K must stay below 2^30 (32-bit TMA coordinates)")


SIZE_PARAMS = ("M", "N", "K")


def sizes(p: Mapping[str, Any], t: Mapping[str, int]) -> dict[str, int]:
    """The sizes a generic build takes at launch, NTILES last."""
    tm, tn = -(-p["M"] // t["BM"]), -(-p["N"] // t["BN"])
    return {"M": p["M"], "N": p["N"], "K": p["K"], "TM": tm, "TN": tn, "KT": -(-p["K"] // 64), "NTILES": tm * tn}


def _consts(ir: KernelIR) -> str:
    t = ir.tiling
    rows = t["BM"] // t["groups"]
    return (f"  constexpr int BM = {t['BM']}, BN = {t['BN']}, MT = {rows // 64}, GROUP_M = {GROUP_M};")


def _tiles(ir: KernelIR) -> tuple[int | str, str]:
    n = "NTILES" if ir.generic else sizes(ir.params, ir.tiling)["NTILES"]
    return n, ("  // grouped rasterisation: GROUP_M M-tiles sweep N together\n"
               "  const int per_group = GROUP_M * TN, first_m = (tile / per_group) * GROUP_M;\n"
               "  const int gsz = (TM - first_m) < GROUP_M ? (TM - first_m) : GROUP_M;\n"
               "  const int m0 = (first_m + (tile % per_group) % gsz) * BM, n0 = ((tile % per_group) / gsz) * BN;\n"
               f"  {'const' if ir.generic else 'constexpr'} int T = KT;")


def _decls(ir: KernelIR, role: Role) -> str:
    rows = ir.tiling["BM"] // ir.tiling["groups"]
    return (f"constexpr int ROW0 = {role.group * rows};\n"
            "float acc[MT][BN / 2];\nuint32_t cpk[MT][BN / 4];")


def _body(t: Task) -> str:
    ir, b = t.ir, t.base
    dt = ir.params["dtype"]
    if b in ("load_a", "load_b"):
        row0 = "m0" if b == "load_a" else "n0"
        return f"  tma_load_2d({b[-1]}_cur, &tm_{b[-1]}, fbar_, it_ * 64, {row0});"
    if b == "zero":
        return ("#pragma unroll\nfor (int m = 0; m < MT; ++m) {\n#pragma unroll\n"
                "  for (int i = 0; i < BN / 2; ++i) acc[m][i] = 0.f;\n  fence_regs(acc[m]);\n}")
    if b == "mma":
        mt, bn = ir.tiling["BM"] // ir.tiling["groups"] // 64, ir.tiling["BN"]
        lines = ["  const uint32_t sa = smem_u32(a_cur) + ROW0 * 128, sb = smem_u32(b_cur);", "  wg_fence();"]
        for kk in range(4):
            for m in range(mt):
                lines.append(f"  wgmma_ss_n{bn}_{PTXTYPE[dt]}(acc[{m}], make_desc(sa + {m * 64 * 128 + kk * 32}, 16, "
                             f"1024), make_desc(sb + {kk * 32}, 16, 1024), 1);")
        return "\n".join([*lines, "  wg_commit();"])
    if b == "epilogue":
        return ("#pragma unroll\nfor (int m = 0; m < MT; ++m) fence_regs(acc[m]);\n"
                "#pragma unroll\nfor (int m = 0; m < MT; ++m) {\n#pragma unroll\n"
                f"  for (int i = 0; i < BN / 4; ++i) cpk[m][i] = {PACK2[dt]}(acc[m][2 * i], acc[m][2 * i + 1]);\n}}")
    assert b == "store", b
    # a thread holds rows r, r+8 of each 16-row slice, columns 8j + 2*(lane%4) (+1)
    return ("#pragma unroll\nfor (int m = 0; m < MT; ++m) {\n#pragma unroll\n  for (int h = 0; h < 2; ++h) {\n"
            "    const int row = m0 + ROW0 + m * 64 + w * 16 + (lane >> 2) + 8 * h;\n"
            "    if (row < M) {\n      uint32_t* crow = reinterpret_cast<uint32_t*>(c + (size_t)row * N);\n"
            "#pragma unroll\n      for (int jj = 0; jj < BN / 8; ++jj) {\n"
            "        const int col = n0 + jj * 8 + 2 * (lane & 3);\n"
            "        if (col < N) crow[col >> 1] = cpk[m][jj * 2 + h];\n      }\n    }\n  }\n}")


def maps(p: Mapping[str, Any], t: Mapping[str, int]) -> tuple[TensorMapSpec, ...]:
    """Tensor maps of A [M, K] and B [N, K] (innermost first; strides in bytes)."""
    M, N, K, dt = p["M"], p["N"], p["K"], p["dtype"]
    return (TensorMapSpec("a", dt, (K, M), (K * 2,), (64, t["BM"])),
            TensorMapSpec("b", dt, (K, N), (K * 2,), (64, t["BN"])))


REGISTRY["gemm"] = OpKernel(
    op="gemm", check=_check, device=lambda ir: wgmma_ss(ir.tiling["BN"], ir.params["dtype"]), consts=_consts,
    maps=lambda ir: maps(ir.params, ir.tiling),
    signature=lambda ir: (("ptr:c", f"{CTYPE[ir.params['dtype']]}* __restrict__ c"),), tiles=_tiles,
    decls=_decls, body=_body, trips=lambda ir: "T" if ir.generic else -(-ir.params["K"] // 64),
    min_trips=1, info=lambda ir: {"trips": "T" if ir.generic else -(-ir.params["K"] // 64)},
    sizes=sizes, size_params=SIZE_PARAMS)
