"""Pieces shared by the CUDA sm_90a emitters: the emitted-kernel record, tensor-map specs, the PTX
prelude (mbarrier, TMA, wgmma helpers) and generators for the wgmma instruction wrappers.

Everything placed into source text here is either a fixed string or an ``int``/known name checked by
``codegen.cuda.validate`` before it arrives, so no user-controlled text reaches the compiler.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Register budget after setmaxnreg: a 128-thread producer keeps this many registers per thread.
PRODUCER_REGS = 24  # setmaxnreg.dec of the producer (the old emitters; ptsolve.hw.Target.producer_regs)

SMEM_LIMIT = 227 * 1024  # bytes of dynamic shared memory one block may opt into on sm_90
SWIZZLE_128B = 128
NVCC_FLAGS = ("-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-Xptxas", "-v", "-lineinfo")

CTYPE = {"fp16": "pts_half", "bf16": "pts_bf16"}
PTXTYPE = {"fp16": "f16", "bf16": "bf16"}
PACK2 = {"fp16": "pack_half2", "bf16": "pack_bf162"}


@dataclass(frozen=True)
class TensorMapSpec:
    """One ``CUtensorMap`` the launcher must encode and pass (by value) as a kernel parameter.

    ``dims``/``strides_bytes``/``box`` are innermost-first as cuTensorMapEncodeTiled takes them;
    ``strides_bytes`` has len(dims) - 1 entries (the innermost stride is the element size);
    ``tensor`` names the launch argument the map describes (``a``, ``b``, ``q``, ``k``, ``v``).
    """

    tensor: str
    dtype: str
    dims: tuple[int, ...]
    strides_bytes: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = SWIZZLE_128B  # bytes: 128 for wgmma operand tiles, 0 for plain vectors (dtype fp32)


@dataclass(frozen=True)
class KernelSource:
    """A generated kernel: CUDA C++ source plus everything needed to compile and launch it.

    ``grid``/``block`` are the launch dimensions (the kernel is built for the exact shape in
    ``params``; a persistent kernel's grid.x is re-sized to the device's SM count at launch),
    ``smem_bytes`` the dynamic shared memory in bytes (incl. 1 KB alignment slack),
    ``args`` the kernel parameters in order: ``tmap:<tensor>`` for a tensor map, ``ptr:<tensor>`` for a
    raw device pointer; ``flags`` the nvcc flags.
    """

    source: str
    name: str
    op: str
    params: dict[str, Any]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    tensor_maps: tuple[TensorMapSpec, ...]
    args: tuple[str, ...]
    flags: tuple[str, ...] = NVCC_FLAGS
    info: dict[str, Any] = field(default_factory=dict)
    persistent_tiles: int = 0  # > 0: grid.x = persistent_grid(this, the device's SMs); the kernel loops over tiles
    # shape-generic: sizes are kernel arguments (``i32:<name>``, ``f32:<name>``), tensor maps and grid are made per
    # shape at launch (ptsolve.serve); ``grid`` and ``tensor_maps`` describe the representative shape only
    generic: bool = False
    cluster: int = 1  # CTAs of a thread-block cluster (__cluster_dims__): the launched grid.x is a multiple of it


def persistent_grid(tiles: int, sms: int, cluster: int = 1) -> int:
    """CTAs of a persistent launch: one per SM at most and no more than its tiles, in whole clusters (the kernel
    pairs a cluster's tiles; a persistent kernel strides its tiles by gridDim.x). The one rule the emitter's grid
    and the runtime's launch on the device's SM count use."""
    return min(tiles, sms) // cluster * cluster


def check_dtype(p: dict[str, Any]) -> None:
    """CodegenError unless the operator's dtype is one the wgmma wrappers take."""
    from ptsolve.errors import UnsupportedOperatorError
    if p.get("dtype", "fp16") not in CTYPE:
        raise UnsupportedOperatorError(f"dtype {p.get('dtype')!r} is not supported by the CUDA generator; use one of "
                           f"{sorted(CTYPE)}")


# What the kernels take from cuda.h, cuda_fp16.h and cuda_bf16.h is declared here, not included: nvcc parses those
# headers in every run, about 0.2 s of its 2-2.5 s on an attention kernel (2 cores; a cold optimize waits for one or
# two runs), and the kernels use only a tensor map's size and alignment, 16-bit storage types and eight conversions,
# each the PTX instruction the headers issue. Own names (pts_*), so a header included beside them cannot clash.
PRELUDE = r"""
#include <stdint.h>

struct alignas(128) pts_tmap { uint64_t opaque[16]; };  // CUtensorMap (cuda.h 13.0: 128 bytes, 128-aligned)
struct alignas(2) pts_half { uint16_t bits; };
struct alignas(2) pts_bf16 { uint16_t bits; };
// pairs copy as one 32-bit word, as the headers' __half2/__nv_bfloat162 do: the same loads, and the same aliasing
// facts for the optimizer (a global load of a pair the kernel never writes becomes ld.global.nc); the tag keeps the
// two types apart
template <int Tag> struct alignas(4) pts_pair {
  uint16_t x, y;
  pts_pair() = default;
  __device__ pts_pair(const pts_pair& s) { *this = s; }
  __device__ pts_pair& operator=(const pts_pair& s) {
    *reinterpret_cast<uint32_t*>(this) = *reinterpret_cast<const uint32_t*>(&s);
    return *this;
  }
};
using pts_half2 = pts_pair<16>;
using pts_bf162 = pts_pair<-16>;

__device__ __forceinline__ float pts_half2float(pts_half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ float pts_bf162float(pts_bf16 h) {
  float f;
  asm("cvt.f32.bf16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ pts_half pts_float2half_rn(float f) {
  pts_half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
__device__ __forceinline__ pts_bf16 pts_float2bf16_rn(float f) {
  pts_bf16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
__device__ __forceinline__ float2 pts_half22float2(pts_half2 h) {
  float lo, hi;
  const uint32_t& u = *reinterpret_cast<uint32_t*>(&h);
  asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %1;\n cvt.f32.f16 %0, l;}" : "=f"(lo) : "r"(u));
  asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %1;\n cvt.f32.f16 %0, h;}" : "=f"(hi) : "r"(u));
  return make_float2(lo, hi);
}
__device__ __forceinline__ float2 pts_bf1622float2(pts_bf162 h) {
  return make_float2(pts_bf162float(pts_bf16{h.x}), pts_bf162float(pts_bf16{h.y}));
}
__device__ __forceinline__ pts_half2 pts_floats2half2_rn(float a, float b) {
  pts_half2 h;
  asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(*reinterpret_cast<uint32_t*>(&h)) : "f"(a), "f"(b));  // a: the low half
  return h;
}
__device__ __forceinline__ pts_bf162 pts_floats2bf162_rn(float a, float b) {
  pts_bf162 h;
  asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(*reinterpret_cast<uint32_t*>(&h)) : "f"(a), "f"(b));
  return h;
}

namespace pts {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier --------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_u32(bar)) : "memory");
}
// Spin until the phase with parity `parity` has completed (a fresh barrier counts parity 1 as done,
// which is what lets the producer start on empty slots without a pre-arrival).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  } while (!done);
}

// ---- TMA (bulk tensor copy engine) -------------------------------------------------------------
__device__ __forceinline__ void tma_load_2d(void* dst, const pts_tmap* map, uint64_t* bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
               :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const pts_tmap* map, uint64_t* bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5, %6}], [%2];"
               :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)),
                  "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void tma_prefetch_desc(const pts_tmap* map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- wgmma -------------------------------------------------------------------------------------
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// Pin register values in place around async wgmma (the compiler must not move reads/writes across).
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}
template <int N> __device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i]) :: "memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle. Addresses/offsets in bytes (encoded >> 4).
// K-major operands: SBO = 1024 (8 rows of 128 B), LBO unused. MN-major: LBO = stride between
// 64-element column blocks, SBO = stride between 8-row K blocks.
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((saddr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16;
  d |= static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  pts_half2 h = pts_floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack_bf162(float a, float b) {
  pts_bf162 h = pts_floats2bf162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""

PRELUDE_END = "\n}  // namespace pts\n"

# a CTA that waits for other CTAs' counted work (flash_decode's merge CTAs, split-K's reduce CTAs) reads its counter so
LD_ACQUIRE = r"""
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
"""

FAST_DIV = r"""
// n / d for 0 <= n < 2^31 by a launch's divisor d, with (m, s) = codegen.cuda.common.fast_div(d): a multiply-high
// and a shift, not the ~20 dependent instructions of a division by a run-time value
__device__ __forceinline__ int fdiv(int n, int d, int m, int s) {
  return d == 1 ? n : static_cast<int>(__umulhi(static_cast<unsigned>(n), static_cast<unsigned>(m)) >> s);
}
"""


def fast_div(d: int) -> tuple[int, int]:
    """(m, s) for ``fdiv`` (Granlund-Montgomery, round-up multiplier): n / d == umulhi(n, m) >> s for every
    0 <= n < 2^31 and 1 < d < 2^31; ``m`` as a signed 32-bit value (an ``i32`` kernel argument's bits)."""
    if not 1 <= d < 1 << 31:
        raise ValueError(f"divisor {d} outside 1 .. 2^31 - 1")
    if d == 1:
        return 0, 0
    p = 31 + (d - 1).bit_length()  # 32 + ceil(log2 d) - 1
    m = ((1 << p) + d - 1) // d
    return (m - (1 << 32) if m >= 1 << 31 else m), p - 32


BULK = r"""
// 1-D bulk copy global -> shared, completing on an mbarrier (16-byte aligned, size a multiple of 16)
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
"""


CLUSTER_FNS = r"""
// ---- thread-block cluster (TMA multicast) ------------------------------------------------------
// Every thread of every CTA of the cluster arrives and waits: the peers' barriers are initialised before anyone
// multicasts into them or arrives on them, and no CTA leaves while a peer may still arrive on its barriers.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n barrier.cluster.wait.acquire;" ::: "memory");
}
// Arrive on the mbarrier at `bar`'s offset in each of the `n` CTAs of the cluster (this one included). The arrive
// keeps the default .release.cta semantics: .release.cluster made every arrival a cluster-wide fence, and the GEMM
// loops that release a slot per K step ran 2-3x slower (bench study gemm_skinny); the slot's readers are wgmmas already
// waited for, and the refill is the async proxy's, as in a single CTA.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, int n) {
  for (int r = 0; r < n; ++r)
    asm volatile("{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
                 " mbarrier.arrive.shared::cluster.b64 _, [ra];\n}"
                 :: "r"(smem_u32(bar)), "r"(r) : "memory");
}
// A 2-D TMA box written to the same shared-memory offset of every CTA in `mask`, completing on each one's mbarrier
// at `bar`'s offset.
__device__ __forceinline__ void tma_load_2d_mc(void* dst, const pts_tmap* map, uint64_t* bar, int c0, int c1,
                                               uint16_t mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%4, %5}], [%2], %3;"
               :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "h"(mask),
                  "r"(c0), "r"(c1) : "memory");
}
"""


def setup(inits: str, maps: tuple[str, ...], cluster: int = 1) -> str:
    """The kernel lines every emitter shares between the shared-memory carve-up and the role branches: thread 0
    runs ``inits`` (mbarrier initialisation, C++ lines indented four spaces), fences them for the async proxy
    and prefetches the tensor maps ``tm_<name>``; then every thread learns its warpgroup ``wg`` and ``lane``.
    ``cluster`` > 1: the CTAs of the cluster meet once the barriers are initialised (CLUSTER_FNS)."""
    prefetch = " ".join(f"tma_prefetch_desc(&tm_{m});" for m in maps)
    return ("  if (threadIdx.x == 0) {\n" + inits + "\n"
            '    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");\n'
            f"    {prefetch}\n  }}\n  __syncthreads();\n" + ("  cluster_sync();\n" if cluster > 1 else "") +
            "  const int wg = __shfl_sync(0xffffffff, threadIdx.x / 128, 0);\n"
            "  const int lane = threadIdx.x & 31;")


def wgmma_smem(name: str, n: int, dtype: str, trans: int, scale: str = "1") -> str:
    """Device function ``name``: D[64 x n] (+)= A(smem) * B(smem) by descriptors, ``trans`` 1 = both operands
    MN-major (0: K-major). ``scale``: "1" accumulates, "0" writes D as a pure output (the compiler then keeps no
    old values alive), "arg" takes an ``int scale_d`` argument."""
    t = PTXTYPE[dtype]
    nreg = n // 2
    regs = ", ".join(f"%{i}" for i in range(nreg))
    outs = ", ".join(f'"{"=" if scale == "0" else "+"}f"(d[{i}])' for i in range(nreg))
    arg, pred, ins = (", int scale_d", f"%{nreg + 2}", ', "r"(scale_d)') if scale == "arg" else ("", scale, "")
    head = f"__device__ __forceinline__ void {name}(float (&d)[{nreg}], uint64_t da, uint64_t db{arg}) {{\n"
    return (
        head +
        f'  asm volatile("{{\\n .reg .pred p;\\n setp.ne.b32 p, {pred}, 0;\\n"\n'
        f'    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{regs}}}, %{nreg}, %{nreg + 1}, p, 1, 1, '
        f'{trans}, {trans};\\n}}"\n'
        f"    : {outs}\n"
        f'    : "l"(da), "l"(db){ins});\n'
        f"}}\n"
    )


def wgmma_ss(n: int, dtype: str) -> str:
    """Device functions ``wgmma_ss_n{n}_{t}``: D[64 x n] (+)= A(smem) * B(smem), both K-major, and
    ``..._z``: D = A * B (scale-d 0) with D as a pure output, so the compiler does not keep the old
    accumulator values alive across the loop (they would double the registers of a score buffer)."""
    name = f"wgmma_ss_n{n}_{PTXTYPE[dtype]}"
    return wgmma_smem(name, n, dtype, 0, "arg") + wgmma_smem(name + "_z", n, dtype, 0, "0")


def wgmma_rs(n: int, dtype: str, trans_b: int) -> str:
    """Device function ``wgmma_rs_n{n}``: D[64 x n] += A(registers, 4 x b32) * B(smem); ``trans_b`` 1 =
    B is MN-major (e.g. V[keys, d] with d contiguous)."""
    t = PTXTYPE[dtype]
    nreg = n // 2
    regs = ", ".join(f"%{i}" for i in range(nreg))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nreg))
    a = nreg
    return (
        f"__device__ __forceinline__ void wgmma_rs_n{n}_{t}_t{trans_b}(float (&d)[{nreg}], const uint32_t (&a)[4], "
        f"uint64_t db) {{\n"
        f'  asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{regs}}}, '
        f'{{%{a}, %{a + 1}, %{a + 2}, %{a + 3}}}, %{a + 4}, 1, 1, 1, {trans_b};"\n'
        f'    : {outs}\n'
        f'    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));\n'
        f"}}\n"
    )
