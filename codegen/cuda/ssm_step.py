"""Mamba2 decode-step task bodies (ptsolve.ops.ssm_step), mamba_ssm's ``selective_state_update`` on one token:

    dt = clamp(softplus?(dt[b, j] + dt_bias[j]), DT_LO, DT_HI);  h = exp(dt·A[j])·h + dt·x ⊗ B;  y = (C·h + D·x)·silu(z)

Inputs: state (batch, H, P, N) float32, or in the dtype where SH is 1, updated in place; x, z (batch, H, P) in the
dtype with batch-row strides SX, SZ (elements; z may be a null pointer: no gate); B, C (batch, G, N) in the dtype
with batch-row strides SB, SC, head j reading group j / HG; dt (batch, H) with batch-row stride SDT; A, dt_bias (H,)
(dt_bias may be null); D (H,) or (H, P) or null. FLAGS: 1 softplus, 2 D is (H, P) (float32, copied per trip with the
inputs), 4 / 8 / 16 / 32 dt / A / dt_bias / a (H,) D are float32 (else in the dtype). Output: y (batch, H, P)
contiguous in the dtype. Every row a bulk copy reads starts on 16 bytes (the launcher checks the strides).

A tile is PT rows of one (batch, head)'s state; a trip BP of them, consumer warpgroup g owning RW = BP/groups. A row
is VPR = N/4 vectors of 4 elements; thread t owns vector t % VPR of rows t / VPR + RSTEP·i (i < NV, RSTEP = 128/VPR),
so consecutive threads touch consecutive vectors (no bank conflict, whole 128-byte lines in global memory) and the
VPR lanes of a row sit in one warp: C·h is their butterfly sum. ``load_s`` copies the trip's BP rows of state (one
contiguous run), ``load_in`` the trip's x and z rows, the group's B and C rows and D's rows; ``init@g`` computes the
tile's dt, exp(dt·A) and a scalar D; ``step@g`` updates the rows in float32 registers and sums C·h; ``put@g`` writes
them back and, from the row's first lane, y.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ptsolve.errors import CodegenError

from ..kernel_ir import KernelIR, Role
from ..walk import LAST_READ, Task
from .common import BULK, CTYPE, PACK2, TensorMapSpec, check_dtype
from .skeleton import REGISTRY, OpKernel

OP = "mamba2_ssm_step"
SIZE_PARAMS = ("batch", "heads", "groups", "state_dtype")
FLAG_SOFTPLUS, FLAG_D_ROWS, FLAG_DT32, FLAG_A32, FLAG_BIAS32, FLAG_D32 = 1, 2, 4, 8, 16, 32


def sizes(p: Mapping[str, Any], t: Mapping[str, int]) -> dict[str, int]:
    """The sizes a generic build takes at launch: batch B_, heads H, heads per group HG, SH (1: the state is in the
    activations' dtype, 0: float32) and NTILES (CTAs: PT rows of one (batch, head)'s state) last."""
    return {"B_": p["batch"], "H": p["heads"], "HG": p["heads"] // p["groups"],
            "SH": int(p.get("state_dtype", "fp32") != "fp32"),
            "NTILES": p["batch"] * p["heads"] * (p["head_dim"] // t["PT"])}


def _check(ir: KernelIR) -> None:
    check_dtype(ir.params)
    p, t = ir.params, ir.tiling
    P, N = p["head_dim"], p["d_state"]
    if N not in (16, 32, 64, 128) or P % 8:
        raise CodegenError(f"{OP}: d_state={N} must be 16, 32, 64 or 128 and head_dim={P} a multiple of 8")
    rw = t["BP"] // t["groups"]
    nv = rw * N // 512
    if t["BP"] % t["groups"] or rw * N % 512 or nv not in (1, 2, 4, 8) or t["BP"] % 8 or t["PT"] % t["BP"] \
            or P % t["PT"]:
        raise CodegenError(f"{OP}: tiling {t}: a warpgroup owns 1 to 8 vectors a thread (BP/groups·d_state/512), "
                           f"BP a multiple of 8, PT a multiple of BP dividing head_dim = {P}")


def _consts(ir: KernelIR) -> str:
    p, t = ir.params, ir.tiling
    return (f"  constexpr int P = {p['head_dim']}, N = {p['d_state']}, BP = {t['BP']}, PT = {t['PT']};\n"
            f"  constexpr int RW = {t['BP'] // t['groups']};  // rows of a trip a warpgroup owns\n"
            "  constexpr int VPR = N / 4, RSTEP = 128 / VPR, NV = RW / RSTEP;  // see the module doc\n"
            "  constexpr int NPT = P / PT;  // tiles of one (batch, head)'s state\n"
            "  const int ES = SH ? 2 : 4;  // bytes of a state element\n"
            "  (void)B_;")


def _tiles(ir: KernelIR) -> tuple[int | str, str]:
    n = "NTILES" if ir.generic else sizes(ir.params, ir.tiling)["NTILES"]
    return n, ("  const int pt = tile % NPT, bh = tile / NPT;  // row block, then (batch, head)\n"
               "  const int hd = bh % H, bz = bh / H, grp = hd / HG;\n"
               "  const int p0 = pt * PT;  // this tile's first row\n"
               "  const size_t row0 = (size_t)bh * P + p0;  // its first row of the state (and of y)\n"
               "  const int T = PT / BP;\n"
               "  (void)grp; (void)row0; (void)T;")


def _decls(ir: KernelIR, role: Role) -> str:
    rw = ir.tiling["BP"] // ir.tiling["groups"]
    return (f"constexpr int OFF = {role.group * rw};  // this warpgroup's first row of a trip\n"
            "const int tid = threadIdx.x & 127;\n"
            "const int cv = tid % VPR, r0 = tid / VPR;  // this thread's vector of a row; its first row\n"
            "float st[4 * NV];  // the updated state of rows OFF + r0 + RSTEP·i, columns 4·cv .. 4·cv + 3\n"
            "float yv[NV];  // those rows' y\n"
            "float dtv = 0.f, dA = 0.f, Dh = 0.f;  // the tile's dt, exp(dt·A) and scalar D")


def _producer(b: str) -> str:
    if b == "load_s":
        return ("  bulk_load(s_cur, static_cast<const uint8_t*>(state) + (row0 + it_ * BP) * N * ES, BP * N * ES, "
                "fbar_);")
    return "\n".join([
        "  const int r_ = hd * P + p0 + it_ * BP;  // the trip's first row of x, z and a (H, P) D",
        "  bulk_load(in_cur, x + (size_t)bz * SX + r_, BP * 2, fbar_);",
        "  if (z != nullptr) bulk_load(in_cur + 2 * BP, z + (size_t)bz * SZ + r_, BP * 2, fbar_);",
        "  bulk_load(in_cur + 4 * BP, Bm + (size_t)bz * SB + grp * N, N * 2, fbar_);",
        "  bulk_load(in_cur + 4 * BP + 2 * N, Cm + (size_t)bz * SC + grp * N, N * 2, fbar_);",
        f"  if (FLAGS & {FLAG_D_ROWS}) bulk_load(in_cur + 4 * BP + 4 * N, static_cast<const float*>(D) + r_, BP * 4, "
        "fbar_);"])


_INIT = f"""// dt as recurrent_step's _dt: float32, plus the bias, softplus (identity above 20), clamped (NaN passes)
float d = ldf(dt, (size_t)bz * SDT + hd, FLAGS & {FLAG_DT32});
if (dtb != nullptr) d += ldf(dtb, hd, FLAGS & {FLAG_BIAS32});
if (FLAGS & {FLAG_SOFTPLUS}) d = d > 20.f ? d : log1pf(expf(d));
d = d < DT_LO ? DT_LO : (d > DT_HI ? DT_HI : d);
dtv = d;
dA = expf(d * ldf(A, hd, FLAGS & {FLAG_A32}));
Dh = (D != nullptr && !(FLAGS & {FLAG_D_ROWS})) ? ldf(D, hd, FLAGS & {FLAG_D32}) : 0.f;"""

_STEP = f"""  const T_* xin = reinterpret_cast<const T_*>(in_cur);
  const T_* zin = xin + BP;
  const T_* bin = zin + BP;
  const T_* cin = bin + N;
  const float* din = reinterpret_cast<const float*>(cin + N);
  float bb[4], cc[4], xr[NV], zr[NV], dd[NV], sv[4 * NV];
  ld4(bin + 4 * cv, bb); ld4(cin + 4 * cv, cc);
