"""GEMM task bodies: C[M,N] = A[M,K] · B[N,K]^T ("TN": both K-contiguous), fp16/bf16 in, fp32 accumulate.

A tile is BM×BN of C (grouped rasterisation of GROUP_M M-tiles, so that consecutive tiles share B in L2);
consumer warpgroup g owns BM/groups of its rows. ``load_a`` / ``load_b``: 64-column (128-byte swizzled) TMA
boxes; ``mma@g``: wgmma from shared memory, both operands K-major; ``epilogue@g`` packs the accumulators,
``store@g`` writes them (rows past M and columns past N skipped).

Ping-pong (``KernelIR.pingpong``): each consumer warpgroup owns a whole BM×BN tile (``ROW0`` = 0), the CTA's tiles
taken in turn; everything else (which tiles, the turns, the ring) is the skeleton's.

Clusters (``cluster`` = 2): the two CTAs of a cluster run M-neighbour tiles with the same B columns (tile indices
2i, 2i + 1 of the raster: GROUP_M and the padded TM are even); ``load_b`` loads this CTA's half of the B tile
(``blockIdx.x % CLUSTER``) and multicasts it into both, so each receives the whole tile on its own full barrier.

TMA-store epilogue (``tma_store`` = 1, ptsolve.ops.gemm): ``store_tma@g`` writes the packed accumulators in
64-column chunks into the warpgroup's staging slots (``cs@g``; a ping-pong warpgroup's own half) with stmatrix, at
the 128-byte swizzle of C's tensor map (16-byte unit j of row r at j ^ (r % 8)), fences them to the async proxy,
and thread 0 of the warpgroup stores each chunk with a TMA tensor store (a bulk group each). Before a slot is
written again, thread 0 waits until the copy engine has read it (``cp.async.bulk.wait_group.read``: the chunk two
back, or at a tile's first chunk every earlier one, which a whole main loop separates) and the warpgroup syncs on
its named barrier; before its CTA's last tile ends it waits for all of them.

Split-K (``splits`` = S > 1): a work unit is (tile, split), split fastest; split s runs K steps
[s·KT/S, (s+1)·KT/S) (ptsolve.ops.gemm.split_trips). ``partial@g`` stores the accumulators to the fp32 workspace
``ws`` in fragment order (each thread's registers as float4s, consecutive threads adjacent: coalesced), rows past M
skipped; then each warp counts its arrival on its own counter in ``cnt`` and the split stores nothing more. The
reduce CTAs (``ptsolve.ops.gemm.reduce_ctas`` per tile, the grid's last CTAs, the operator's ``entry``) wait for
every warp counter of their tile, sum their share of its float4s over the S partials in split order (so the result
does not depend on the arrival order; 8 splits' loads in flight per thread), store them to C and, the tile's last
reduce CTA, reset its counters for the next launch. Split-K kernels launch a grid (not persistent CTAs, which might
hold a reduce CTA before the splits it waits for).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ptsolve.errors import CodegenError, UnsupportedOperatorError
from ptsolve.geometry.gemm import STAGE_COLS, a_rows, reduce_ctas, stage_bytes
from ptsolve.tiling import cluster_of

from ..kernel_ir import KernelIR, Role
from .common import CTYPE, LD_ACQUIRE, PACK2, PTXTYPE, TensorMapSpec, check_dtype, wgmma_ss
from .skeleton import REGISTRY, OpKernel, Task

GROUP_M = 8  # M-tiles per rasterisation group


def _splits(ir: KernelIR) -> int:
    return int(ir.tiling.get("splits", 1))


def _tma_store(ir: KernelIR) -> bool:
    return bool(ir.tiling.get("tma_store", 0))


def _check(ir: KernelIR) -> None:
    p, t = ir.params, ir.tiling
    check_dtype(p)
    if t["BK"] != 64:
        raise CodegenError(f"gemm: BK={t['BK']}; the generator loads 64-column (128-byte) K boxes")
    if not 1 <= _splits(ir) <= -(-p["K"] // 64):
        raise CodegenError(f"gemm: splits={_splits(ir)} must be in [1, {-(-p['K'] // 64)}] (one K step per split "
                           "at least)")
    if max(p["M"], p["N"], p["K"]) >= 1 << 30:
        raise UnsupportedOperatorError("gemm: M, N and K must stay below 2^30 (32-bit TMA coordinates)")
    if ir.pingpong and (_splits(ir) > 1 or not ir.persistent):
        raise CodegenError("gemm: ping-pong warpgroups alternate over a persistent CTA's tiles: it takes splits=1 "
                           "and persistent=1")
    if _splits(ir) > 1 and ir.persistent:
        raise CodegenError(f"gemm: splits={_splits(ir)} on persistent CTAs; the reduce CTAs wait for splits a "
                           "persistent CTA may not have run yet: use persistent=0")
    if cluster_of(ir.tiling) > 1 and (_splits(ir) > 1 or GROUP_M % cluster_of(ir.tiling)):
        raise CodegenError(f"gemm: cluster={cluster_of(ir.tiling)} pairs M-neighbour tiles of the raster; it takes "
                           f"splits=1 (got {_splits(ir)})")
    if _tma_store(ir) and (_splits(ir) > 1 or p["N"] % 8 or t["BN"] % STAGE_COLS):
        raise CodegenError(f"gemm: tma_store=1 stores {STAGE_COLS}-column chunks through C's tensor map: it takes "
                           f"splits=1, N a multiple of 8 and BN a multiple of {STAGE_COLS} (got splits={_splits(ir)}, "
                           f"N={p['N']}, BN={t['BN']})")
    if ir.generic and _splits(ir) > 1:
        raise CodegenError(f"gemm: splits={_splits(ir)} in a generic build; split-K kernels are built for one shape "
                           "(their workspace is sized by it): build it exact, or pick a tiling without splits")


SIZE_PARAMS = ("M", "N", "K")


def sizes(p: Mapping[str, Any], t: Mapping[str, int]) -> dict[str, int]:
    """The sizes a generic build takes at launch, NTILES (work units: output tiles × K splits) last."""
    cl = cluster_of(t)
    tm, tn = -(-p["M"] // t["BM"] // cl) * cl, -(-p["N"] // t["BN"])  # M tiles in whole clusters
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
               + _raster("tmn_")
               + (f"  constexpr int T = {trips}; (void)T;" if isinstance(trips, int)
                  else "  const int T = (split_ + 1) * KT / SPLITS - K0;"))


def _decls(ir: KernelIR, role: Role) -> str:
    rows = ir.tiling["BM"] // ir.tiling["groups"]
    # the first row of the tile this warpgroup owns: its share of the cooperative tile, or a ping-pong tile's row 0
    return (f"constexpr int ROW0 = {0 if ir.pingpong else role.group * rows};\n"
            "float acc[MT][BN / 2];\nuint32_t cpk[MT][BN / 4];")


def _body(t: Task) -> str:
    ir, b = t.ir, t.base
    dt = ir.params["dtype"]
    if b == "load_b" and cluster_of(ir.tiling) > 1:  # this CTA's rows of the B tile, into every CTA of the cluster
        half = ir.tiling["BN"] // cluster_of(ir.tiling)
        return (f"  const int cr_ = blockIdx.x % CLUSTER;\n"
                f"  tma_load_2d_mc(b_cur + cr_ * {half * 128}, &tm_b, fbar_, (K0 + it_) * 64, n0 + cr_ * {half}, "
                f"(1 << CLUSTER) - 1);")
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
        return _PARTIAL
    if b == "store_tma":
        return _store_tma(t)
    assert b == "store", b
    # a thread holds rows r, r+8 of each 16-row slice, columns 8j + 2*(lane%4) (+1)
    return ("if (SPLITS == 1) {  // split-K: the reduce CTAs store\n"
            "#pragma unroll\nfor (int m = 0; m < MT; ++m) {\n#pragma unroll\n  for (int h = 0; h < 2; ++h) {\n"
            "    const int row = m0 + ROW0 + m * 64 + w * 16 + (lane >> 2) + 8 * h;\n"
            "    if (row < M) {\n"
            "#pragma unroll\n      for (int jj = 0; jj < BN / 8; ++jj)\n"
            "        store_pair(c, row, n0 + jj * 8 + 2 * (lane & 3), cpk[m][jj * 2 + h], N);\n"
            "    }\n  }\n}\n}")


def _store_tma(task: Task) -> str:
    """``store_tma@g``: stage the packed tile chunk by chunk and store each by TMA (module doc)."""
    ir = task.ir
    t = ir.tiling
    rows, bn = t["BM"] // t["groups"], t["BN"]
    chunks = bn // STAGE_COLS
    per = stage_bytes(rows, bn, ir.params["dtype"])  # one kernel warpgroup's slots
    slots, slot = per // (rows * 128), rows * 128
    # a ping-pong graph's one warpgroup sized cs@0 for both kernel warpgroups: each takes its half
    base = ir.buffer(f"cs@{0 if ir.pingpong else task.role.group}").offset + (task.role.group * per if ir.pingpong
                                                                               else 0)
    sync = '  asm volatile("bar.sync %0, 128;" :: "r"(WG_BAR) : "memory");'
    # the CTA's last tile for this warpgroup: its stores must be done before the CTA's shared memory goes away
    nxt = f"tile + {ir.groups if ir.pingpong else 1} * (int)gridDim.x" if ir.persistent else "NTILES"
    out = [f"uint8_t* const st_ = smem + {base};", "const int tid_ = threadIdx.x & 127;"]
    for c in range(chunks):
        buf = f"st_ + {(c % slots) * slot}"
        if c == 0 or c >= slots:  # the slot's previous chunk (or, first, the previous tile's) has been read
            out += [f"if (tid_ == 0) bulk_wait_read<{0 if c == 0 else slots - 1}>();", sync]
        out.append("#pragma unroll\nfor (int m = 0; m < MT; ++m) {")
        for q in range(STAGE_COLS // 16):  # stmatrix.x4: 8-column groups jj, jj + 1 of rows r and r + 8
            jj = c * (STAGE_COLS // 8) + 2 * q
            out.append(f"  {{ const int r_ = m * 64 + w * 16 + (lane & 15), u_ = {2 * q} + (lane >> 4);\n"
                       f"    stmatrix_x4({buf} + r_ * 128 + ((u_ ^ (r_ & 7)) << 4), cpk[m][{2 * jj}], "
                       f"cpk[m][{2 * jj + 1}], cpk[m][{2 * jj + 2}], cpk[m][{2 * jj + 3}]); }}")
        out += ["}", '  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");', sync,
                f"if (tid_ == 0) {{ tma_store_2d(&tm_c, {buf}, n0 + {c * STAGE_COLS}, m0 + ROW0); bulk_commit(); }}"]
    out.append(f"if (tid_ == 0 && {nxt} >= NTILES) bulk_wait<0>();  // the CTA's last tile of this warpgroup")
    return "\n".join(out)


STORE_TMA = r"""
// ---- TMA store epilogue: four 8x8 b16 matrices from registers into shared memory (each lane: one row address)
__device__ __forceinline__ void stmatrix_x4(uint8_t* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
               :: "r"(smem_u32(p)), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ void tma_store_2d(const pts_tmap* map, const uint8_t* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(src)), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" :: "n"(N) : "memory");
}
"""


STORE_PAIR = r"""
// C[row, col], C[row, col + 1] = the packed pair pk (columns past N skipped; odd N: rows are not 4-byte aligned, the
// two halves are stored apart)
template <typename T>
__device__ __forceinline__ void store_pair(T* c, int row, int col, uint32_t pk, int N) {
  if (N % 2 == 0) {
    if (col < N) reinterpret_cast<uint32_t*>(c + (size_t)row * N)[col >> 1] = pk;
  } else {
    uint16_t* const c16 = reinterpret_cast<uint16_t*>(c + (size_t)row * N);
    if (col < N) c16[col] = pk & 0xffffu;
    if (col + 1 < N) c16[col + 1] = pk >> 16;
  }
}
"""


SUM_LOADS = 8  # splits' float4s a reduce thread keeps in flight


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
if (lane == 0) atomicAdd(cnt + (tmn_ * GROUPS + g) * 4 + w, 1);  // the tile's reduce CTAs store it"""


