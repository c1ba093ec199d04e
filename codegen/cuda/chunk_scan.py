"""Mamba2 ChunkScan emitter (CUDA sm_90a): ``emit_chunk_scan(plan) -> KernelSource``.

Layouts (the official ``mamba_ssm`` ``_chunk_scan_fwd`` ones, so the baseline and this kernel take the same
tensors): cb (batch, nchunks, ngroups, chunk, chunk); x, out (batch, seq, nheads, headdim); dt, dA_cumsum
(batch, nheads, nchunks, chunk) float32; C (batch, seq, ngroups, dstate); prev_states (batch, nchunks, nheads,
headdim, dstate). cb, x, C, states and out are fp16/bf16 (the plan's dtype): the states are a wgmma operand,
so a float32 ``prev_states`` must be converted by the caller (``run_chunk_scan`` does it).

    out[b, cQ+m, h, p] = exp(dA[m]) · Σ_n C[cQ+m, g, n] · states[c, h, p, n]
                         + Σ_{k ≤ m} cb[c, g, m, k] · exp(dA[m] − dA[k]) · dt[k] · x[cQ+k, h, p],   g = h // (H/G)

One CTA per (BM-block of chunk positions, head, batch·chunk); the m-blocks with the longest causal loop are
launched first. Warpgroup 0 is the producer (one thread): pre ``load_c`` / ``load_states`` (TMA, 128-byte
swizzle) and ``load_dacs`` (a 1-D bulk copy, read once); loop ``load_cb`` / ``load_x`` (TMA) and ``load_dA`` /
``load_dt`` (TMA tiles of the float32 (chunk rows, chunk) view, unswizzled; a raw bulk copy into a reused slot
trips compute-sanitizer's racecheck) into rings of ``depth`` stages. Consumer warpgroup g owns chunk rows
64g..64g+63 of the block:
pre ``mma_state`` (acc = C·statesᵀ, both operands K-major in smem), ``scale_state`` (acc *= exp(dA[m]));
loop ``decay`` (reads the swizzled CB tile straight into the wgmma accumulator layout, multiplies by
exp2((dA[m] − dA[k])·log2 e)·dt[k], zero where k > m or k ≥ seq, packs fp16/bf16 A fragments) and ``mma``
(acc += W·x, A from registers, x MN-major in smem, like attention's P·V); post ``store`` (rows ≥ seq skipped).

Ring protocol: the CB/dA/dt ring ("w") has a full barrier of three arrivals (one per load task, each with its
byte count) and an empty barrier released by ``decay`` after its shared-memory reads; the x ring's slot of
iteration it−1 is released by ``mma`` of it after ``wgmma.wait_group 1`` proves mma(it−1) complete. The W
fragments are double-buffered (by iteration parity) when the plan puts ``mma`` at a later stage than ``decay``
(the overlapped order: mma(j−1) runs on the tensor cores while decay(j) runs on the CUDA cores); ``decay``
waits for the mma that last read its buffer. The synchronisation of every plan is simulated on the CPU
(``schedule.simulate``) for short and long trip counts; an order that could deadlock raises CodegenError.
``tc_order`` is accepted (names are checked) but not enforced: the warpgroups run free.

Tiling: BM = 64·groups (groups 1 or 2), BK in {16, 32, 64, 128} (CB is always loaded in 64-column boxes, so
BK < 64 loads a wider CB box than it uses: the reads assume the 128-byte swizzle of full 128-byte rows),
depth 2..4, optional ``ctas`` 1..3 (CTAs per SM in the launch bounds; > 1 drops setmaxnreg and needs groups 1).
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

from codegen.plan import KernelPlan
from ptsolve.errors import CodegenError

from .common import (
    CTYPE,
    PACK2,
    PRELUDE,
    PRELUDE_END,
    PRODUCER_REGS,
    PTXTYPE,
    SMEM_LIMIT,
    KernelSource,
    TensorMapSpec,
    consumer_regs,
    setup,
    wgmma_rs,
    wgmma_ss,
)
from .schedule import LoopOrder, Op, check_deps, emit_loop, role_steps, simulate, wait_depths
from .validate import _int, int_params, int_tiling, validate_order

__all__ = ["OP", "TASKS", "default_chunk_scan_plan", "emit_chunk_scan", "run_chunk_scan", "validate_chunk_scan"]

OP = "mamba2_chunk_scan"
# phase -> (producer tasks, per-warpgroup consumer task bases), as ptsolve.ops.mamba2._scan_build names them
TASKS = {
    "pre": (("load_c", "load_states", "load_dacs"), ("mma_state", "scale_state")),
    "loop": (("load_cb", "load_dA", "load_dt", "load_x"), ("decay", "mma")),
    "post": ((), ("store",)),
}
PARAM_KEYS = ("batch", "seq", "heads", "head_dim", "d_state", "chunk", "groups")
MAX_DIM = 1 << 30
MAX_STAGE = 3
LOG2E = math.log2(math.e)
SM_SMEM = 228 * 1024  # shared memory of one sm_90 SM, shared by its resident CTAs
COMMITS = {"mma"}
W_LOADS = ("load_cb", "load_dA", "load_dt")  # the three arrivals of the w ring's full barrier


# ------------------------------------------------------------------------------------------------ validation


def _params(p: Any) -> dict[str, Any]:
    q = int_params(OP, p, PARAM_KEYS, {"groups": 1})
    dt = q.pop("dtype")
    if q["head_dim"] != 64:
        raise CodegenError(f"{OP}: the CUDA generator supports head_dim 64, got {q['head_dim']}")
    if q["d_state"] % 64 or q["d_state"] > 256:
        raise CodegenError(f"{OP}: d_state must be a multiple of 64 up to 256 (64-column TMA boxes), "
                           f"got {q['d_state']}")
    if q["chunk"] % 64 or q["chunk"] > 256:
        raise CodegenError(f"{OP}: chunk must be a multiple of 64 up to 256, got {q['chunk']}")
    if q["heads"] % q["groups"]:
        raise CodegenError(f"{OP}: heads={q['heads']} is not a multiple of groups={q['groups']}")
    nc = -(-q["seq"] // q["chunk"])
    B, L, H, P, N, Q, G = (q[k] for k in PARAM_KEYS)
    # large tensors go through TMA coordinates and 64-bit offsets; these are the 32-bit ints of the kernel: the
    # dt / dA row, the output row, the cb and states TMA rows
    if max(B * H * nc * Q, B * L, B * nc * G * Q, B * nc * H * P) >= 1 << 31:
        raise CodegenError(f"{OP}: shape too large for the kernel's 32-bit indices (batch·heads·nchunks·chunk, "
                           "batch·seq, and the cb / states TMA rows must stay below 2^31)")
    if B * nc > 65535:
        raise CodegenError(f"{OP}: batch·nchunks={B * nc} exceeds the grid's z limit 65535")
    return q | {"dtype": dt}


def _smem_layout(p: dict[str, Any], t: dict[str, int]) -> dict[str, int]:
    """Byte offsets (from the 1024-aligned base) of every shared-memory buffer, and the total."""
    BM, BK, depth = t["BM"], t["BK"], t["depth"]
    N, P = p["d_state"], p["head_dim"]
    cbw = max(64, BK)  # CB is loaded in 64-column (128-byte) boxes: the swizzle the reads assume
    # dA / dt slots come by TMA: 128-byte aligned destinations
    lay = {"c": 0, "c_bytes": BM * N * 2, "st_bytes": P * N * 2, "cb_bytes": BM * cbw * 2, "x_bytes": BK * P * 2,
           "f_bytes": BK * 4, "f_slot": -(-BK * 4 // 128) * 128}
    lay["st"] = lay["c"] + lay["c_bytes"]
    lay["cb"] = lay["st"] + lay["st_bytes"]
    lay["x"] = lay["cb"] + depth * lay["cb_bytes"]
    lay["da"] = lay["x"] + depth * lay["x_bytes"]
    lay["dt"] = lay["da"] + depth * lay["f_slot"]
    lay["dacs"] = lay["dt"] + depth * lay["f_slot"]
    lay["bar"] = (lay["dacs"] + BM * 4 + 15) // 16 * 16
    lay["total"] = lay["bar"] + (1 + 4 * depth) * 8 + 1024  # + alignment slack
    return lay


def _tiling(t: Any, p: dict[str, Any]) -> dict[str, int]:
    # depth >= 2: the x ring is released one mma late, so depth 1 deadlocks. Optional ctas: CTAs per SM the
    # kernel is built for (launch bounds); 1 (default) rebalances registers with setmaxnreg, 2-3 split the
    # register file evenly instead (more CTAs in flight hide the short loop's latency)
    q = int_tiling(OP, t, {"BM": (64, 128, None), "BK": (16, 128, None), "depth": (2, 4, None),
                           "groups": (1, 2, None), "ctas": (1, 3, 1)}, closed=True)
    BM, BK, depth, W, ctas = q.values()
    if BM != 64 * W:
        raise CodegenError(f"{OP}: BM={BM} must be 64 rows per consumer warpgroup (64·groups={64 * W})")
    if BK not in (16, 32, 64, 128):
        raise CodegenError(f"{OP}: BK={BK} must be 16, 32, 64 or 128")
    Q = p["chunk"]
    if Q % BM or Q % BK:
        raise CodegenError(f"{OP}: chunk={Q} must be a multiple of BM={BM} and BK={BK}")
    if ctas > 1 and W > 1:
        raise CodegenError(f"{OP}: ctas={ctas} needs groups=1 (two consumer warpgroups in 1/{ctas} of the register "
                           "file spill)")
    out = {"BM": BM, "BK": BK, "depth": depth, "groups": W, "ctas": ctas}
    need = _smem_layout(p, out)["total"]
    if need > SMEM_LIMIT:
        raise CodegenError(f"{OP} tiling {out} needs {need} B of shared memory, over the {SMEM_LIMIT} B limit")
    if ctas * (need + 1024) > SM_SMEM:  # the driver reserves 1 KB per CTA
        raise CodegenError(f"{OP} tiling {out}: {ctas} CTAs of {need} B do not fit the SM's {SM_SMEM} B of shared "
                           "memory")
    return out


def _order(plan: KernelPlan, W: int) -> dict[str, dict[str, list[tuple[str, int]]]]:
    """phase -> role -> [(task base name, stage)]: known roles and tasks, each exactly once, and every
    warpgroup's prologue issues mma_state before scale_state."""
    out = validate_order(plan, W, TASKS, ("mma", "mma_state"))
    for role in [f"wg{g}" for g in range(W)]:
        if [b for b, _ in out["pre"][role]] != ["mma_state", "scale_state"]:
            raise CodegenError(f"pre/{role}: scale_state scales the result of mma_state; issue mma_state first")
    return out