#pragma unroll
  for (int i = 0; i < NV; ++i) {{
    const int r = OFF + r0 + RSTEP * i;
    xr[i] = to_f(xin[r]);
    zr[i] = z != nullptr ? to_f(zin[r]) : 0.f;
    dd[i] = (FLAGS & {FLAG_D_ROWS}) ? din[r] : Dh;
    ld_state(s_cur, OFF * VPR + tid + 128 * i, SH, &sv[4 * i]);
  }}
{LAST_READ}
#pragma unroll
  for (int i = 0; i < NV; ++i) {{
    const float xd = dtv * xr[i];
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {{
      st[4 * i + e] = fmaf(dA, sv[4 * i + e], xd * bb[e]);
      acc = fmaf(cc[e], st[4 * i + e], acc);
    }}
#pragma unroll
    for (int o = VPR / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);  // the row's lanes
    float yy = fmaf(dd[i], xr[i], acc);
    if (z != nullptr) yy *= zr[i] / (1.f + expf(-zr[i]));  // silu(z)
    yv[i] = yy;
  }}"""


def _put(ir: KernelIR) -> str:
    pack = PACK2[ir.params["dtype"]]
    return "\n".join([
        "  const size_t v0 = (row0 + it_ * BP + OFF) * VPR + tid;  // this thread's first vector of the state",
        "#pragma unroll", "  for (int i = 0; i < NV; ++i) {",
        "    const float* s4 = &st[4 * i];",
        "    if (SH) reinterpret_cast<uint2*>(state)[v0 + 128 * i] = make_uint2("
        f"{pack}(s4[0], s4[1]), {pack}(s4[2], s4[3]));",
        "    else reinterpret_cast<float4*>(state)[v0 + 128 * i] = make_float4(s4[0], s4[1], s4[2], s4[3]);",
        "  }", "  if (cv == 0) {", "#pragma unroll",
        "    for (int i = 0; i < NV; ++i) y[row0 + it_ * BP + OFF + r0 + RSTEP * i] = from_f(yv[i]);", "  }"])


def _body(t: Task) -> str:
    b = t.base
    if b in ("load_s", "load_in"):
        return _producer(b)
    if b == "init":
        return _INIT
    if b == "step":
        return _STEP
    if b == "put":
        return _put(t.ir)
    raise CodegenError(f"{OP}: no task body for {t.name!r}")


def _device(ir: KernelIR) -> str:
    dt = ir.params["dtype"]
    ct = CTYPE[dt]
    to_f = {"fp16": "pts_half2float", "bf16": "pts_bf162float"}[dt]
    from_f = {"fp16": "pts_float2half_rn", "bf16": "pts_float2bf16_rn"}[dt]
    to_f2 = {"fp16": "pts_half22float2", "bf16": "pts_bf1622float2"}[dt]
    return BULK + f"""
