"""GEMM task bodies: C[M,N] = A[M,K] · B[N,K]^T ("TN": both K-contiguous), fp16/bf16 in, fp32 accumulate.

A tile is BM×BN of C (grouped rasterisation of GROUP_M M-tiles, so that consecutive tiles share B in L2);
consumer warpgroup g owns BM/groups of its rows. ``load_a`` / ``load_b``: 64-column (128-byte swizzled) TMA
boxes; ``mma@g``: wgmma from shared memory, both operands K-major; ``epilogue@g`` packs the accumulators,
``store@g`` writes them (rows past M and columns past N skipped).

Ping-pong (``KernelIR.pingpong``): each consumer warpgroup owns a whole BM×BN tile (``ROW0`` = 0), the CTA's tiles
taken in turn; everything else (which tiles, the turns, the ring) is the skeleton's.

Split-K (``splits`` = S > 1): a work unit is (tile, split), split fastest; split s runs K steps
[s·KT/S, (s+1)·KT/S) (ptsolve.ops.gemm.split_trips). ``partial@g`` stores the accumulators to the fp32 workspace
``ws`` in fragment order (each thread's registers as float4s, consecutive threads adjacent: coalesced, and a
thread reads back exactly what the same thread position of the other splits wrote), rows past M skipped; then each
warp counts its arrival on its own counter in ``cnt`` (a warp's rows are its own, so no wider barrier is needed).
The warp that arrives last sums the S partials in split order (its own read back too), which makes the result
independent of the arrival order, and resets the counter to 0 for the next launch; the other splits skip the
epilogue's store.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ptsolve.errors import CodegenError

from ..kernel_ir import KernelIR, Role
from .common import CTYPE, PACK2, PTXTYPE, TensorMapSpec, check_dtype, wgmma_ss
from .skeleton import REGISTRY, OpKernel, Task

GROUP_M = 8  # M-tiles per rasterisation group


def _splits(ir: KernelIR) -> int:
    return int(ir.tiling.get("splits", 1))


def _check(ir: KernelIR) -> None:
    p, t = ir.params, ir.tiling
    check_dtype(p)
    if t["BK"] != 64:
        raise CodegenError(f"gemm: BK={t['BK']}; the generator loads 64-column (128-byte) K boxes")
    if not 1 <= _splits(ir) <= -(-p["K"] // 64):
        raise CodegenError(f"gemm: splits={_splits(ir)} must be in [1, {-(-p['K'] // 64)}] (one K step per split "
                           "at least)")
    if max(p["M"], p["N"], p["K"]) >= 1 << 30:
        raise CodegenError("gemm: M, N and K must stay below 2^30 (32-bit TMA coordinates)")
    if ir.pingpong and (_splits(ir) > 1 or not ir.persistent):
        raise CodegenError("gemm: ping-pong warpgroups alternate over a persistent CTA's tiles: it takes splits=1 "
                           "and persistent=1")
    if ir.generic and _splits(ir) > 1:
        raise CodegenError(f"gemm: splits={_splits(ir)} in a generic build; split-K kernels are built for one shape "
                           "(their workspace is sized by it): build it exact, or pick a tiling without splits")


SIZE_PARAMS = ("M", "N", "K")


def sizes(p: Mapping[str, Any], t: Mapping[str, int]) -> dict[str, int]:
    """The sizes a generic build takes at launch, NTILES (work units: output tiles × K splits) last."""
    tm, tn = -(-p["M"] // t["BM"]), -(-p["N"] // t["BN"])
    return {"M": p["M"], "N": p["N"], "K": p["K"], "TM": tm, "TN": tn, "KT": -(-p["K"] // 64),
            "NTILES": tm * tn * int(t.get("splits", 1))}


def _consts(ir: KernelIR) -> str:
    t = ir.tiling
    rows = t["BM"] // t["groups"]
    return (f"  constexpr int BM = {t['BM']}, BN = {t['BN']}, MT = {rows // 64}, GROUP_M = {GROUP_M};\n"
            f"  constexpr int SPLITS = {_splits(ir)}, GROUPS = {t['groups']}; (void)GROUPS;")


def _trips(ir: KernelIR) -> int | str:
    kt, s = -(-ir.params["K"] // 64), _splits(ir)
    return kt // s if kt % s == 0 and not ir.generic else "T"


def _tiles(ir: KernelIR) -> tuple[int | str, str]:
    n = "NTILES" if ir.generic else sizes(ir.params, ir.tiling)["NTILES"]
    trips = _trips(ir)
    return n, ("  // work unit = (output tile, K split), split fastest\n"
               "  const int split_ = tile % SPLITS, tmn_ = tile / SPLITS; (void)split_;\n"
               "  const int K0 = split_ * KT / SPLITS; (void)K0;  // first K step of this split\n"
               "  // grouped rasterisation: GROUP_M M-tiles sweep N together\n"
               "  const int per_group = GROUP_M * TN, first_m = (tmn_ / per_group) * GROUP_M;\n"
               "  const int gsz = (TM - first_m) < GROUP_M ? (TM - first_m) : GROUP_M;\n"
               "  const int m0 = (first_m + (tmn_ % per_group) % gsz) * BM, n0 = ((tmn_ % per_group) / gsz) * BN;\n"
               + (f"  constexpr int T = {trips};" if isinstance(trips, int)
                  else "  const int T = (split_ + 1) * KT / SPLITS - K0;"))


def _decls(ir: KernelIR, role: Role) -> str:
    rows = ir.tiling["BM"] // ir.tiling["groups"]
    # the first row of the tile this warpgroup owns: its share of the cooperative tile, or a ping-pong tile's row 0
    return (f"constexpr int ROW0 = {0 if ir.pingpong else role.group * rows};\n"
            "float acc[MT][BN / 2];\nuint32_t cpk[MT][BN / 4];\n"
            "bool last_ = true;  // split-K: this split stores the tile (the last to arrive)")


def _body(t: Task) -> str:
    ir, b = t.ir, t.base
    dt = ir.params["dtype"]
    if b in ("load_a", "load_b"):
        row0 = "m0" if b == "load_a" else "n0"
        return f"  tma_load_2d({b[-1]}_cur, &tm_{b[-1]}, fbar_, (K0 + it_) * 64, {row0});"
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
    if b == "partial":
        return _partial(ir)
    assert b == "store", b
    # a thread holds rows r, r+8 of each 16-row slice, columns 8j + 2*(lane%4) (+1)
    return ("if (last_) {  // split-K: only the last split of the tile stores\n"
            "#pragma unroll\nfor (int m = 0; m < MT; ++m) {\n#pragma unroll\n  for (int h = 0; h < 2; ++h) {\n"
            "    const int row = m0 + ROW0 + m * 64 + w * 16 + (lane >> 2) + 8 * h;\n"
            "    if (row < M) {\n      uint32_t* crow = reinterpret_cast<uint32_t*>(c + (size_t)row * N);\n"
            "#pragma unroll\n      for (int jj = 0; jj < BN / 8; ++jj) {\n"
            "        const int col = n0 + jj * 8 + 2 * (lane & 3);\n"
            "        if (N % 2 == 0) { if (col < N) crow[col >> 1] = cpk[m][jj * 2 + h]; }\n"
            "        else {  // odd N: rows are not 4-byte aligned, store the two halves apart\n"
            "          uint16_t* const c16 = reinterpret_cast<uint16_t*>(c + (size_t)row * N);\n"
            "          if (col < N) c16[col] = cpk[m][jj * 2 + h] & 0xffffu;\n"
            "          if (col + 1 < N) c16[col + 1] = cpk[m][jj * 2 + h] >> 16;\n        }\n"
            "      }\n    }\n  }\n}\n}")


SUM_LOADS = 32  # float4 loads a thread keeps in flight while summing partials (128 registers, beside acc and cpk)


def _partial(ir: KernelIR) -> str:
    """Split-K's meeting of the partial tiles (see the module doc); float4 chunk q of acc[m] is n8-block q: rows r
    and r + 8 of the thread, so a chunk is skipped when row r is past M. The sum loop is unrolled over as many splits
    as SUM_LOADS float4s allow."""
    chunks = ir.tiling["BM"] // ir.tiling["groups"] // 64 * ir.tiling["BN"] // 8
    unroll = max(1, min(_splits(ir), SUM_LOADS // chunks))
    # no pragma at all for one split at a time: ptxas spills BN=256 tiles under an explicit "unroll 1"
    return _PARTIAL.replace("#pragma unroll U_\n", f"#pragma unroll {unroll}\n" if unroll > 1 else "")


_PARTIAL = r"""const int tid_ = threadIdx.x & 127;
constexpr int CH = MT * BN / 8;  // float4 chunks per thread
float4* const ws4_ = reinterpret_cast<float4*>(ws);
const size_t unit_ = (size_t)(tmn_ * GROUPS + g) * SPLITS;  // partials of (tile, warpgroup): SPLITS slices
#pragma unroll
for (int m = 0; m < MT; ++m) {
  if (m0 + ROW0 + m * 64 + w * 16 + (lane >> 2) < M) {
    float4* const dst = ws4_ + ((unit_ + split_) * CH + m * (BN / 8)) * 128 + tid_;
#pragma unroll
    for (int q = 0; q < BN / 8; ++q)
      __stcg(dst + q * 128, make_float4(acc[m][4 * q], acc[m][4 * q + 1], acc[m][4 * q + 2], acc[m][4 * q + 3]));
  }
}
__threadfence();  // the partial is visible device-wide before this warp's arrival counts
__syncwarp();
int* const ctr_ = cnt + (tmn_ * GROUPS + g) * 4 + w;
int arrived_ = 0;
if (lane == 0) arrived_ = atomicAdd(ctr_, 1);
arrived_ = __shfl_sync(0xffffffffu, arrived_, 0);
last_ = arrived_ == SPLITS - 1;
if (last_) {
  if (lane == 0) atomicExch(ctr_, 0);  // every split of this launch has arrived: ready for the next launch
  __threadfence();
  // all S partials (this split's too, just written) in split order: the sum does not depend on who arrived last,
  // and acc is the only accumulator (no second tile of registers); unrolled by U so that the loads of U splits
  // are in flight together (one L2 round trip per U splits, not per split)
#pragma unroll U_
  for (int s = 0; s < SPLITS; ++s) {
    const float4* const src = ws4_ + (unit_ + s) * CH * 128 + tid_;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m0 + ROW0 + m * 64 + w * 16 + (lane >> 2) < M) {
#pragma unroll
        for (int q = 0; q < BN / 8; ++q) {
          const float4 v = __ldcg(src + (m * (BN / 8) + q) * 128);
          float* const a = &acc[m][4 * q];
          if (s == 0) { a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w; }
          else { a[0] += v.x; a[1] += v.y; a[2] += v.z; a[3] += v.w; }
        }
      }
    }
  }
}"""


def maps(p: Mapping[str, Any], t: Mapping[str, int]) -> tuple[TensorMapSpec, ...]:
    """Tensor maps of A [M, K] and B [N, K] (innermost first; strides in bytes)."""
    M, N, K, dt = p["M"], p["N"], p["K"], p["dtype"]
    return (TensorMapSpec("a", dt, (K, M), (K * 2,), (64, t["BM"])),
            TensorMapSpec("b", dt, (K, N), (K * 2,), (64, t["BN"])))


def _signature(ir: KernelIR) -> tuple[tuple[str, str], ...]:
    c = (("ptr:c", f"{CTYPE[ir.params['dtype']]}* __restrict__ c"),)
    if _splits(ir) == 1:
        return c
    return (*c, ("ptr:ws", "float* __restrict__ ws"), ("ptr:cnt", "int* __restrict__ cnt"))


def _info(ir: KernelIR) -> dict[str, object]:
    p, t = ir.params, ir.tiling
    out: dict[str, object] = {"trips": _trips(ir), "splits": _splits(ir)}
    if _splits(ir) > 1:  # scratch the runtime zero-fills once (codegen.runtime.workspace_ptrs), bytes
        tiles = -(-p["M"] // t["BM"]) * -(-p["N"] // t["BN"])
        out["workspace"] = {"ws": tiles * _splits(ir) * t["BM"] * t["BN"] * 4, "cnt": tiles * t["groups"] * 4 * 4}
    return out


REGISTRY["gemm"] = OpKernel(
    op="gemm", check=_check, device=lambda ir: wgmma_ss(ir.tiling["BN"], ir.params["dtype"]), consts=_consts,
    maps=lambda ir: maps(ir.params, ir.tiling), signature=_signature, tiles=_tiles, decls=_decls, body=_body,
    trips=_trips, min_trips=1, info=_info, sizes=sizes, size_params=SIZE_PARAMS)