def _raster(tile: str) -> str:
    """C++ that turns output tile ``tile`` into its first row ``m0`` and column ``n0`` (grouped rasterisation:
    GROUP_M M-tiles sweep N together); the split units and the reduce CTAs share it."""
    return (f"  const int per_group = GROUP_M * TN, first_m = ({tile} / per_group) * GROUP_M;\n"
            "  const int gsz = (TM - first_m) < GROUP_M ? (TM - first_m) : GROUP_M;\n"
            f"  const int m0 = (first_m + ({tile} % per_group) % gsz) * BM, n0 = (({tile} % per_group) / gsz) * BN;\n")


def _out_tiles(ir: KernelIR) -> int:
    s = sizes(ir.params, ir.tiling)
    return s["TM"] * s["TN"]


def _rpt(ir: KernelIR) -> int:
    p = ir.params
    return reduce_ctas(p["M"], p["N"], dict(ir.tiling), ir.threads, ir.sms)


def _entry(ir: KernelIR) -> str:
    """The reduce CTAs' whole code (see the module doc): before any barrier is set up, they leave."""
    if _splits(ir) == 1:
        return ""
    dt, rpt = ir.params["dtype"], _rpt(ir)
    return "\n".join([
        "  static_assert(!PERSISTENT, \"split-K: the reduce CTAs follow the split units in a launched grid\");",
        "  if (blockIdx.x >= NTILES) {  // a reduce CTA: its share of output tile tmn_",
        f"    constexpr int RPT = {rpt}, NT = {ir.threads}, CH = MT * BN / 8, PER = GROUPS * CH * 128;",
        "    constexpr int SHARE = (PER + RPT - 1) / RPT;  // float4s of the tile per reduce CTA",
        "    const int tmn_ = (blockIdx.x - NTILES) / RPT, part_ = (blockIdx.x - NTILES) % RPT;",
        _raster("tmn_").rstrip("\n"),
        "    int* const ctr_ = cnt + tmn_ * GROUPS * 4;  // the tile's warp counters",
        "    if (threadIdx.x < GROUPS * 4) while (ld_acquire(ctr_ + threadIdx.x) < SPLITS) __nanosleep(64);",
        "    __syncthreads();",
        "    __threadfence();",
        "    const float4* const ws4_ = reinterpret_cast<const float4*>(ws);",
        "    const int end_ = min(PER, (part_ + 1) * SHARE);",
        "    for (int i = part_ * SHARE + threadIdx.x; i < end_; i += NT) {",
        "      const int g = i / (CH * 128), ch = (i / 128) % CH, tid_ = i % 128, lane = tid_ % 32, w = tid_ / 32;",
        "      const int m = ch / (BN / 8), q = ch % (BN / 8);",
        "      const int row = m0 + g * MT * 64 + m * 64 + w * 16 + (lane >> 2), col = n0 + q * 8 + 2 * (lane & 3);",
        "      if (row >= M) continue;  // never written",
        "      const float4* src = ws4_ + ((size_t)(tmn_ * GROUPS + g) * SPLITS * CH + ch) * 128 + tid_;",
        "      float4 a = make_float4(0.f, 0.f, 0.f, 0.f);",
        f"      for (int s0 = 0; s0 < SPLITS; s0 += {SUM_LOADS}) {{",
        f"        float4 v[{SUM_LOADS}];",
        "#pragma unroll",
        f"        for (int u = 0; u < {SUM_LOADS}; ++u)",
        "          v[u] = s0 + u < SPLITS ? __ldcg(src + (size_t)(s0 + u) * CH * 128)",
        "                                 : make_float4(0.f, 0.f, 0.f, 0.f);",
        "#pragma unroll",
        f"        for (int u = 0; u < {SUM_LOADS}; ++u) {{  // in split order",
        "          a.x += v[u].x; a.y += v[u].y; a.z += v[u].z; a.w += v[u].w;",
        "        }",
        "      }",
        "      // (row, col), (row, col + 1), (row + 8, col), (row + 8, col + 1): the accumulator fragment's float4",
        "#pragma unroll",
        "      for (int h = 0; h < 2; ++h) {",
        "        const int r = row + 8 * h;",
        "        if (r >= M) break;",
        f"        store_pair(c, r, col, {PACK2[dt]}(h ? a.z : a.x, h ? a.w : a.y), N);",
        "      }",
        "    }",
        "    __syncthreads();",
        "    if (threadIdx.x == 0 && atomicAdd(cnt + TM * TN * GROUPS * 4 + tmn_, 1) == RPT - 1) {",
        "      for (int k = 0; k < GROUPS * 4; ++k) ctr_[k] = 0;  // every reduce CTA has seen them: the next launch's",
        "      cnt[TM * TN * GROUPS * 4 + tmn_] = 0;",
        "    }",
        "    return;",
        "  }"])


