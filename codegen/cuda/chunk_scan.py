"""Mamba2 ChunkScan task bodies, in mamba_ssm's ``_chunk_scan_fwd`` layouts (its baseline takes the same tensors).

cb (batch, nchunks, ngroups, chunk, chunk) in the plan's ``cb_dtype`` (float32) or its dtype; x, out (batch, seq,
nheads, headdim); dt, dA_cumsum (batch, nheads, nchunks, chunk) float32; C (batch, seq, ngroups, dstate); prev_states
(batch, nchunks, nheads, headdim, dstate). x, C, states and out in the plan's dtype (the states are a wgmma operand;
``runtime.run_chunk_scan`` converts float32 ones).

    out[b, cQ+m, h, p] = exp(dA[m]) · Σ_n C[cQ+m, g, n] · states[c, h, p, n]
                         + Σ_{k ≤ m} cb[c, g, m, k] · exp(dA[m] − dA[k]) · dt[k] · x[cQ+k, h, p],   g = h // (H/G)

A tile is BM chunk positions of one (head, batch·chunk), the blocks with the longest causal loop first.
Prologue: ``load_c`` / ``load_states`` (TMA, 128-byte swizzle), ``load_dacs`` (a bulk copy), then per
warpgroup ``mma_state`` (acc = C·statesᵀ) and ``scale_state`` (acc *= exp(dA[m])). Loop: ``load_cb``,
``load_dA``, ``load_dt`` (unswizzled TMA tiles of the float32 (chunk rows, chunk) view) and ``load_x``;
``decay`` reads the swizzled CB tile straight into the wgmma accumulator layout, multiplies it by
exp2((dA[m] − dA[k])·log2 e)·dt[k] (zero where k > m or k ≥ seq) and packs A fragments; ``mma`` accumulates
W·x (A from registers, x MN-major). CB is loaded in 128-byte swizzled boxes whatever BK (the graph counts the
box): 64 columns of fp16/bf16, or with ``cb_dtype`` "fp32" 32 columns of float32 that the decay reads as they are,
so P is rounded once, when it is packed (mamba_ssm's arithmetic); otherwise CB is converted to float32 there.

A fused epilogue (params ``epilogue``, ``ptsolve.geometry.mamba2.EPILOGUES``) makes a kernel variant whose store
computes mamba_ssm's (acc + D·x)·silu(z) in float32 before the one rounding: x and z read from global memory in
the output's own layout (each thread its two rows' column pairs), D float32 per head or per (head, p). Arguments
``xres``, ``d_skip``, ``zg`` follow the others; without an epilogue the source is the plain kernel's, byte for byte.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ptsolve.errors import CodegenError, UnsupportedOperatorError
from ptsolve.geometry.mamba2 import CB_FP32, EPILOGUES, cb_box_cols, cb_bytes

from ..kernel_ir import KernelIR, Role
from ..walk import LAST_READ
from .common import BULK, CTYPE, PACK2, PTXTYPE, TensorMapSpec, check_dtype, wgmma_rs, wgmma_ss
from .skeleton import REGISTRY, OpKernel, Task

OP = "mamba2_chunk_scan"
LOG2E = math.log2(math.e)


def _dims(p: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(p[k] for k in ("batch", "seq", "heads", "head_dim", "d_state", "chunk", "groups"))


# the sizes that do not change the schedule: a generic build (KernelIR.generic) takes them as kernel arguments
SIZE_PARAMS = ("batch", "seq", "heads", "groups")


def sizes(p: Mapping[str, Any], t: Mapping[str, int]) -> dict[str, int]:
    """The sizes a generic build takes at launch (batch, seq in positions, heads, groups of B/C; the chunks NC of
    the sequence), NTILES (CTAs: BM positions of one (head, batch·chunk)) last."""
    B, L, H, P, N, Q, G = _dims(p)
    nc = -(-L // Q)
    return {"B_": B, "SEQ": L, "H": H, "G": G, "NC": nc, "NTILES": (Q // t["BM"]) * H * B * nc}


def index_error(p: Mapping[str, Any]) -> str:
    """Why the shape ``p`` is beyond the kernel's 32-bit indices ('' when it is not)."""
    B, L, H, P, N, Q, G = _dims(p)
    nc = -(-L // Q)
    # the 32-bit ints of the kernel: the dt / dA row, the output row, the cb and states TMA rows
    if max(B * H * nc * Q, B * L, B * nc * G * Q, B * nc * H * P) >= 1 << 31:
        return (f"{OP}: shape too large for the kernel's 32-bit indices (batch·heads·nchunks·chunk, batch·seq, and "
                "the cb / states TMA rows must stay below 2^31)")
    return ""


def _epilogue(p: Mapping[str, Any]) -> str:
    """The fused epilogue asked for ('' none), checked."""
    ep = p.get("epilogue", "")
    if ep and ep not in EPILOGUES:
        raise UnsupportedOperatorError(f"{OP}: epilogue {ep!r} is none of {EPILOGUES}")
    return ep


def _check(ir: KernelIR) -> None:
    p, t = ir.params, ir.tiling
    check_dtype(p)
    _epilogue(p)
    if p.get("cb_dtype", CB_FP32) != CB_FP32:  # the input dtype is the parameter's absence (ops.chunk_scan)
        raise UnsupportedOperatorError(f"{OP}: cb_dtype {p['cb_dtype']!r}: the generator reads CB as float32 "
                                       f"({CB_FP32!r}) or, without the parameter, in the input dtype")
    B, L, H, P, N, Q, G = _dims(p)
    if P != 64:
        raise UnsupportedOperatorError(f"{OP}: the CUDA generator supports head_dim 64, got {P}")
    if N % 64 or N > 256:
        raise UnsupportedOperatorError(f"{OP}: d_state must be a multiple of 64 up to 256 (64-column TMA boxes), "
                                       f"got {N}")
    if Q % 64 or Q > 256:
        raise UnsupportedOperatorError(f"{OP}: chunk must be a multiple of 64 up to 256, got {Q}")
    if t["BM"] != 64 * t["groups"] or t["BK"] not in (16, 32, 64, 128):
        raise CodegenError(f"{OP}: tiling {t}: BM must be 64 rows per warpgroup, BK one of 16, 32, 64, 128")
    if index_error(p):
        raise UnsupportedOperatorError(index_error(p))


def _consts(ir: KernelIR) -> str:
    p, t = ir.params, ir.tiling
    B, L, H, P, N, Q, G = _dims(p)
    if ir.generic:  # SEQ, H, G, NC, B_ and NTILES are kernel arguments (sizes)
        return (f"  constexpr int P = {P}, Q = {Q};\n"
                f"  constexpr int NMB = {Q // t['BM']}, BM = {t['BM']}, BK = {t['BK']}, NCH = {N // 64}, "
                f"CBCH = {max(1, t['BK'] // cb_box_cols(p))};\n"
                f"  constexpr float LOG2E = {LOG2E!r}f;")
    return (f"  constexpr int SEQ = {L}, H = {H}, G = {G}, P = {P}, Q = {Q}, NC = {-(-L // Q)}, B_ = {B};\n"
            f"  constexpr int NMB = {Q // t['BM']}, BM = {t['BM']}, BK = {t['BK']}, NCH = {N // 64}, "
            f"CBCH = {max(1, t['BK'] // cb_box_cols(p))};\n"
            f"  constexpr float LOG2E = {LOG2E!r}f;")


def _tiles(ir: KernelIR) -> tuple[int | str, str]:
    n = "NTILES" if ir.generic else sizes(ir.params, ir.tiling)["NTILES"]
    return n, ("  const int mb = NMB - 1 - tile % NMB, h = (tile / NMB) % H, bc = tile / (NMB * H);\n"
               "  const int bz = bc / NC, c = bc % NC, m0 = mb * BM, CQ = c * Q, grp = h / (H / G);\n"
               "  skip_ = CQ + m0 >= SEQ;  // the ragged last chunk: nothing of this block is stored\n"
               "  int T = (m0 + BM + BK - 1) / BK;  // k-blocks with k <= the block's last row\n"
               "  { const int lim = (SEQ - CQ + BK - 1) / BK; T = lim < T ? lim : T; }  // and k < seq\n"
               "  const int cb_row = ((bz * NC + c) * G + grp) * Q + m0, st_row = ((bz * NC + c) * H + h) * P;\n"
               "  const int vrow = (bz * H + h) * NC + c;  // the dt / dA_cumsum row of (batch, head, chunk)\n"
               "  (void)cb_row; (void)st_row; (void)vrow; (void)grp; (void)B_;")


def _decls(ir: KernelIR, role: Role) -> str:
    out = [f"constexpr int ROW0 = {64 * role.group};", "float acc[P / 2];",
           "float dam[2];  // dA[m] * log2(e) of this thread's two rows"]
    for i in range(ir.copies.get(f"w@{role.group}", 1)):
        out += [f"uint32_t pf{i}_flat[BK / 4];",
                f"uint32_t (&pf{i})[BK / 16][4] = *reinterpret_cast<uint32_t (*)[BK / 16][4]>(pf{i}_flat);"]
    return "\n".join(out)


def _load(b: str, cols: int) -> str:
    """A load task's copies into its slot (``fbar_`` its full barrier; ``cols``: columns of one CB box)."""
    if b == "load_c":
        return ("#pragma unroll\nfor (int cc = 0; cc < NCH; ++cc)\n"
                "  tma_load_4d(c_s + cc * BM * 128, &tm_c, fbar_, 64 * cc, grp, CQ + m0, bz);")
    if b == "load_states":
        return ("#pragma unroll\nfor (int cc = 0; cc < NCH; ++cc)\n"
                "  tma_load_2d(states_s + cc * P * 128, &tm_states, fbar_, 64 * cc, st_row);")
    if b == "load_dacs":
        return "bulk_load(dacs_s, da_ptr + (size_t)vrow * Q + m0, BM * 4, fbar_);"
    if b == "load_cb":
        return ("#pragma unroll\n  for (int cc = 0; cc < CBCH; ++cc)\n"
                f"    tma_load_2d(cb_cur + cc * BM * 128, &tm_cb, fbar_, it_ * BK + {cols} * cc, cb_row);")
    if b in ("load_dA", "load_dt"):
        # a TMA tile of the (rows of chunk, chunk) view: compute-sanitizer's racecheck follows tensor copies
        return f"  tma_load_2d({b[5:].lower()}_cur, &tm_{b[5:]}, fbar_, it_ * BK, vrow);"
    if b == "load_x":
        return "  tma_load_4d(x_cur, &tm_x, fbar_, 0, h, CQ + it_ * BK, bz);"
    raise AssertionError(b)


def _cb_pair(dt: str, fp32: bool) -> list[str]:
    """The decay's read of CB[r, col], CB[r, col + 1] into ``cf`` (float2) from the swizzled tile (``fp32``: float32
    CB, read as it is; else two fp16/bf16 values converted)."""
    if fp32:
        # 32 float32 columns a 128-byte row: column col sits in box col / 32 at byte 4 * (col % 32), in granule
        # (col % 32) / 4 = 2 (j % 4) + (lane & 3) / 2, swizzled, at byte 8 (lane & 1) of it; a warp's 8 rows cover
        # the 32 banks twice (its 256 bytes, two wavefronts)
        return ["      const float2 cf = *reinterpret_cast<const float2*>(cb_cur + (j >> 2) * BM * 128 + r * 128 +"
                " ((((2 * (j & 3) + ((lane & 3) >> 1)) ^ (r & 7))) << 4) + 8 * (lane & 1));"]
    cvt = "pts_half22float2" if dt == "fp16" else "pts_bf1622float2"
    h2 = "pts_half2" if dt == "fp16" else "pts_bf162"
    return ["      // 128-byte swizzle: 16-byte granule (col / 8) % 8 of row r sits at granule ^ (r % 8)",
            "      const uint32_t cbv = *reinterpret_cast<const uint32_t*>(cb_cur + (j >> 3) * BM * 128 + r * 128 +"
            " ((((j & 7) ^ (r & 7))) << 4) + 4 * (lane & 3));",
            f"      const float2 cf = {cvt}(*reinterpret_cast<const {h2}*>(&cbv));"]


def _decay(dt: str, buf: str, fp32: bool = False) -> str:
    """CB decayed by exp(dA_m - dA_k)·dt_k and masked, packed into the A fragments (``buf``) of the next mma: the one
    rounding of P to ``dt`` (``fp32``: CB read as float32; else CB itself was rounded to ``dt`` before)."""
    return "\n".join([
        f"  fence_regs({buf}_flat);",
        "  const float* das = reinterpret_cast<const float*>(da_cur);",
        "  const float* dts = reinterpret_cast<const float*>(dt_cur);",
        "  const int kb = it_ * BK;",
        "  // tiles wholly below the diagonal and inside seq need no mask",
        "  const bool full_ = kb + BK - 1 <= m0 + ROW0 && CQ + kb + BK <= SEQ;",
        "  float wv[BK / 2];",
        "#pragma unroll", "  for (int j = 0; j < BK / 8; ++j) {",
        "    const int col = 8 * j + 2 * (lane & 3);",
        "    const float2 dak = *reinterpret_cast<const float2*>(das + col);",
        "    const float2 dtk = *reinterpret_cast<const float2*>(dts + col);",
        "#pragma unroll", "    for (int hh = 0; hh < 2; ++hh) {",
        "      const int r = ROW0 + w * 16 + (lane >> 2) + 8 * hh;  // row within the CTA's block",
        *_cb_pair(dt, fp32),
        "      float w0 = cf.x * fast_exp2(dam[hh] - dak.x * LOG2E) * dtk.x;",
        "      float w1 = cf.y * fast_exp2(dam[hh] - dak.y * LOG2E) * dtk.y;",
        "      if (!full_) {  // causal (k <= m) and ragged (k < seq) mask: select, so inf/nan never pass",
        "        const int m = m0 + r, k = kb + col;",
        "        w0 = (k <= m && CQ + k < SEQ) ? w0 : 0.f;",
        "        w1 = (k + 1 <= m && CQ + k + 1 < SEQ) ? w1 : 0.f;",
        "      }",
        "      wv[4 * j + 2 * hh] = w0; wv[4 * j + 2 * hh + 1] = w1;",
        "    }", "  }", LAST_READ,
        "  // the fp32 accumulator layout of W is the wgmma A-fragment layout once packed in pairs",
        "#pragma unroll", "  for (int kk = 0; kk < BK / 16; ++kk)", "#pragma unroll",
        "    for (int rr = 0; rr < 4; ++rr)",
        f"      {buf}[kk][rr] = {PACK2[dt]}(wv[8 * kk + 2 * rr], wv[8 * kk + 2 * rr + 1]);"])


def _body(t: Task) -> str:
    ir, b = t.ir, t.base
    dt, BK, N = ir.params["dtype"], ir.tiling["BK"], ir.params["d_state"]
    ptx = PTXTYPE[dt]
    buf = f"pf{t.parity if ir.copies.get(f'w@{t.role.group}', 1) == 2 and t.parity is not None else 0}"
    if b.startswith("load_"):
        return _load(b, cb_box_cols(ir.params))
    if b == "mma_state":
        lines = ["{ const uint32_t sc = smem_u32(c_s) + ROW0 * 128, ss = smem_u32(states_s);", "  wg_fence();"]
        for kk in range(N // 16):
            c, off = divmod(kk, 4)
            fn, last = (f"wgmma_ss_n64_{ptx}", ", 1") if kk else (f"wgmma_ss_n64_{ptx}_z", "")
            lines.append(f"  {fn}(acc, make_desc(sc + {c} * BM * 128 + {off * 32}, 16, 1024), "
                         f"make_desc(ss + {c} * P * 128 + {off * 32}, 16, 1024){last});")
        return "\n".join([*lines, "  wg_commit(); }"])
    if b == "scale_state":
        return "\n".join([
            "fence_regs(acc);", "const float* dacs = reinterpret_cast<const float*>(dacs_s);",
            "#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {",
            "  dam[hh] = dacs[ROW0 + w * 16 + (lane >> 2) + 8 * hh] * LOG2E;", "  const float e = fast_exp2(dam[hh]);",
            "#pragma unroll", "  for (int j = 0; j < P / 8; ++j) {",
            "    acc[4 * j + 2 * hh] *= e; acc[4 * j + 2 * hh + 1] *= e;", "  }", "}"])
    if b == "decay":
        return _decay(dt, buf, cb_bytes(ir.params) == 4)
    if b == "mma":
        lines = ["  const uint32_t sx = smem_u32(x_cur);", "  wg_fence();"]
        for kk in range(BK // 16):
            lines.append(f"  wgmma_rs_n64_{ptx}_t1(acc, {buf}[{kk}], make_desc(sx + {kk * 2048}, BK * 128, 1024));")
        return "\n".join([*lines, "  wg_commit();"])
    assert b == "store", b
    if _epilogue(ir.params):
        return _store_fused(dt, _epilogue(ir.params))
    return "\n".join([
        "fence_regs(acc);", "#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {",
        "  const int pos = CQ + m0 + ROW0 + w * 16 + (lane >> 2) + 8 * hh;",
        "  if (pos < SEQ) {  // the ragged last chunk: positions past seq are not written",
        "    uint32_t* orow = reinterpret_cast<uint32_t*>(out + ((size_t)(bz * SEQ + pos) * H + h) * P);",
        "#pragma unroll", "    for (int j = 0; j < P / 8; ++j)",
        f"      orow[4 * j + (lane & 3)] = {PACK2[dt]}(acc[4 * j + 2 * hh], acc[4 * j + 2 * hh + 1]);",
        "  }", "}"])


def _store_fused(dt: str, ep: str) -> str:
    """The store with the fused epilogue ``ep``: out = (acc + D·x)·silu(z) per column pair, in float32."""
    cvt = "pts_half22float2" if dt == "fp16" else "pts_bf1622float2"
    h2 = "pts_half2" if dt == "fp16" else "pts_bf162"
    body = ["      float v0 = acc[4 * j + 2 * hh], v1 = acc[4 * j + 2 * hh + 1];"]
    if "D" in ep:  # D per head read where used (an L1 hit): held across the loops, it spilled at 80 registers
        dv = ("const float2 dd = *reinterpret_cast<const float2*>(d_skip + h * P + 8 * j + 2 * (lane & 3));"
              if "Dp" in ep else "const float dh = __ldg(d_skip + h); const float2 dd = make_float2(dh, dh);")
        body += [f"      {{ const float2 xf = {cvt}(*reinterpret_cast<const {h2}*>(xrow + 4 * j + (lane & 3)));",
                 f"        {dv}", "        v0 = fmaf(dd.x, xf.x, v0); v1 = fmaf(dd.y, xf.y, v1); }"]
    if "z" in ep:  # silu(z) = z / (1 + exp(-z)), mamba_ssm's z·sigmoid(z)
        body += [f"      {{ const float2 zf = {cvt}(*reinterpret_cast<const {h2}*>(zrow + 4 * j + (lane & 3)));",
                 "        v0 *= zf.x / (1.f + __expf(-zf.x)); v1 *= zf.y / (1.f + __expf(-zf.y)); }"]
    rows = "    const size_t row_ = ((size_t)(bz * SEQ + pos) * H + h) * P;"
    return "\n".join([
        "fence_regs(acc);",
        "#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {",
        "  const int pos = CQ + m0 + ROW0 + w * 16 + (lane >> 2) + 8 * hh;",
        "  if (pos < SEQ) {  // the ragged last chunk: positions past seq are not written", rows,
        "    uint32_t* orow = reinterpret_cast<uint32_t*>(out + row_);",
        *(["    const uint32_t* xrow = reinterpret_cast<const uint32_t*>(xres + row_);"] if "D" in ep else []),
        *(["    const uint32_t* zrow = reinterpret_cast<const uint32_t*>(zg + row_);"] if "z" in ep else []),
        "#pragma unroll", "    for (int j = 0; j < P / 8; ++j) {", *body,
        f"      orow[4 * j + (lane & 3)] = {PACK2[dt]}(v0, v1);", "    }", "  }", "}"])


def _signature(ir: KernelIR) -> tuple[tuple[str, str], ...]:
    """dA_cumsum's and out's pointers, then a fused epilogue's: x again (D skip), D (float32), z."""
    ct, ep = CTYPE[ir.params["dtype"]], _epilogue(ir.params)
    sig = (("ptr:dA", "const float* __restrict__ da_ptr"), ("ptr:out", f"{ct}* __restrict__ out"))
    if "D" in ep:
        sig += (("ptr:xres", f"const {ct}* __restrict__ xres"), ("ptr:D", "const float* __restrict__ d_skip"))
    if "z" in ep:
        sig += (("ptr:z", f"const {ct}* __restrict__ zg"),)
    return sig


def maps(p: Mapping[str, Any], t: Mapping[str, int]) -> tuple[TensorMapSpec, ...]:
    """Tensor maps of contiguous cb (float32 with ``cb_dtype`` "fp32"), x, C, states, dt and dA_cumsum of shape ``p``
    (a generic kernel's launcher encodes them per shape)."""
    B, L, H, P, N, Q, G = _dims(p)
    dt, nc, e, ce = p["dtype"], -(-L // Q), 2, cb_bytes(p)
    return (
        TensorMapSpec("cb", CB_FP32 if ce == 4 else dt, (Q, B * nc * G * Q), (Q * ce,), (cb_box_cols(p), t["BM"])),
        TensorMapSpec("x", dt, (P, H, L, B), (P * e, H * P * e, L * H * P * e), (64, 1, t["BK"], 1)),
        TensorMapSpec("c", dt, (N, G, L, B), (N * e, G * N * e, L * G * N * e), (64, 1, t["BM"], 1)),
        TensorMapSpec("states", dt, (N, B * nc * H * P), (N * e,), (64, P)),
        TensorMapSpec("dt", "fp32", (Q, B * H * nc), (Q * 4,), (t["BK"], 1), 0),
        TensorMapSpec("dA", "fp32", (Q, B * H * nc), (Q * 4,), (t["BK"], 1), 0),
    )


REGISTRY[OP] = OpKernel(
    op=OP, check=_check,
    device=lambda ir: wgmma_ss(64, ir.params["dtype"]) + wgmma_rs(64, ir.params["dtype"], 1) + BULK,
    consts=_consts, maps=lambda ir: maps(ir.params, ir.tiling),
    signature=_signature,
    tiles=_tiles, decls=_decls, body=_body, min_trips=1, shared_base=True,  # the decay's LDS (skeleton._smem_base)
    info=lambda ir: {"w_buffers": [ir.copies.get(f"w@{g}", 1) for g in range(ir.groups)]},
    sizes=sizes, size_params=SIZE_PARAMS, exact_consts=True)