def validate_chunk_scan(plan: KernelPlan) -> tuple[dict[str, Any], dict[str, int],
                                                   dict[str, dict[str, list[tuple[str, int]]]]]:
    """(params, tiling, order) of a ChunkScan plan, all checked; CodegenError otherwise."""
    if not isinstance(plan, KernelPlan):
        raise CodegenError(f"emit_chunk_scan() takes a codegen.plan.KernelPlan, got {type(plan).__name__}")
    if plan.op != OP:
        raise CodegenError(f"emit_chunk_scan() emits {OP!r}, not {plan.op!r}")
    p = _params(plan.params)
    t = _tiling(plan.tiling, p)
    return p, t, _order(plan, t["groups"])


def default_chunk_scan_plan(params: dict[str, Any], tiling: dict[str, int], overlap: bool = False) -> KernelPlan:
    """The textbook ChunkScan order: producer load_cb, load_dA, load_dt, load_x; each consumer decay then mma
    at stage 0. ``overlap`` puts mma one stage behind decay and issues it first (mma(j−1) on the tensor cores
    while decay(j) runs on the CUDA cores; two W fragment buffers)."""
    W = int(tiling["groups"])
    pre: dict[str, list[tuple[str, int]]] = {"producer": [("load_c", 0), ("load_states", 0), ("load_dacs", 0)]}
    pre |= {f"wg{g}": [(f"mma_state@{g}", 0), (f"scale_state@{g}", 0)] for g in range(W)}
    loop: dict[str, list[tuple[str, int]]] = {"producer": [(n, 0) for n in TASKS["loop"][0]]}
    for g in range(W):
        loop[f"wg{g}"] = [(f"mma@{g}", 1), (f"decay@{g}", 0)] if overlap else [(f"decay@{g}", 0), (f"mma@{g}", 0)]
    post = {f"wg{g}": [(f"store@{g}", 0)] for g in range(W)}
    return KernelPlan(OP, dict(params), dict(tiling), {"pre": pre, "loop": loop, "post": post}, [])