def maps(p: Mapping[str, Any], t: Mapping[str, int]) -> tuple[TensorMapSpec, ...]:
    """Tensor maps of A [M, K] and B [N, K] (innermost first; strides in bytes), and of C [M, N] with a TMA-store
    epilogue (a box: one staged chunk of a warpgroup's rows)."""
    M, N, K, dt = p["M"], p["N"], p["K"], p["dtype"]
    ab = (TensorMapSpec("a", dt, (K, M), (K * 2,), (64, a_rows(M, t["BM"]))),  # rows past M are not loaded
          TensorMapSpec("b", dt, (K, N), (K * 2,), (64, t["BN"] // cluster_of(t))))  # a cluster: one CTA's share
    return (*ab, c_map(dt, M, N, t)) if t.get("tma_store", 0) else ab


def c_map(dtype: str, M: int, N: int, t: Mapping[str, int]) -> TensorMapSpec:
    """The tensor map of a contiguous C [M, N] a TMA-store epilogue writes (a box: one staged chunk of a warpgroup's
    rows); the exact build's and the generic launcher's."""
    return TensorMapSpec("c", dtype, (N, M), (N * 2,), (STAGE_COLS, t["BM"] // t["groups"]))


def _signature(ir: KernelIR) -> tuple[tuple[str, str], ...]:
    if _tma_store(ir):
        return ()  # C is written through its tensor map
    c = (("ptr:c", f"{CTYPE[ir.params['dtype']]}* __restrict__ c"),)
    if _splits(ir) == 1:
        return c
    return (*c, ("ptr:ws", "float* __restrict__ ws"), ("ptr:cnt", "int* __restrict__ cnt"))


def _info(ir: KernelIR) -> dict[str, object]:
    t = ir.tiling
    out: dict[str, object] = {"trips": _trips(ir), "splits": _splits(ir)}
    if _splits(ir) > 1:  # scratch the runtime zero-fills once (codegen.runtime.workspace_ptrs), bytes
        tiles = _out_tiles(ir)
        # per tile: a counter per warp of each warpgroup, then its reduce CTAs' counter
        out["workspace"] = {"ws": tiles * _splits(ir) * t["BM"] * t["BN"] * 4,
                            "cnt": tiles * (t["groups"] * 4 + 1) * 4}
        out["reduce_ctas_per_tile"] = _rpt(ir)
    return out


REGISTRY["gemm"] = OpKernel(
    op="gemm", check=_check, consts=_consts,
    device=lambda ir: (wgmma_ss(ir.tiling["BN"], ir.params["dtype"]) + STORE_PAIR
                       + (LD_ACQUIRE if _splits(ir) > 1 else "") + (STORE_TMA if _tma_store(ir) else "")),
    maps=lambda ir: maps(ir.params, ir.tiling), signature=_signature, tiles=_tiles, decls=_decls, body=_body,
    trips=_trips, min_trips=1, info=_info, sizes=sizes, size_params=SIZE_PARAMS, entry=_entry,
    extra_ctas=lambda ir: _rpt(ir) * _out_tiles(ir) if _splits(ir) > 1 else 0)
