"""Pieces shared by the HIP gfx942 emitters: the emitted-kernel record, the prelude (HIP keywords, LDS semaphores,
MFMA wrappers, lane shuffles) and generators for the producer's global -> LDS copies and the consumers' LDS reads.

Everything placed into source text here is a fixed string or an ``int`` computed from validated KernelIR numbers;
no user text reaches the compiler.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ptsolve.errors import CodegenError, UnsupportedOperatorError

WAVE = 64  # lanes of a CDNA3 wavefront
GROUP_WAVES = 4  # waves of one role (the producer or one consumer group): one per SIMD of the CU
GROUP_LANES = WAVE * GROUP_WAVES
ARCH = "gfx942"

DTYPES = ("fp16", "bf16")


@dataclass(frozen=True)
class HipSource:
    """A generated HIP kernel: source plus what a launcher needs.

    ``grid`` / ``block``: launch dimensions (a persistent kernel's grid.x is min(tiles, CUs)); ``lds_bytes``: the
    kernel's static LDS (the KernelIR's ``smem_bytes``); ``args``: kernel parameters in order (``ptr:<tensor>``);
    ``info``: what the schedule decided (ring depths, roles, orders, turns) for people and tests. All HIP results
    are compile-verified only, never run here (no AMD GPU)."""

    source: str
    name: str
    op: str
    params: dict[str, Any]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    lds_bytes: int
    args: tuple[str, ...]
    arch: str = ARCH
    info: dict[str, Any] = field(default_factory=dict)
    persistent_tiles: int = 0  # > 0: the kernel loops over this many tiles with a stride of gridDim.x


def check_dtype(p: dict[str, Any]) -> None:
    if p.get("dtype", "fp16") not in DTYPES:
        raise UnsupportedOperatorError(f"dtype {p.get('dtype')!r} is not supported by the HIP generator; use one of "
                                       f"{DTYPES}")


def mfma_shape(rows: int, cols: int) -> int:
    """Edge of the square MFMA tile (32: v_mfma_f32_32x32x8, 16: v_mfma_f32_16x16x16) for a wave tile of
    ``rows`` x ``cols``: the larger one reads half the LDS bytes per FLOP, the smaller fits 16-wide tiles."""
    if rows % 32 == 0 and cols % 32 == 0:
        return 32
    if rows % 16 == 0 and cols % 16 == 0:
        return 16
    raise CodegenError(f"a wave tile of {rows} x {cols} is not a multiple of 16 x 16 (the smallest f16 MFMA)")


def mfma_k(tm: int) -> int:
    """K elements of one MFMA of edge ``tm`` (4 per lane group: 2 groups of 32 lanes or 4 of 16)."""
    return 8 if tm == 32 else 16


def acc_regs(tm: int) -> int:
    """fp32 accumulator registers per lane of one ``tm`` x ``tm`` MFMA tile."""
    return tm * tm // WAVE


def acc_row(tm: int, r: str, lg: str) -> str:
    """C expression: the row (of the MFMA's M side) that accumulator register ``r`` of a lane in lane group ``lg``
    holds (CDNA3 ISA, MFMA output layout; its column is ``lane % tm``)."""
    return f"(8 * (({r}) >> 2) + 4 * ({lg}) + (({r}) & 3))" if tm == 32 else f"(4 * ({lg}) + ({r}))"


def swizzle_period(row_bytes: int) -> int:
    """16-byte chunks of an LDS row that the XOR swizzle permutes: the largest power of two <= 8 that divides the
    row's chunk count (rows of one tile then start on different banks)."""
    n = row_bytes // 16
    p = 8
    while p > 1 and n % p:
        p //= 2
    return p


@dataclass(frozen=True)
class LdsTile:
    """A row-major fp16/bf16 tile in LDS: ``rows`` x ``cols`` elements, 16-byte chunks XOR-swizzled by row."""

    rows: int
    cols: int

    @property
    def row_bytes(self) -> int:
        return self.cols * 2

    @property
    def period(self) -> int:
        return swizzle_period(self.row_bytes)

    def read8(self, base: str, row: str, col: str) -> str:
        """C expression: the 8 bytes (4 elements) at (row, col), col a multiple of 4: one ds_read_b64."""
        return f"lds_read8({base}, {row}, {col}, {self.row_bytes}, {self.period - 1})"


def copy_rows(tile: LdsTile, stg: str, src: str, ok: str) -> tuple[str, str]:
    """(stage, commit) code of a producer copy of ``tile`` from global memory: 16-byte chunks spread over the
    producer's ``GROUP_LANES`` lanes (``ptid``). ``src`` (C, of ``r_`` and ``c_``: tile row and column) is the
    chunk's global address as ``const u32x4*``; ``ok`` (C, of ``r_`` and ``c_``) says it lies inside the tensor
    (else the chunk is zero, like TMA's out-of-bounds fill). Stage: global loads into ``stg`` registers; commit:
    the LDS writes into ``dst_``."""
    if tile.cols % 8:
        raise CodegenError(f"an LDS tile of {tile.cols} columns cannot be copied in 16-byte chunks")
    per_row = tile.cols // 8
    n = tile.rows * per_row
    per = -(-n // GROUP_LANES)
    head = (f"#pragma unroll\n  for (int i_ = 0; i_ < {per}; ++i_) {{\n"
            f"    const int ch_ = ptid + i_ * {GROUP_LANES}, r_ = ch_ / {per_row}, c_ = (ch_ % {per_row}) * 8;\n"
            f"    (void)r_; (void)c_;\n")
    stage = (head + f"    u32x4 v_ = {{0u, 0u, 0u, 0u}};\n"
             f"    if ({'ch_ < ' + str(n) + ' && ' if n % GROUP_LANES else ''}{ok}) v_ = *({src});\n"
             f"    {stg}[i_] = v_;\n  }}")
    commit = (head + f"    {'if (ch_ < ' + str(n) + ') ' if n % GROUP_LANES else ''}"
              f"lds_write16(dst_, r_, c_, {tile.row_bytes}, {tile.period - 1}, {stg}[i_]);\n  }}")
    return stage, commit


def copy_rows_regs(tile: LdsTile) -> int:
    """uint4 staging registers per producer lane of copy_rows."""
    return -(-(tile.rows * tile.cols // 8) // GROUP_LANES)


def copy_transposed(rows: int, cols: int, stg: str, src: str, ok: str) -> tuple[str, str, LdsTile]:
    """(stage, commit, LDS tile) of a producer copy of a ``rows`` x ``cols`` global tile written transposed
    (``cols`` x ``rows``) into LDS: each lane loads a 4-row x 8-column block (four 16-byte loads) and writes eight
    8-byte rows of 4 consecutive source rows, which is the MFMA A-operand layout of V^T (4 consecutive keys per
    lane). ``src`` / ``ok`` as in copy_rows, of ``r_`` (source row) and ``c_`` (source column)."""
    if rows % 4 or cols % 8:
        raise CodegenError(f"a transposed LDS copy needs rows % 4 == 0 and cols % 8 == 0, got {rows} x {cols}")
    tile = LdsTile(cols, rows)
    per_row = cols // 8
    n = rows // 4 * per_row
    per = -(-n // GROUP_LANES)
    guard = f"ch_ < {n} && " if n % GROUP_LANES else ""
    head = (f"#pragma unroll\n  for (int i_ = 0; i_ < {per}; ++i_) {{\n"
            f"    const int ch_ = ptid + i_ * {GROUP_LANES}, r0_ = (ch_ / {per_row}) * 4, c_ = (ch_ % {per_row}) * 8;\n"
            f"    (void)r0_; (void)c_;\n")
    stage = (head + "#pragma unroll\n    for (int k_ = 0; k_ < 4; ++k_) {\n      const int r_ = r0_ + k_;\n"
             f"      u32x4 v_ = {{0u, 0u, 0u, 0u}};\n      if ({guard}{ok}) v_ = *({src});\n"
             f"      {stg}[i_][k_] = v_;\n    }}\n  }}")
    commit = (head + f"    {'if (ch_ < ' + str(n) + ') ' if n % GROUP_LANES else ''}"
              f"lds_write_t4x8(dst_, r0_, c_, {tile.row_bytes}, {tile.period - 1}, {stg}[i_]);\n  }}")
    return stage, commit, tile


def copy_transposed_regs(rows: int, cols: int) -> int:
    """4 x uint4 staging blocks per producer lane of copy_transposed."""
    return -(-(rows // 4 * cols // 8) // GROUP_LANES)


PRELUDE = r"""
// ---- HIP without ROCm headers: the keywords and types the kernel uses (clang's HIP mode knows the attributes)
#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif
#define PTS_DEV __device__ __attribute__((always_inline)) inline
#define PTS_KERNEL(threads) extern "C" __global__ void __attribute__((amdgpu_flat_work_group_size(threads, threads)))
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef unsigned long long u64;
typedef __SIZE_TYPE__ size_t;
typedef u32 u32x2 __attribute__((ext_vector_type(2)));
typedef u32 u32x4 __attribute__((ext_vector_type(4)));
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef short i16x4 __attribute__((ext_vector_type(4)));

namespace pts {

PTS_DEV int thread_id() { return __builtin_amdgcn_workitem_id_x(); }
PTS_DEV int block_id() { return __builtin_amdgcn_workgroup_id_x(); }
PTS_DEV int num_blocks() { return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(); }
// A value every lane of the wave holds alike, moved to a scalar register (uniform branches, no exec masking).
PTS_DEV int uniform(int x) { return __builtin_amdgcn_readfirstlane(x); }
PTS_DEV void block_sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// ---- LDS semaphores: the KernelIR's full / empty barriers as monotonic 32-bit arrival counters. A wait for the
// n-th completion waits until the counter reaches n arrivals (wrap-safe difference); a wave arrives once, from
// lane 0, after a workgroup-scope release fence (s_waitcnt on its LDS and global accesses).
PTS_DEV void sem_wait(u32* c, u32 target) {
  while ((int)((u32)uniform((int)__hip_atomic_load(c, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP)) - target) < 0)
    __builtin_amdgcn_s_sleep(1);
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
PTS_DEV void sem_arrive(u32* c, int lane) {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  if (lane == 0) __hip_atomic_fetch_add(c, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
}
#define PTS_SETPRIO(p) __builtin_amdgcn_s_setprio(p)

// ---- cross-lane and math
PTS_DEV float shfl_xor(float v, int lane, int mask) {
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute((lane ^ mask) << 2, __builtin_bit_cast(int, v)));
}
PTS_DEV float fast_exp2(float x) { return __builtin_amdgcn_exp2f(x); }
PTS_DEV float fast_rcp(float x) { return __builtin_amdgcn_rcpf(x); }

// ---- MFMA (wave64): fragments are 4 elements of 16 bits as u32x2
PTS_DEV f32x16 mma32_fp16(u32x2 a, u32x2 b, f32x16 c) {
  return __builtin_amdgcn_mfma_f32_32x32x8f16(__builtin_bit_cast(f16x4, a), __builtin_bit_cast(f16x4, b), c, 0, 0, 0);
}
PTS_DEV f32x4 mma16_fp16(u32x2 a, u32x2 b, f32x4 c) {
  return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(f16x4, a), __builtin_bit_cast(f16x4, b), c, 0, 0, 0);
}
PTS_DEV f32x16 mma32_bf16(u32x2 a, u32x2 b, f32x16 c) {
  return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(__builtin_bit_cast(i16x4, a), __builtin_bit_cast(i16x4, b), c,
                                                  0, 0, 0);
}
PTS_DEV f32x4 mma16_bf16(u32x2 a, u32x2 b, f32x4 c) {
  return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(i16x4, a), __builtin_bit_cast(i16x4, b), c,
                                                   0, 0, 0);
}
"""

COMMON = r"""
// ---- packing (round to nearest even)
PTS_DEV u32 bits_fp16(float x) { return (u32)__builtin_bit_cast(u16, (_Float16)x); }
PTS_DEV u32 bits_bf16(float x) {
  const u32 u = __builtin_bit_cast(u32, x);
  return ((u & 0x7fffffffu) > 0x7f800000u) ? 0x7fc0u : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
PTS_DEV u32 pack2_fp16(float a, float b) { return bits_fp16(a) | (bits_fp16(b) << 16); }
PTS_DEV u32 pack2_bf16(float a, float b) { return bits_bf16(a) | (bits_bf16(b) << 16); }

// ---- LDS tiles: row-major, 16-byte chunks XOR-swizzled by (row & mask) so the rows of a fragment read start on
// different banks. Offsets in bytes.
PTS_DEV int lds_off(int row, int col, int row_bytes, int mask) {
  return row * row_bytes + ((((col >> 3) ^ (row & mask))) << 4) + ((col & 7) << 1);
}
PTS_DEV u32x2 lds_read8(const u8* base, int row, int col, int row_bytes, int mask) {
  return *reinterpret_cast<const u32x2*>(base + lds_off(row, col, row_bytes, mask));
}
PTS_DEV void lds_write16(u8* base, int row, int col, int row_bytes, int mask, u32x4 v) {
  *reinterpret_cast<u32x4*>(base + lds_off(row, col, row_bytes, mask)) = v;
}
// A 4-row x 8-column block (rows r0..r0+3 as four u32x4) written transposed: LDS row c0 + d holds the 4 values of
// column d at columns r0..r0+3 (one 8-byte write per column).
PTS_DEV void lds_write_t4x8(u8* base, int r0, int c0, int row_bytes, int mask, const u32x4 (&v)[4]) {
#pragma unroll
  for (int d = 0; d < 8; ++d) {
    const int w = d >> 1, sh = (d & 1) * 16;
    u32x2 t;
    t.x = ((v[0][w] >> sh) & 0xffffu) | (((v[1][w] >> sh) & 0xffffu) << 16);
    t.y = ((v[2][w] >> sh) & 0xffffu) | (((v[3][w] >> sh) & 0xffffu) << 16);
    *reinterpret_cast<u32x2*>(base + lds_off(c0 + d, r0, row_bytes, mask)) = t;
  }
}
"""

PRELUDE_END = "\n}  // namespace pts\n"
