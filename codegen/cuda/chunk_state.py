"""Mamba2 ChunkState task bodies: per-chunk SSM states, in mamba_ssm's ``_chunk_state_fwd`` layouts.

    states[b, c, h, p, n] = sum_{l in chunk c} x[b, l, h, p] * B[b, l, h // (H / G), n]
                                       * exp(dA_cumsum[b, h, c, Q - 1] - dA_cumsum[b, h, c, l]) * dt[b, h, c, l]

Inputs: x (batch, seq, heads, head_dim) and B (batch, seq, groups, d_state) in the plan's dtype; dt and dA_cumsum
(batch, heads, nchunks, chunk) float32 (dt already softplus'd). Output: states (batch, nchunks, heads, head_dim,
d_state) float32. A tile is BM d_state columns of one (chunk, head, batch), heads of a group side by side (they
share B); consumer warpgroup g owns BM/groups columns. Prologue: ``load_dalast`` (the 16 bytes ending at the
chunk's last dA). Loop: ``load_b``, ``load_x`` (TMA, 128-byte swizzle), ``load_dA`` / ``load_dt`` (unswizzled
TMA tiles); ``scale@g`` multiplies the x tile by s_l = exp(dA_last - dA_l)·dt_l into this warpgroup's xs (same
swizzled layout; s_l = 0 past seq so whatever dt / dA hold there cannot inject NaN/Inf), fences the async proxy
and syncs the warpgroup; ``mma@g`` accumulates acc[head_dim, cols] += xsᵀ·B, both operands MN-major (position
is K). The accumulator is (head_dim × d_state columns) so the epilogue writes contiguous d_state pairs.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ptsolve.errors import CodegenError, UnsupportedOperatorError

from ..kernel_ir import KernelIR, Role
from ..walk import LAST_READ
from .common import BULK, TensorMapSpec, check_dtype, wgmma_smem
from .skeleton import REGISTRY, OpKernel, Task

OP = "mamba2_chunk_state"
LOG2E = 1.4426950408889634


def _dims(p: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(p[k] for k in ("batch", "seq", "heads", "head_dim", "d_state", "chunk", "groups"))


# the sizes that do not change the schedule: a generic build (KernelIR.generic) takes them as kernel arguments
SIZE_PARAMS = ("batch", "seq", "heads", "groups")


def sizes(p: Mapping[str, Any], t: Mapping[str, int]) -> dict[str, int]:
    """The sizes a generic build takes at launch (batch, seq in positions, heads, groups of B; the chunks NC of the
    sequence), NTILES (CTAs: BM d_state columns of one (chunk, head, batch)) last."""
    B, L, H, P, N, Q, G = _dims(p)
    nc = -(-L // Q)
    return {"B_": B, "SEQ": L, "H": H, "G": G, "NC": nc, "NTILES": nc * H * (N // t["BM"]) * B}


def index_error(p: Mapping[str, Any]) -> str:
    """Why the shape ``p`` is beyond the kernel's 32-bit index ('' when it is not)."""
    B, L, H, P, N, Q, G = _dims(p)
    if B * H * -(-L // Q) * Q >= 1 << 31:
        return (f"{OP}: dt / dA_cumsum too large (batch·heads·nchunks·chunk >= 2^31) for the kernel's 32-bit "
                "index")
    return ""


def _check(ir: KernelIR) -> None:
    p, t = ir.params, ir.tiling
    check_dtype(p)
    B, L, H, P, N, Q, G = _dims(p)
    if P not in (64, 128):
        raise UnsupportedOperatorError(f"{OP}: head_dim must be 64 or 128, got {P}")
    if N % 64:
        raise UnsupportedOperatorError(f"{OP}: d_state={N} must be a multiple of 64 (128-byte TMA boxes)")
    if N % t["BM"]:
        raise CodegenError(f"{OP}: d_state={N} must be a multiple of 64 and of BM={t['BM']} (128-byte TMA boxes)")
    if (t["BM"] // t["groups"]) not in (64, 128) or Q % t["BK"]:
        raise CodegenError(f"{OP}: tiling {t}: 64 or 128 columns per warpgroup and a BK that divides chunk={Q}")
    if index_error(p):
        raise UnsupportedOperatorError(index_error(p))


def _consts(ir: KernelIR) -> str:
    p, t = ir.params, ir.tiling
    B, L, H, P, N, Q, G = _dims(p)
    # a generic build takes SEQ, H, G, NC, B_ and NTILES as kernel arguments (sizes)
    first = (f"  constexpr int P = {P}, N = {N}, Q = {Q};\n" if ir.generic else
             f"  constexpr int SEQ = {L}, H = {H}, G = {G}, P = {P}, N = {N}, Q = {Q}, NC = {-(-L // Q)}, B_ = {B};\n")
    return (first +
            f"  constexpr int BM = {t['BM']}, BK = {t['BK']}, MT = P / 64, COLS = {t['BM'] // t['groups']};\n"
            "  constexpr int XVEC = BK * P / 8;  // 16-byte vectors of one x tile\n"
            f"  constexpr float LOG2E = {LOG2E!r}f;")


def _tiles(ir: KernelIR) -> tuple[int | str, str]:
    nb = ir.params["d_state"] // ir.tiling["BM"]
    return "NTILES" if ir.generic else sizes(ir.params, ir.tiling)["NTILES"], (
        f"  const int x_ = tile % (NC * H), n0 = ((tile / (NC * H)) % {nb}) * BM, bz = tile / (NC * H * {nb});\n"
        "  const int c0 = x_ / H, hd = x_ % H, grp = hd / (H / G);\n"
        "  const int vec0 = ((bz * H + hd) * NC + c0) * Q;  // the dt / dA_cumsum row of (batch, head, chunk)\n"
        "  const int VALID = (SEQ - c0 * Q) < Q ? (SEQ - c0 * Q) : Q;  // positions of this chunk inside seq\n"
        "  const int T = (VALID + BK - 1) / BK;  // a ragged last chunk skips its all-padding steps\n"
        "  (void)grp; (void)vec0; (void)N; (void)B_;")


def _decls(ir: KernelIR, role: Role) -> str:
    rows = ir.tiling["BM"] // ir.tiling["groups"]
    return (f"constexpr int COL0 = {role.group * rows};\nfloat acc[MT][COLS / 2];\n"
            "const int tid = threadIdx.x & 127;\n(void)tid;")


def _body(t: Task) -> str:
    ir, b = t.ir, t.base
    BK, P, rows = ir.tiling["BK"], ir.params["head_dim"], ir.tiling["BM"] // ir.tiling["groups"]
    row = "c0 * Q + it_ * BK"  # the sequence row of this step's first position; rows >= SEQ are zero-filled
    if b == "load_dalast":
        return "bulk_load(dalast_s, da + vec0 + Q - 4, 16, fbar_);"
    if b == "load_b":
        return ("#pragma unroll\n  for (int c = 0; c < BM / 64; ++c)\n"
                f"    tma_load_4d(b_cur + c * BK * 128, &tm_b, fbar_, n0 + c * 64, grp, {row}, bz);")
    if b == "load_x":
        return ("#pragma unroll\n  for (int c = 0; c < P / 64; ++c)\n"
                f"    tma_load_4d(x_cur + c * BK * 128, &tm_x, fbar_, c * 64, hd, {row}, bz);")
    if b in ("load_dA", "load_dt"):
        # dt / dA rows are whole chunks in global memory (nchunks * chunk): this copy never leaves the tensor
        return f"  tma_load_2d({b[5:].lower()}_cur, &tm_{b[5:].lower()}, fbar_, it_ * BK, vec0 / Q);"
    if b == "zero":
        return ("#pragma unroll\nfor (int m = 0; m < MT; ++m) {\n#pragma unroll\n"
                "  for (int i = 0; i < COLS / 2; ++i) acc[m][i] = 0.f;\n  fence_regs(acc[m]);\n}")
    if b == "scale":
        return "\n".join([
            "  const float dal = reinterpret_cast<const float*>(dalast_s)[3];  // dA_cumsum at the chunk's end",
            "  const float* da_s = reinterpret_cast<const float*>(da_cur);",
            "  const float* dt_s = reinterpret_cast<const float*>(dt_cur);",
            "  // 16-byte vectors; swizzling permutes vectors within a 128-byte row, so vector v lies in row",
            "  // (v / 8) % BK of its 64-column block whatever the swizzle; xs keeps x's (swizzled) layout",
            "#pragma unroll", "  for (int i = 0; i < XVEC / 128; ++i) {",
            "    const int v = tid + 128 * i;", "    const int l = (v >> 3) % BK;",
            "    const float sl = (it_ * BK + l < VALID) ? fast_exp2((dal - da_s[l]) * LOG2E) * dt_s[l] : 0.f;",
            "    uint4 u = *reinterpret_cast<const uint4*>(x_cur + 16 * v);", "    scale8(u, sl);",
            "    *reinterpret_cast<uint4*>(xs_cur + 16 * v) = u;", "  }",
            "  // generic-proxy stores -> wgmma (async proxy) reads; all 128 threads before any wgmma",
            '  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");', LAST_READ,
            '  asm volatile("bar.sync %0, 128;" :: "r"(WG_BAR) : "memory");'])
    if b == "mma":
        lines = ["  const uint32_t sa = smem_u32(xs_cur), sb = smem_u32(b_cur) + COL0 / 64 * BK * 128;",
                 "  wg_fence();"]
        for kk in range(BK // 16):
            for m in range(P // 64):
                lines.append(f"  wgmma_tt_n{rows}(acc[{m}], make_desc(sa + {m * BK * 128 + kk * 2048}, {BK * 128}, "
                             f"1024), make_desc(sb + {kk * 2048}, {BK * 128}, 1024));")
        return "\n".join([*lines, "  wg_commit();"])
    assert b == "store", b
    # a thread holds rows p = 64m + 16w + lane/4 (+8) and column pairs n = 8j + 2(lane%4) of its tile
    return "\n".join([
        "#pragma unroll", "for (int m = 0; m < MT; ++m) fence_regs(acc[m]);",
        "float* obase = out + ((size_t)(bz * NC + c0) * H + hd) * P * N + n0 + COL0 + 2 * (lane & 3);",
        "#pragma unroll", "for (int m = 0; m < MT; ++m) {", "#pragma unroll", "  for (int hh = 0; hh < 2; ++hh) {",
        "    const int p = 64 * m + 16 * w + (lane >> 2) + 8 * hh;", "#pragma unroll",
        "    for (int j = 0; j < COLS / 8; ++j)",
        "      *reinterpret_cast<float2*>(obase + (size_t)p * N + 8 * j) = "
        "make_float2(acc[m][4 * j + 2 * hh], acc[m][4 * j + 2 * hh + 1]);", "  }", "}"])


def _device(ir: KernelIR) -> str:
    dt = ir.params["dtype"]
    ct = {"fp16": "pts_half2", "bf16": "pts_bf162"}[dt]
    to_f2 = {"fp16": "pts_half22float2", "bf16": "pts_bf1622float2"}[dt]
    to_h2 = {"fp16": "pts_floats2half2_rn", "bf16": "pts_floats2bf162_rn"}[dt]
    rows = ir.tiling["BM"] // ir.tiling["groups"]
    return (BULK + wgmma_smem(f"wgmma_tt_n{rows}", rows, dt, 1) + f"""
// x * s for the 8 fp16/bf16 values of a 16-byte vector, in fp32
__device__ __forceinline__ void scale8(uint4& u, float s) {{
  uint32_t* w = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {{
    float2 f = {to_f2}(*reinterpret_cast<{ct}*>(&w[i]));
    {ct} r = {to_h2}(f.x * s, f.y * s);
    w[i] = *reinterpret_cast<uint32_t*>(&r);
  }}
}}
""")


def maps(p: Mapping[str, Any], t: Mapping[str, int]) -> tuple[TensorMapSpec, ...]:
    """Tensor maps of contiguous x, B, dt and dA_cumsum of shape ``p`` (a generic kernel's launcher encodes them
    per shape)."""
    B, L, H, P, N, Q, G = _dims(p)
    BK, dt, NC, e = t["BK"], p["dtype"], -(-L // Q), 2
    return (
        TensorMapSpec("x", dt, (P, H, L, B), (P * e, H * P * e, L * H * P * e), (64, 1, BK, 1)),
        TensorMapSpec("b", dt, (N, G, L, B), (N * e, G * N * e, L * G * N * e), (64, 1, BK, 1)),
        TensorMapSpec("dt", "fp32", (Q, B * H * NC), (Q * 4,), (BK, 1), 0),
        TensorMapSpec("da", "fp32", (Q, B * H * NC), (Q * 4,), (BK, 1), 0),
    )


REGISTRY[OP] = OpKernel(
    op=OP, check=_check, device=_device, consts=_consts, maps=lambda ir: maps(ir.params, ir.tiling),
    signature=lambda ir: (("ptr:da", "const float* __restrict__ da"), ("ptr:out", "float* __restrict__ out")),
    tiles=_tiles, decls=_decls, body=_body, min_trips=1,
    info=lambda ir: {"xs_buffers": [ir.copies.get(f"xs@{g}", 1) for g in range(ir.groups)]},
    sizes=sizes, size_params=SIZE_PARAMS, exact_consts=True)
