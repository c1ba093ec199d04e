"""Run a generated HIP kernel on the CPU: the same source with a host prelude, every lane a host thread.

There is no AMD GPU here, so this is how the kernels' index math, LDS layouts, MFMA operand and accumulator
layouts, masks and the LDS-semaphore protocol get executed at all: the device prelude (``common.PRELUDE``) is
swapped for ``EMU_PRELUDE``, in which a wavefront is 64 threads that meet at a barrier for each collective
(MFMA, lane shuffle, semaphore arrival: a wave arrives only when all its lanes are done, as the hardware's
lock-step wave does), LDS is one static array per workgroup, and the LDS semaphores are C++ atomics. The MFMA
emulation follows the CDNA3 ISA's operand and result layouts (lane ``i + TM * (k / 4)`` holds A[i][k] and
B[k][i]; result register r of lane l is row ``8 (r / 4) + 4 (l / 32) + r % 4`` (32x32) or ``4 (l / 16) + r``
(16x16), column ``l % TM``); it checks the kernels against that reading of the ISA, not against silicon.
Workgroups run one after another. Small shapes only: a workgroup is 512-1024 threads.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ptsolve.errors import CodegenError

from .common import PRELUDE, HipSource

EMU_PRELUDE = r"""
// ---- host emulation of the HIP prelude (codegen.hip.emulate): lanes are threads, waves meet at barriers
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __shared__ static
#define PTS_DEV inline
#define PTS_KERNEL(threads) extern "C" void
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef unsigned long long u64;
typedef u32 u32x2 __attribute__((ext_vector_type(2)));
typedef u32 u32x4 __attribute__((ext_vector_type(4)));
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef float f32x16 __attribute__((ext_vector_type(16)));

namespace pts_emu {
struct Wave {
  std::barrier<> bar{64};
  u32 a[64][2], b[64][2];
  float x[64];
};
struct Block {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<Wave>> waves;
};
inline thread_local int t_tid = 0, t_bid = 0;
inline int g_nblocks = 1;
inline Block* g_block = nullptr;
inline Wave& wave() { return *g_block->waves[t_tid / 64]; }
inline void wave_sync() { wave().bar.arrive_and_wait(); }
inline float half_at(const u32* v, int k, bool bf) {
  const u16 h = (u16)(v[k >> 1] >> ((k & 1) * 16));
  if (bf) { u32 u = (u32)h << 16; float f; std::memcpy(&f, &u, 4); return f; }
  _Float16 f; std::memcpy(&f, &h, 2); return (float)f;
}
// D = A * B + C of one MFMA of edge TM, for the calling lane's registers
template <int TM, typename V>
inline V mma(u32x2 a, u32x2 b, V c, bool bf) {
  Wave& w = wave();
  const int l = t_tid & 63;
  w.a[l][0] = a.x; w.a[l][1] = a.y; w.b[l][0] = b.x; w.b[l][1] = b.y;
  wave_sync();
  constexpr int NR = TM * TM / 64, K = 4 * (64 / TM);
  V d = c;
  for (int r = 0; r < NR; ++r) {
    const int i = TM == 32 ? 8 * (r >> 2) + 4 * (l >> 5) + (r & 3) : 4 * (l >> 4) + r, j = l % TM;
    float s = 0.f;
    for (int k = 0; k < K; ++k)
      s += half_at(w.a[i + TM * (k >> 2)], k & 3, bf) * half_at(w.b[j + TM * (k >> 2)], k & 3, bf);
    d[r] = c[r] + s;
  }
  wave_sync();
  return d;
}
}  // namespace pts_emu

namespace pts {
PTS_DEV int thread_id() { return pts_emu::t_tid; }
PTS_DEV int block_id() { return pts_emu::t_bid; }
PTS_DEV int num_blocks() { return pts_emu::g_nblocks; }
PTS_DEV int uniform(int x) { return x; }
PTS_DEV void block_sync() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  pts_emu::g_block->bar->arrive_and_wait();
}
PTS_DEV void sem_wait(u32* c, u32 target) {
  std::atomic_ref<u32> a(*c);
  for (u32 v = a.load(std::memory_order_acquire); (int)(v - target) < 0; v = a.load(std::memory_order_acquire))
    a.wait(v, std::memory_order_acquire);  // blocks in the kernel until an arrival changes the counter
}
PTS_DEV void sem_arrive(u32* c, int lane) {
  pts_emu::wave_sync();  // the hardware wave arrives when all its lanes are past this point
  if (lane == 0) {
    std::atomic_ref<u32> a(*c);
    a.fetch_add(1u, std::memory_order_acq_rel);
    a.notify_all();
  }
}
#define PTS_SETPRIO(p) ((void)(p))
PTS_DEV float shfl_xor(float v, int lane, int mask) {
  pts_emu::Wave& w = pts_emu::wave();
  w.x[lane] = v;
  pts_emu::wave_sync();
  const float r = w.x[lane ^ mask];
  pts_emu::wave_sync();
  return r;
}
PTS_DEV float fast_exp2(float x) { return std::exp2(x); }
PTS_DEV float fast_rcp(float x) { return 1.f / x; }
PTS_DEV f32x16 mma32_fp16(u32x2 a, u32x2 b, f32x16 c) { return pts_emu::mma<32>(a, b, c, false); }
PTS_DEV f32x4 mma16_fp16(u32x2 a, u32x2 b, f32x4 c) { return pts_emu::mma<16>(a, b, c, false); }
PTS_DEV f32x16 mma32_bf16(u32x2 a, u32x2 b, f32x16 c) { return pts_emu::mma<32>(a, b, c, true); }
PTS_DEV f32x4 mma16_bf16(u32x2 a, u32x2 b, f32x4 c) { return pts_emu::mma<16>(a, b, c, true); }
"""


def _harness(src: HipSource) -> str:
    n = len(src.args)
    params = ", ".join(f"(u16*)bufs[{i}]" for i in range(n))
    return f"""
