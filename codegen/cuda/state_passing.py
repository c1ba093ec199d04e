"""Mamba2 SSD state-passing task bodies (ptsolve.ops.state_passing), in mamba_ssm's ``_state_passing_fwd`` layouts:

    s_c = keep[b, c] · exp(dA_cumsum[b, h, c, Q − 1]) · s_{c−1} + states[b, c, h]        (s_{−1} = init[b, h] or 0)
    out[b, c, h] = s_{c−1} in the plan's dtype,  fin[b, h] = s_{NC−1} float32

Inputs: states (batch, NC, heads, PN) float32 with PN = head_dim·d_state; dA_cumsum (batch, heads, NC, Q) float32;
keep (batch, NC4) float32 with NC4 = NC rounded up to a multiple of 4 (1: the state carries on, 0: seq_idx restarts
it), or a null pointer (every chunk keeps); init (batch, heads, PN) float32 or a null pointer (zeros). Outputs:
out (batch, NC, heads, PN) in the dtype; fin (batch, heads, PN) float32.

A tile is BE consecutive elements of one (batch, head)'s state; consumer warpgroup g owns EW = BE/groups of them and
thread t the 16-byte vectors t + 128·i (i < NV = EW/512) of its part: consecutive threads touch consecutive vectors
(no bank conflict in shared memory, whole 128-byte lines in global memory). The loop runs over the chunks:
``load_s`` bulk-copies the chunk's BE floats (contiguous in global memory), ``load_dec`` the 16 bytes ending at the
chunk's last dA_cumsum and, where keep is given, the 16-byte vector holding its flag (the fill's bytes follow
whether it is); ``put@g`` writes the running state (float32 registers) as the chunk's entering state, ``step@g``
folds the chunk in with one fused multiply-add per element.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ptsolve.errors import CodegenError

from ..kernel_ir import KernelIR, Role
from ..walk import LAST_READ, Task
from .common import BULK, PACK2, TensorMapSpec, check_dtype
from .skeleton import REGISTRY, OpKernel

OP = "mamba2_state_passing"
SIZE_PARAMS = ("batch", "chunks", "heads", "chunk")


def sizes(p: Mapping[str, Any], t: Mapping[str, int]) -> dict[str, int]:
    """The sizes a generic build takes at launch: batch, chunks NC, heads, positions Q of a chunk, and NTILES (CTAs:
    BE elements of one (batch, head)'s state) last."""
    pn = p["head_dim"] * p["d_state"]
    return {"B_": p["batch"], "NC": p["chunks"], "H": p["heads"], "Q": p["chunk"],
            "NTILES": p["batch"] * p["heads"] * (pn // t["BE"])}


def _check(ir: KernelIR) -> None:
    check_dtype(ir.params)
    p, t = ir.params, ir.tiling
    pn, ew = p["head_dim"] * p["d_state"], t["BE"] // t["groups"]
    if t["BE"] % t["groups"] or ew % 512 or ew > 4096 or pn % t["BE"]:
        raise CodegenError(f"{OP}: tiling {t}: a warpgroup owns 512 to 4096 elements (whole 16-byte vectors of its "
                           f"128 threads) and BE divides head_dim·d_state = {pn}")
    if p["chunk"] % 4:
        raise CodegenError(f"{OP}: chunk={p['chunk']} must be a multiple of 4 (a 16-byte copy ends at dA_cumsum's "
                           "last element)")


def _consts(ir: KernelIR) -> str:
    p, t = ir.params, ir.tiling
    return (f"  constexpr int PN = {p['head_dim'] * p['d_state']}, BE = {t['BE']}, EW = {t['BE'] // t['groups']};\n"
            "  constexpr int NV = EW / 512;  // 16-byte vectors a thread owns\n"
            "  constexpr int NEB = PN / BE;  // tiles of one (batch, head)'s state\n"
            "  const int NC4 = (NC + 3) & ~3;  // keep's row stride: 16-byte copies stay inside the row\n"
            "  (void)NC4; (void)B_;")


def _tiles(ir: KernelIR) -> tuple[int | str, str]:
    n = "NTILES" if ir.generic else sizes(ir.params, ir.tiling)["NTILES"]
    return n, ("  const int eb = tile % NEB, bh = tile / NEB;  // element block, then (batch, head)\n"
               "  const int hd = bh % H, bz = bh / H;\n"
               "  const size_t e0 = (size_t)eb * BE;  // this tile's first element of the state\n"
               "  const int T = NC;  // one trip per chunk\n"
               "  (void)hd; (void)bz; (void)e0;")


def _decls(ir: KernelIR, role: Role) -> str:
    ew = ir.tiling["BE"] // ir.tiling["groups"]
    return (f"constexpr int OFF = {role.group * ew};  // this warpgroup's first element of the tile\n"
            "float st[4 * NV];  // the running state, float32: element OFF + 4·(tid + 128·(i / 4)) + i % 4\n"
            "const int tid = threadIdx.x & 127;")


def _producer(b: str) -> str:
    if b == "load_s":
        return "  bulk_load(s_cur, states + ((size_t)(bz * NC + it_) * H + hd) * PN + e0, BE * 4, fbar_);"
    return ("  bulk_load(dec_cur, da + ((size_t)(bz * H + hd) * NC + it_) * Q + Q - 4, 16, fbar_);\n"
            "  if (keep != nullptr) bulk_load(dec_cur + 16, keep + (size_t)bz * NC4 + (it_ & ~3), 16, fbar_);")


def _body(t: Task) -> str:
    b = t.base
    if b in ("load_s", "load_dec"):
        return _producer(b)
    if b == "init":
        return "\n".join([
            "const float4* iv = init == nullptr ? nullptr : reinterpret_cast<const float4*>(",
            "    init + ((size_t)bz * H + hd) * PN + e0 + OFF);", "#pragma unroll", "for (int i = 0; i < NV; ++i) {",
            "  const float4 v = iv == nullptr ? make_float4(0.f, 0.f, 0.f, 0.f) : iv[tid + 128 * i];",
            "  st[4 * i] = v.x; st[4 * i + 1] = v.y; st[4 * i + 2] = v.z; st[4 * i + 3] = v.w;", "}"])
    if b == "put":
        pack = PACK2[t.ir.params["dtype"]]
        return "\n".join([
            "  uint2* ov = reinterpret_cast<uint2*>(out + ((size_t)(bz * NC + it_) * H + hd) * PN + e0 + OFF);",
            "#pragma unroll", "  for (int i = 0; i < NV; ++i)",
            f"    ov[tid + 128 * i] = make_uint2({pack}(st[4 * i], st[4 * i + 1]), {pack}(st[4 * i + 2], "
            "st[4 * i + 3]));"])
    if b == "step":
        return "\n".join([
            "  const float* dv = reinterpret_cast<const float*>(dec_cur);",
            "  // keep·exp(dA_last): 0 where seq_idx starts a new sequence in this chunk",
            "  const float dec = expf(dv[3]) * (keep != nullptr ? dv[4 + (it_ & 3)] : 1.f);",
            "  const float4* sv = reinterpret_cast<const float4*>(s_cur) + OFF / 4 + tid;",
            "  float4 v[NV];", "#pragma unroll", "  for (int i = 0; i < NV; ++i) v[i] = sv[128 * i];", LAST_READ,
            "#pragma unroll", "  for (int i = 0; i < NV; ++i) {",
            "    st[4 * i] = fmaf(dec, st[4 * i], v[i].x); st[4 * i + 1] = fmaf(dec, st[4 * i + 1], v[i].y);",
            "    st[4 * i + 2] = fmaf(dec, st[4 * i + 2], v[i].z); st[4 * i + 3] = fmaf(dec, st[4 * i + 3], v[i].w);",
            "  }"])
    if b == "store":
        return "\n".join([
            "float4* fv = reinterpret_cast<float4*>(fin + ((size_t)bz * H + hd) * PN + e0 + OFF);",
            "#pragma unroll", "for (int i = 0; i < NV; ++i)",
            "  fv[tid + 128 * i] = make_float4(st[4 * i], st[4 * i + 1], st[4 * i + 2], st[4 * i + 3]);"])
    raise CodegenError(f"{OP}: no task body for {t.name!r}")


def _signature(ir: KernelIR) -> tuple[tuple[str, str], ...]:
    ct = {"fp16": "pts_half", "bf16": "pts_bf16"}[ir.params["dtype"]]
    return (("ptr:states", "const float* __restrict__ states"), ("ptr:da", "const float* __restrict__ da"),
            ("ptr:keep", "const float* __restrict__ keep"), ("ptr:init", "const float* __restrict__ init"),
            ("ptr:out", f"{ct}* __restrict__ out"), ("ptr:fin", "float* __restrict__ fin"))


def maps(p: Mapping[str, Any], t: Mapping[str, int]) -> tuple[TensorMapSpec, ...]:
    """No tensor map: every copy is a 1-D bulk copy of contiguous bytes."""
    return ()


REGISTRY[OP] = OpKernel(
    op=OP, check=_check, device=lambda ir: BULK, consts=_consts, maps=lambda ir: (), signature=_signature,
    tiles=_tiles, decls=_decls, body=_body, sizes=sizes, size_params=SIZE_PARAMS,
    fill_bytes=lambda ir, task: "(keep != nullptr ? 32 : 16)" if task == "load_dec" else None)