# ------------------------------------------------------------------------------------------------ schedule


def _nbuf(lo: LoopOrder) -> int:
    """W fragment buffers the order can use: 2 when mma runs at a later stage than decay (decay(it+1) is
    computed while mma(it) still reads its fragments), else 1 (decay(it+1) waits for mma(it)). The plan's
    copies can lower 2 to 1 (decay then waits for mma: _needs)."""
    st = dict(lo.ops)
    return 2 if st["mma"] > st["decay"] else 1


def _copies(plan: KernelPlan, buf: str) -> int:
    """Copies of register buffer ``buf`` the plan allows (the program's, from its register budget): 1 or 2."""
    c = getattr(plan, "copies", None) or {}
    if not isinstance(c, dict):
        raise CodegenError(f"plan.copies must be a dict, got {type(c).__name__}")
    return _int(f"plan.copies[{buf!r}]", c.get(buf, 2), 1, 2)


def _needs(nbuf: int) -> dict[str, list[tuple[str, int]]]:
    # decay overwrites the fragment buffer that mma(it - nbuf) reads asynchronously
    return {"decay": [("mma", -nbuf)]}


def check_sync(prod: LoopOrder, loops: Mapping[str, LoopOrder], depth: int) -> None:
    """Simulate the kernel's mbarrier protocol (w and x rings, pre barrier) on the CPU for several trip
    counts; CodegenError when some trip count would deadlock."""
    W = len(loops)
    S = max([prod.stages, *(lo.stages for lo in loops.values())])
    for T in range(1, S + 2 * depth + 5):
        def prod_ops(name: str, q: int) -> list[Op]:
            ring = "x" if name == "load_x" else "w"
            wait = [("wait", (ring, "free", q - depth), W)] if q >= depth else []
            return [*wait, ("signal", (ring, "full", q))]

        prog: dict[str, list[Op]] = {"producer": [("signal", ("pre",))] * 3 + role_steps(prod, T, {}, prod_ops)}
        for r, lo in loops.items():
            def cons_ops(name: str, it: int) -> list[Op]:
                if name == "decay":
                    return [("wait", ("w", "full", it), len(W_LOADS)), ("signal", ("w", "free", it))]
                return [("wait", ("x", "full", it), 1)] + ([("signal", ("x", "free", it - 1))] if it else [])
            prog[r] = [("wait", ("pre",), 3)] + role_steps(lo, T, {}, cons_ops)
        simulate(prog, f"{OP} ring protocol with trip count {T}")


