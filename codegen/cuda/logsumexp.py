"""Row-wise log-sum-exp task bodies (ptsolve.ops.logsumexp): lse[r] = log Σ_c exp(x[r, c]).

Inputs: x (rows, cols), row-major, in the plan's dtype. Output: out (rows,) float32. A tile is BM rows; consumer
warpgroup g owns RW = BM/groups of them. ``load_x`` brings a BM × BK block unswizzled (TMA zero-fills past the
matrix's edge). In ``reduce@g`` a row block is VR = BK/8 16-byte vectors: thread t reads vector t % VR of rows
t / VR + i·(128/VR), i < NR, so the 128 threads read consecutive 16-byte vectors (no bank conflict) and each keeps a
running (max, sum) per (row, vector) in registers: NR = RW·VR/128 pairs. Columns past ``cols`` count as -inf.
``store@g`` combines the VR partials of a row (lanes of one warp, butterfly shuffles) and writes max + log(sum).
The running sums use a finite base: a row (or partial) with nothing but -inf keeps sum 0 and ends as -inf, as
torch.logsumexp does, never NaN.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ptsolve.errors import CodegenError

from ..kernel_ir import KernelIR, Role
from ..walk import Task
from .common import TensorMapSpec, check_dtype
from .skeleton import REGISTRY, OpKernel

OP = "logsumexp"
LOG2E = 1.4426950408889634


def _check(ir: KernelIR) -> None:
    check_dtype(ir.params)
    t = ir.tiling
    rows = t["BM"] // t["groups"]
    # VR = BK/8 threads share a row: a power of two dividing the warp, and the warpgroup covers whole row blocks
    if rows not in (64, 128) or t["BK"] not in (64, 128, 256) or t["BM"] > 256:
        raise CodegenError(f"{OP}: tiling {t}: 64 or 128 rows per warpgroup, BM <= 256 (a TMA box) and BK 64, 128 "
                           "or 256")
    if ir.params["cols"] % 8:
        raise CodegenError(f"{OP}: cols={ir.params['cols']} must be a multiple of 8 (the TMA's 16-byte row stride)")


def _consts(ir: KernelIR) -> str:
    p, t = ir.params, ir.tiling
    return (f"  constexpr int ROWS = {p['rows']}, COLS = {p['cols']};\n"
            f"  constexpr int BM = {t['BM']}, BK = {t['BK']}, RW = {t['BM'] // t['groups']};\n"
            "  constexpr int VR = BK / 8;  // 16-byte vectors of one row of a tile: the threads that share a row\n"
            "  constexpr int RSTEP = 128 / VR, NR = RW / RSTEP;  // rows a warpgroup covers per pass; passes\n"
            f"  constexpr float LOG2E = {LOG2E!r}f;\n"
            "  (void)ROWS; (void)COLS; (void)BM;")


def _tiles(ir: KernelIR) -> tuple[int, str]:
    p, t = ir.params, ir.tiling
    ntiles = -(-p["rows"] // t["BM"])
    return ntiles, "  const int r0 = tile * BM;\n  const int T = (COLS + BK - 1) / BK;"


def _decls(ir: KernelIR, role: Role) -> str:
    rw = ir.tiling["BM"] // ir.tiling["groups"]
    return (f"constexpr int ROW0 = {role.group * rw};  // this warpgroup's first row of the tile\n"
            "float mx[NR], sm[NR];  // running max and sum of exp(x - max) per (row, vector) this thread folds\n"
            "const int tid = threadIdx.x & 127;\n"
            "const int cv = tid % VR;  // this thread's 16-byte vector of every row it folds")


def _body(t: Task) -> str:
    b = t.base
    if b == "load_x":
        return "  tma_load_2d(x_cur, &tm_x, fbar_, it_ * BK, r0);"
    if b == "init":
        return "#pragma unroll\nfor (int i = 0; i < NR; ++i) { mx[i] = -INFINITY; sm[i] = 0.f; }"
    if b == "reduce":
        return "\n".join([
            "  const int col = it_ * BK + 8 * cv;",
            "  const uint4* xv = reinterpret_cast<const uint4*>(x_cur) + (ROW0 + tid / VR) * VR + cv;",
            "#pragma unroll", "  for (int i = 0; i < NR; ++i) {",
            "    float f[8];", "    unpack8(xv[i * 128], f);",
            "    float mloc = -INFINITY;", "#pragma unroll",
            "    for (int e = 0; e < 8; ++e) { f[e] = col + e < COLS ? f[e] : -INFINITY; mloc = fmaxf(mloc, f[e]); }",
            "    const float mn = fmaxf(mx[i], mloc);",
            "    const float base = mn == -INFINITY ? 0.f : mn;  // exp2(-inf) = 0; never -inf - -inf",
            "    float acc = sm[i] * fast_exp2((mx[i] - base) * LOG2E);", "#pragma unroll",
            "    for (int e = 0; e < 8; ++e) acc += fast_exp2((f[e] - base) * LOG2E);",
            "    mx[i] = mn; sm[i] = acc;", "  }"])
    if b == "store":
        return "\n".join([
            "#pragma unroll", "for (int i = 0; i < NR; ++i) {", "  float m = mx[i], s = sm[i];",
            "  // the VR threads of a row are VR consecutive lanes of one warp", "#pragma unroll",
            "  for (int o = VR / 2; o > 0; o >>= 1) {",
            "    const float mo = __shfl_xor_sync(0xffffffffu, m, o), so = __shfl_xor_sync(0xffffffffu, s, o);",
            "    const float mn = fmaxf(m, mo), base = mn == -INFINITY ? 0.f : mn;",
            "    s = s * fast_exp2((m - base) * LOG2E) + so * fast_exp2((mo - base) * LOG2E);", "    m = mn;", "  }",
            "  const int r = r0 + ROW0 + tid / VR + i * RSTEP;",
            "  if (cv == 0 && r < ROWS) out[r] = m + logf(s);", "}"])
    raise CodegenError(f"{OP}: no task body for {t.name!r}")


def _device(ir: KernelIR) -> str:
    dt = ir.params["dtype"]
    ct = {"fp16": "pts_half2", "bf16": "pts_bf162"}[dt]
    to_f2 = {"fp16": "pts_half22float2", "bf16": "pts_bf1622float2"}[dt]
    return f"""
// the 8 fp16/bf16 values of a 16-byte vector, in fp32
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {{
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {{
    const float2 v = {to_f2}(*reinterpret_cast<const {ct}*>(&w[i]));
    f[2 * i] = v.x; f[2 * i + 1] = v.y;
  }}
}}
"""


def maps(p: Mapping[str, Any], t: Mapping[str, int]) -> tuple[TensorMapSpec, ...]:
    """The tensor map of contiguous x (rows, cols): BM × BK boxes, unswizzled (read by plain 16-byte loads)."""
    return (TensorMapSpec("x", p["dtype"], (p["cols"], p["rows"]), (p["cols"] * 2,), (t["BK"], t["BM"]), 0),)


REGISTRY[OP] = OpKernel(
    op=OP, check=_check, device=_device, consts=_consts, maps=lambda ir: maps(ir.params, ir.tiling),
    signature=lambda ir: (("ptr:out", "float* __restrict__ out"),), tiles=_tiles, decls=_decls, body=_body)