using T_ = {ct};
__device__ __forceinline__ float to_f(T_ v) {{ return {to_f}(v); }}
__device__ __forceinline__ T_ from_f(float v) {{ return {from_f}(v); }}
// element i of a float32 or dtype array (a run-time flag: the model's parameters come in either)
__device__ __forceinline__ float ldf(const void* p, size_t i, int f32) {{
  return f32 ? static_cast<const float*>(p)[i] : to_f(static_cast<const T_*>(p)[i]);
}}
// four consecutive dtype values (8 bytes) in float32
__device__ __forceinline__ void ld4(const T_* p, float* f) {{
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = {to_f2}(*reinterpret_cast<const {ct}2*>(&u.x)), b = {to_f2}(*reinterpret_cast<const {ct}2*>(&u.y));
  f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
}}
// state vector v (4 elements) of a shared-memory slot, float32 or (half) in the dtype
__device__ __forceinline__ void ld_state(const uint8_t* s, int v, int half, float* f) {{
  if (half) {{
    ld4(reinterpret_cast<const T_*>(s) + 4 * v, f);
  }} else {{
    const float4 u = reinterpret_cast<const float4*>(s)[v];
    f[0] = u.x; f[1] = u.y; f[2] = u.z; f[3] = u.w;
  }}
}}
"""


def _signature(ir: KernelIR) -> tuple[tuple[str, str], ...]:
    ct = CTYPE[ir.params["dtype"]]
    return (("ptr:state", "void* __restrict__ state"), ("ptr:x", f"const {ct}* __restrict__ x"),
            ("ptr:dt", "const void* __restrict__ dt"), ("ptr:A", "const void* __restrict__ A"),
            ("ptr:B", f"const {ct}* __restrict__ Bm"), ("ptr:C", f"const {ct}* __restrict__ Cm"),
            ("ptr:D", "const void* __restrict__ D"), ("ptr:z", f"const {ct}* __restrict__ z"),
            ("ptr:dt_bias", "const void* __restrict__ dtb"), ("ptr:y", f"{ct}* __restrict__ y"),
            ("i32:SX", "const int SX"), ("i32:SZ", "const int SZ"), ("i32:SDT", "const int SDT"),
            ("i32:SB", "const int SB"), ("i32:SC", "const int SC"), ("i32:FLAGS", "const int FLAGS"),
            ("f32:DT_LO", "const float DT_LO"), ("f32:DT_HI", "const float DT_HI"))


def _fill_bytes(ir: KernelIR, task: str) -> str | None:
    if task == "load_s":
        return "(BP * N * ES)"  # a state in the dtype fills half the slot
    if task == "load_in":  # z and a (H, P) D only where given
        return f"(2 * BP + 4 * N + (z != nullptr ? 2 * BP : 0) + ((FLAGS & {FLAG_D_ROWS}) ? 4 * BP : 0))"
    return None


def maps(p: Mapping[str, Any], t: Mapping[str, int]) -> tuple[TensorMapSpec, ...]:
    """No tensor map: every copy is a 1-D bulk copy of contiguous bytes."""
    return ()


REGISTRY[OP] = OpKernel(
    op=OP, check=_check, device=_device, consts=_consts, maps=lambda ir: (), signature=_signature,
    tiles=_tiles, decls=_decls, body=_body, sizes=sizes, size_params=SIZE_PARAMS,
    trips=lambda ir: ir.tiling["PT"] // ir.tiling["BP"], fill_bytes=_fill_bytes)