int main(int argc, char** argv) {{
  if (argc != {n + 2}) {{
    std::fprintf(stderr, "usage: emu NBLOCKS {' '.join(a.split(':')[1] for a in src.args)}\\n");
    return 2;
  }}
  pts_emu::g_nblocks = std::atoi(argv[1]);
  std::vector<void*> bufs({n});
  std::vector<size_t> sizes({n});
  for (int i = 0; i < {n}; ++i) {{
    FILE* f = std::fopen(argv[i + 2], "rb");
    if (!f) return 3;
    std::fseek(f, 0, SEEK_END); sizes[i] = std::ftell(f); std::fseek(f, 0, SEEK_SET);
    bufs[i] = std::aligned_alloc(64, (sizes[i] + 63) / 64 * 64 + 64);
    if (std::fread(bufs[i], 1, sizes[i], f) != sizes[i]) return 4;
    std::fclose(f);
  }}
  constexpr int NT = {src.block[0]};
  for (int b = 0; b < pts_emu::g_nblocks; ++b) {{
    pts_emu::Block blk;
    blk.bar = std::make_unique<std::barrier<>>(NT);
    for (int w = 0; w < NT / 64; ++w) blk.waves.push_back(std::make_unique<pts_emu::Wave>());
    pts_emu::g_block = &blk;
    std::vector<std::thread> ts;
    for (int t = 0; t < NT; ++t)
      ts.emplace_back([&, t] {{ pts_emu::t_tid = t; pts_emu::t_bid = b; {src.name}({params}); }});
    for (auto& th : ts) th.join();
  }}
  for (int i = 0; i < {n}; ++i) {{
    FILE* f = std::fopen(argv[i + 2], "wb");
    std::fwrite(bufs[i], 1, sizes[i], f);
    std::fclose(f);
  }}
  return 0;
}}
"""


def host_compiler() -> str | None:
    """A clang++ that knows ext_vector_type, _Float16 and C++20 (clang++-19), or None."""
    for cand in (os.environ.get("PTSOLVE_EMU_CXX"), shutil.which("clang++-19"), "/usr/lib/llvm-19/bin/clang++"):
        if cand and Path(cand).exists():
            return cand
    return None


def emu_source(src: HipSource) -> str:
    """``src`` with the host prelude in place of the device one, plus a main() that runs its workgroups."""
    if PRELUDE not in src.source:
        raise CodegenError(f"{src.name}: the source has no HIP prelude to replace; was it emitted by codegen.hip?")
    return src.source.replace(PRELUDE, EMU_PRELUDE) + _harness(src)


def build(src: HipSource, workdir: Path) -> Path:
    """Compile the emulation of ``src`` into ``workdir``; cached by the source's hash."""
    cxx = host_compiler()
    if cxx is None:
        raise CodegenError("clang++-19 not found for the CPU emulation: apt-get install clang-19")
    code = emu_source(src)
    exe = workdir / f"emu_{hashlib.sha256(code.encode()).hexdigest()[:16]}"
    if not exe.exists():
        cpp = exe.with_suffix(".cpp")
        cpp.write_text(code)
        p = subprocess.run([cxx, "-std=c++20", "-O1", "-pthread", "-w", "-o", str(exe), str(cpp)],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise CodegenError(f"emulation build of {src.name} failed:\n{p.stderr[-4000:]}")
    return exe


def run(src: HipSource, arrays: dict[str, np.ndarray], blocks: int | None = None, timeout: float = 600.0,
        workdir: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """Run ``src``'s workgroups on the CPU with ``arrays`` (one per ``ptr:<name>`` argument, fp16 / bf16 bits as
    uint16) and return every array after the run. ``blocks``: workgroups to run (default the launch grid; a
    persistent kernel then strides over its tiles with that many)."""
    names = [a.split(":", 1)[1] for a in src.args]
    if set(arrays) != set(names):
        raise CodegenError(f"{src.name} takes arrays {names}, got {sorted(arrays)}")
    nb = int(blocks or src.grid[0])
    with tempfile.TemporaryDirectory(prefix="pts_emu_") as tmp:
        wd = Path(workdir) if workdir else Path(tmp)
        wd.mkdir(parents=True, exist_ok=True)
        exe = build(src, wd)
        paths = []
        for n in names:
            p = Path(tmp) / f"{n}.bin"
            np.ascontiguousarray(arrays[n]).tofile(p)
            paths.append(str(p))
        try:
            r = subprocess.run([str(exe), str(nb), *paths], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise CodegenError(f"emulated {src.name} ran past {timeout:.0f} s: its roles deadlock (a semaphore "
                               "that is never arrived on) or the shape is too large for the emulation") from e
        if r.returncode != 0:
            raise CodegenError(f"emulated {src.name} exited {r.returncode}: {r.stderr[-2000:]}")
        out: dict[str, Any] = {}
        for n, p in zip(names, paths):
            out[n] = np.fromfile(p, dtype=arrays[n].dtype).reshape(arrays[n].shape)
    return out