# ------------------------------------------------------------------------------------------------ code


def _producer(name: str, it: str, parity: int | None, waits: Any) -> str:
    if name == "load_x":
        return (f"{{ const int q_ = {it}; const int s_ = q_ % DEPTH;\n"
                f"  mbar_wait(&x_empty[s_], ((q_ / DEPTH) & 1) ^ 1);\n"
                f"  mbar_expect_tx(&x_full[s_], X_BYTES);\n"
                f"  tma_load_4d(x_s + s_ * X_BYTES, &tm_x, &x_full[s_], 0, h, CQ + q_ * BK, bz); }}")
    head = (f"{{ const int q_ = {it}; const int s_ = q_ % DEPTH;\n"
            f"  mbar_wait(&w_empty[s_], ((q_ / DEPTH) & 1) ^ 1);\n")
    if name == "load_cb":
        return (head + "  mbar_expect_tx(&w_full[s_], CB_BYTES);\n#pragma unroll\n"
                "  for (int cc = 0; cc < CBCH; ++cc)\n"
                "    tma_load_2d(cb_s + s_ * CB_BYTES + cc * BM * 128, &tm_cb, &w_full[s_], q_ * BK + 64 * cc, "
                "cb_row); }")
    # a TMA tile of the (rows of chunk, chunk) view rather than a raw cp.async.bulk: the same bytes, and
    # compute-sanitizer's racecheck follows the mbarriers of tensor copies
    tm, dst = ("tm_da", "da_s") if name == "load_dA" else ("tm_dt", "dt_s")
    return (head + f"  mbar_expect_tx(&w_full[s_], F_BYTES);\n"
            f"  tma_load_2d({dst} + s_ * FS, &{tm}, &w_full[s_], q_ * BK, vrow); }}")


def _consumer(BK: int, dt: str, nbuf: int):
    t = PTXTYPE[dt]
    nkk = BK // 16

    def body(name: str, it: str, parity: int | None, waits: Mapping[str, int] | None) -> str:
        buf = f"pf{parity if nbuf == 2 else 0}"
        head = f"{{ const int it_ = {it}; const int s_ = it_ % DEPTH; const uint32_t ph_ = (it_ / DEPTH) & 1;"
        if name == "mma":
            lines = [head, "  mbar_wait(&x_full[s_], ph_);", "  const uint32_t sx = smem_u32(x_s + s_ * X_BYTES);",
                     "  wg_fence();"]
            for kk in range(nkk):
                lines.append(f"  wgmma_rs_n64_{t}_t1(acc, {buf}[{kk}], make_desc(sx + {kk * 2048}, BK * 128, 1024));")
            lines += ["  wg_commit();",
                      "  wg_wait<1>();  // mma(it-1) is complete: its x slot can be refilled",
                      "  if (it_ > 0 && lane == 0) mbar_arrive(&x_empty[(it_ - 1) % DEPTH]);", "}"]
            return "\n".join(lines)
        assert name == "decay"
        n = 0 if waits is None else waits.get("mma", 0)
        return "\n".join([
            head, f"  wg_wait<{n}>();  // the mma that last read this fragment buffer is complete",
            f"  fence_regs({buf}_flat);",
            "  mbar_wait(&w_full[s_], ph_);",
            "  const float* das = da_s + s_ * FS;", "  const float* dts = dt_s + s_ * FS;",
            "  const uint8_t* cbt = cb_s + s_ * CB_BYTES;",
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
            "      // 128-byte swizzle: 16-byte granule (col / 8) % 8 of row r sits at granule ^ (r % 8)",
            "      const uint32_t cbv = *reinterpret_cast<const uint32_t*>(cbt + (j >> 3) * BM * 128 + r * 128 +"
            " ((((j & 7) ^ (r & 7))) << 4) + 4 * (lane & 3));",
            f"      const float2 cf = {'__half22float2' if dt == 'fp16' else '__bfloat1622float2'}"
            f"(*reinterpret_cast<const {'__half2' if dt == 'fp16' else '__nv_bfloat162'}*>(&cbv));",
            "      float w0 = cf.x * fast_exp2(dam[hh] - dak.x * LOG2E) * dtk.x;",
            "      float w1 = cf.y * fast_exp2(dam[hh] - dak.y * LOG2E) * dtk.y;",
            "      if (!full_) {  // causal (k <= m) and ragged (k < seq) mask: select, so inf/nan never pass",
            "        const int m = m0 + r, k = kb + col;",
            "        w0 = (k <= m && CQ + k < SEQ) ? w0 : 0.f;",
            "        w1 = (k + 1 <= m && CQ + k + 1 < SEQ) ? w1 : 0.f;",
            "      }",
            "      wv[4 * j + 2 * hh] = w0; wv[4 * j + 2 * hh + 1] = w1;",
            "    }", "  }",
            "  // generic-proxy reads of the slot before the producer's next bulk copy (async proxy) overwrites it",
            '  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");',
            "  __syncwarp();",
            "  if (lane == 0) mbar_arrive(&w_empty[s_]);  // this warp's reads of CB/dA/dt are done",
            "  // the fp32 accumulator layout of W is the wgmma A-fragment layout once packed in pairs",
            "#pragma unroll", "  for (int kk = 0; kk < BK / 16; ++kk)", "#pragma unroll",
            "    for (int rr = 0; rr < 4; ++rr)",
            f"      {buf}[kk][rr] = {PACK2[dt]}(wv[8 * kk + 2 * rr], wv[8 * kk + 2 * rr + 1]);",
            "}"])
    return body


def _pre_consumer(name: str, N: int, t: str) -> str:
    if name == "mma_state":
        lines = ["// pre: mma_state (acc = C_m · statesᵀ, both K-major in smem)", "mbar_wait(pre_bar, 0);",
                 "{ const uint32_t sc = smem_u32(c_s) + ROW0 * 128;", "  const uint32_t ss = smem_u32(st_s);",
                 "  wg_fence();"]
        for kk in range(N // 16):
            c, off = divmod(kk, 4)
            fn, last = (f"wgmma_ss_n64_{t}", ", 1") if kk else (f"wgmma_ss_n64_{t}_z", "")
            lines.append(f"  {fn}(acc, make_desc(sc + {c} * BM * 128 + {off * 32}, 16, 1024), "
                         f"make_desc(ss + {c} * P * 128 + {off * 32}, 16, 1024){last});")
        lines += ["  wg_commit(); }"]
        return "\n".join(lines)
    assert name == "scale_state"
    return "\n".join([
        "// pre: scale_state (acc *= exp(dA[m]))", "wg_wait<0>();", "fence_regs(acc);",
        "#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {",
        "  dam[hh] = dacs_s[ROW0 + w * 16 + (lane >> 2) + 8 * hh] * LOG2E;", "  const float e = fast_exp2(dam[hh]);",
        "#pragma unroll", "  for (int j = 0; j < P / 8; ++j) {",
        "    acc[4 * j + 2 * hh] *= e; acc[4 * j + 2 * hh + 1] *= e;", "  }",
        "}"])


def _store(dt: str) -> str:
    return "\n".join([
        "// post: store", "wg_wait<0>();", "fence_regs(acc);",
        "#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {",
        "  const int pos = CQ + m0 + ROW0 + w * 16 + (lane >> 2) + 8 * hh;",
        "  if (pos < SEQ) {  // ragged last chunk: positions past seq are not written",
        "    uint32_t* orow = reinterpret_cast<uint32_t*>(out + ((size_t)(bz * SEQ + pos) * H + h) * P);",
        "#pragma unroll", "    for (int j = 0; j < P / 8; ++j)",
        f"      orow[4 * j + (lane & 3)] = {PACK2[dt]}(acc[4 * j + 2 * hh], acc[4 * j + 2 * hh + 1]);",
        "  }", "}"])


BULK = r"""
// 1-D bulk copy global -> shared, completing on an mbarrier (16-byte aligned, size a multiple of 16)
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
"""


def _plan_id(plan: KernelPlan) -> str:
    return hashlib.sha256(plan.to_json().encode()).hexdigest()[:8]


def emit_chunk_scan(plan: KernelPlan) -> KernelSource:
    """CUDA source and launch metadata of the ChunkScan kernel of ``plan``; CodegenError for a plan it cannot
    emit (unknown tasks or roles, bad tiling, an order that breaks a dependency or could deadlock)."""
    p, t, order = validate_chunk_scan(plan)
    pid = _plan_id(plan)
    B, L, H, P, N, Q, G = (p[k] for k in PARAM_KEYS)
    dt = p["dtype"]
    ptx = PTXTYPE[dt]
    BM, BK, depth, W = t["BM"], t["BK"], t["depth"], t["groups"]
    nc, nmb = -(-L // Q), Q // BM
    lay = _smem_layout(p, t)

    # the producer is decoupled by mbarriers: only its relative stages matter (whether they can deadlock against
    # the consumers is decided by check_sync's simulation below)
    pst = [s for _, s in order["loop"]["producer"]]
    prod = LoopOrder(tuple((n, s - min(pst)) for n, s in order["loop"]["producer"]))
    roles = [f"wg{g}" for g in range(W)]
    base = min(s for r in roles for _, s in order["loop"][r])
    loops = {r: LoopOrder(tuple((n, s - base) for n, s in order["loop"][r])) for r in roles}
    nbufs = {r: min(_nbuf(lo), _copies(plan, f"w@{r[2:]}")) for r, lo in loops.items()}
    for r, lo in loops.items():
        check_deps(r, lo, {"mma": [("decay", 0)]})
    check_sync(prod, loops, depth)

    prod_pre = []
    for name, _ in order["pre"]["producer"]:
        if name == "load_c":
            prod_pre.append("// pre: load_c\nmbar_expect_tx(pre_bar, C_BYTES);\n#pragma unroll\n"
                            "for (int cc = 0; cc < NCH; ++cc)\n"
                            "  tma_load_4d(c_s + cc * BM * 128, &tm_c, pre_bar, 64 * cc, grp, CQ + m0, bz);")
        elif name == "load_states":
            prod_pre.append("// pre: load_states\nmbar_expect_tx(pre_bar, ST_BYTES);\n#pragma unroll\n"
                            "for (int cc = 0; cc < NCH; ++cc)\n"
                            "  tma_load_2d(st_s + cc * P * 128, &tm_states, pre_bar, 64 * cc, st_row);")
        else:
            prod_pre.append("// pre: load_dacs\nmbar_expect_tx(pre_bar, BM * 4);\n"
                            "bulk_load(dacs_s, da_g + m0, BM * 4, pre_bar);")
    prod_code = emit_loop(prod, "T", _producer, 1, {})

    branches = []
    for g, r in enumerate(roles):
        lo, nb = loops[r], nbufs[r]
        steady = wait_depths(lo, COMMITS, _needs(nb))
        code = [f"// ---- consumer warpgroup {g}: chunk rows {64 * g}..{64 * g + 63} of the block; "
                f"{nb} W fragment buffer(s)", f"constexpr int ROW0 = {64 * g};",
                "float acc[P / 2];", "float dam[2];  // dA[m] * log2(e) of this thread's two rows"]
        for i in range(nb):
            code += [f"uint32_t pf{i}_flat[BK / 4];",
                     f"uint32_t (&pf{i})[BK / 16][4] = *reinterpret_cast<uint32_t (*)[BK / 16][4]>(pf{i}_flat);"]
        code += [_pre_consumer(n, N, ptx) for n, _ in order["pre"][r]]
        code.append(emit_loop(lo, "T", _consumer(BK, dt, nb), nb, steady, COMMITS, min_trips=1))
        code.append(_store(dt))
        branches.append(f"if (g == {g}) {{\n" + "\n".join(code) + "\n}")

    threads = 128 * (W + 1)
    ctas = t["ctas"]
    creg = consumer_regs(W) if ctas == 1 else 0
    # ctas > 1: no setmaxnreg (its pool is per CTA and the even split already leaves the producer little)
    dec = f'asm volatile("setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS};");' if ctas == 1 else ""
    inc = f'asm volatile("setmaxnreg.inc.sync.aligned.u32 {creg};");' if ctas == 1 else ""
    name = f"pts_chunk_scan_{dt}_b{B}_l{L}_h{H}_g{G}_n{N}_q{Q}_bm{BM}_bk{BK}_d{depth}_w{W}_c{ctas}_{pid}"
    wg_fns = wgmma_ss(64, dt) + wgmma_rs(64, dt, 1) + BULK
    inits = ("    mbar_init(pre_bar, 3);  // one arrival per pre load task\n    for (int s = 0; s < DEPTH; ++s) {\n"
             "      mbar_init(&w_full[s], 3); mbar_init(&x_full[s], 1);  // w: load_cb, load_dA, load_dt each arrive\n"
             f"      mbar_init(&w_empty[s], 4 * {W}); mbar_init(&x_empty[s], 4 * {W});"
             "  // lane 0 of every consumer warp\n"
             "    }")
    src = f"""// generated by ptsolve codegen.cuda.chunk_scan (plan {pid})
{PRELUDE}
{wg_fns}
{PRELUDE_END}
extern "C" __global__ void __launch_bounds__({threads}, {ctas})
{name}(const __grid_constant__ CUtensorMap tm_cb, const __grid_constant__ CUtensorMap tm_x,
       const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ CUtensorMap tm_states,
       const __grid_constant__ CUtensorMap tm_dt, const __grid_constant__ CUtensorMap tm_da,
       const float* __restrict__ da_ptr, {CTYPE[dt]}* __restrict__ out) {{
  using namespace pts;
  constexpr int SEQ = {L}, H = {H}, G = {G}, P = {P}, Q = {Q}, NC = {nc}, NMB = {nmb};
  constexpr int BM = {BM}, BK = {BK}, DEPTH = {depth}, NCH = {N // 64}, CBCH = {max(1, BK // 64)};
  constexpr float LOG2E = {LOG2E!r}f;
  constexpr uint32_t C_BYTES = {lay['c_bytes']}, ST_BYTES = {lay['st_bytes']}, CB_BYTES = {lay['cb_bytes']};
  constexpr uint32_t X_BYTES = {lay['x_bytes']}, F_BYTES = {lay['f_bytes']};
  constexpr int FS = {lay['f_slot'] // 4};  // floats between dA / dt ring slots
  // longest causal loop first: m-block NMB-1 visits the most k-blocks
  const int mb = NMB - 1 - (int)blockIdx.x, h = blockIdx.y, bz = blockIdx.z / NC, c = blockIdx.z % NC;
  const int m0 = mb * BM, CQ = c * Q;
  if (CQ + m0 >= SEQ) return;  // ragged last chunk: nothing of this block is stored (uniform per CTA)
  const int grp = h / (H / G);
  int T = (m0 + BM + BK - 1) / BK;  // k-blocks with k <= the block's last row
  {{ const int lim = (SEQ - CQ + BK - 1) / BK; T = lim < T ? lim : T; }}  // and k < seq
  const int cb_row = ((bz * NC + c) * G + grp) * Q + m0;
  const int st_row = ((bz * NC + c) * H + h) * P;
  const int vrow = (bz * H + h) * NC + c;  // dt / dA_cumsum row (chunk) of (batch, head, chunk)
  const float* da_g = da_ptr + (size_t)vrow * Q;
  (void)cb_row; (void)st_row; (void)da_g; (void)vrow; (void)grp;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* c_s = smem + {lay['c']};
  uint8_t* st_s = smem + {lay['st']};
  uint8_t* cb_s = smem + {lay['cb']};
  uint8_t* x_s = smem + {lay['x']};
  float* da_s = reinterpret_cast<float*>(smem + {lay['da']});
  float* dt_s = reinterpret_cast<float*>(smem + {lay['dt']});
  float* dacs_s = reinterpret_cast<float*>(smem + {lay['dacs']});
  uint64_t* pre_bar = reinterpret_cast<uint64_t*>(smem + {lay['bar']});
  uint64_t* w_full = pre_bar + 1;
  uint64_t* w_empty = w_full + DEPTH;
  uint64_t* x_full = w_empty + DEPTH;
  uint64_t* x_empty = x_full + DEPTH;
  (void)c_s; (void)st_s;
{setup(inits, ("cb", "x", "c", "states", "dt", "da"))}
  if (wg == 0) {{
    {dec}
    if (threadIdx.x == 0) {{
{chr(10).join(prod_pre)}
{prod_code}
    }}
  }} else {{
    {inc}
    const int g = wg - 1;
    const int w = (threadIdx.x / 32) & 3;
{" else ".join(branches)}
  }}
}}
"""
    e = 2
    maps = (
        TensorMapSpec("cb", dt, (Q, B * nc * G * Q), (Q * e,), (64, BM)),
        TensorMapSpec("x", dt, (P, H, L, B), (P * e, H * P * e, L * H * P * e), (64, 1, BK, 1)),
        TensorMapSpec("c", dt, (N, G, L, B), (N * e, G * N * e, L * G * N * e), (64, 1, BM, 1)),
        TensorMapSpec("states", dt, (N, B * nc * H * P), (N * e,), (64, P)),
        TensorMapSpec("dt", "fp32", (Q, B * H * nc), (Q * 4,), (BK, 1), 0),
        TensorMapSpec("dA", "fp32", (Q, B * H * nc), (Q * 4,), (BK, 1), 0),
    )
    return KernelSource(source=src, name=name, op=OP, params=dict(p), grid=(nmb, H, B * nc),
                        block=(threads, 1, 1), smem_bytes=lay["total"], tensor_maps=maps,
                        args=("tmap:cb", "tmap:x", "tmap:c", "tmap:states", "tmap:dt", "tmap:dA", "ptr:dA", "ptr:out"),
                        info={"tiling": dict(t), "consumer_regs": creg, "w_buffers": [nbufs[r] for r in roles]})


# ------------------------------------------------------------------------------------------------ runtime

_EMITTED: dict[str, KernelSource] = {}


def _emit_cached(plan: KernelPlan) -> KernelSource:
    key = plan.to_json() if isinstance(plan, KernelPlan) else None
    if key is None:
        return emit_chunk_scan(plan)
    if key not in _EMITTED:
        _EMITTED[key] = emit_chunk_scan(plan)
    return _EMITTED[key]


def run_chunk_scan(cb: Any, x: Any, dt: Any, dA_cumsum: Any, C: Any, states: Any, plan: KernelPlan,
                   out: Any = None) -> Any:
    """ChunkScan with the kernel emitted for ``plan`` (torch CUDA tensors, official mamba_ssm layouts):
    cb (b, nc, g, Q, Q), x (b, L, h, p), dt / dA_cumsum (b, h, nc, Q) float32, C (b, L, g, n),
    states (b, nc, h, p, n) → out (b, L, h, p). cb, x, C, out must be the plan's dtype; states of another
    float dtype (e.g. the float32 the official state passing may produce) are converted to it (the wgmma
    operand), and so is a cb of another dtype (the official ``_bmm_chunk_fwd`` can return float32)."""
    import torch

    from ptsolve.errors import DeviceError

    from ..runtime import load

    ks = _emit_cached(plan)
    p = ks.params
    B, L, H, P, N, Q, G = (p[k] for k in PARAM_KEYS)
    nc = -(-L // Q)
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]

    def need(tn: Any, name: str, shape: tuple[int, ...], dtype: Any, convert: bool = False) -> Any:
        if not isinstance(tn, torch.Tensor) or not tn.is_cuda:
            raise DeviceError(f"{name} must be a CUDA torch tensor")
        if tuple(tn.shape) != shape:
            raise DeviceError(f"kernel was built for {name} of shape {shape}; got {tuple(tn.shape)}: emit a plan for "
                              "this shape")
        if tn.dtype != dtype:
            if not convert:
                raise DeviceError(f"{name} must be {dtype}, got {tn.dtype}")
            tn = tn.to(dtype)
        return tn.contiguous()

    cb = need(cb, "cb", (B, nc, G, Q, Q), tdt, convert=True)
    x = need(x, "x", (B, L, H, P), tdt)
    dt = need(dt, "dt", (B, H, nc, Q), torch.float32)
    dA_cumsum = need(dA_cumsum, "dA_cumsum", (B, H, nc, Q), torch.float32)
    C = need(C, "C", (B, L, G, N), tdt)
    states = need(states, "states", (B, nc, H, P, N), tdt, convert=True)
    for name, tn in (("dt", dt), ("dA_cumsum", dA_cumsum)):
        if tn.data_ptr() % 16:  # cp.async.bulk needs 16-byte aligned sources
            raise DeviceError(f"{name} must be 16-byte aligned (a view with an odd storage offset?); pass a copy")
    o = out if out is not None else torch.empty_like(x)
    if not isinstance(o, torch.Tensor) or tuple(o.shape) != (B, L, H, P) or o.dtype != tdt or not o.is_contiguous():
        raise DeviceError(f"out must be a contiguous {tdt} CUDA tensor of shape {(B, L, H, P)}")
    ptrs = {"cb": cb.data_ptr(), "x": x.data_ptr(), "c": C.data_ptr(), "states": states.data_ptr(),
            "dt": dt.data_ptr(), "dA": dA_cumsum.data_ptr(), "out": o.data_ptr()}
    load(ks).launch(ptrs, int(torch.cuda.current_stream().cuda_stream))
    return o
