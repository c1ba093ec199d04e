"""Mamba2 ChunkState emitter (sm_90a): per-chunk SSM states, mamba_ssm's ``_chunk_state_fwd`` layouts.

    states[b, c, h, p, n] = sum_{l in chunk c} x[b, l, h, p] * B[b, l, h // (H / G), n]
                                       * exp(dA_cumsum[b, h, c, Q - 1] - dA_cumsum[b, h, c, l]) * dt[b, h, c, l]

Inputs: x (batch, seq, heads, head_dim) fp16/bf16; B (batch, seq, groups, d_state) same dtype; dt and dA_cumsum
(batch, heads, nchunks, chunk) float32 (dt already softplus'd). Output: states (batch, nchunks, heads, head_dim,
d_state) float32. ``params`` use ptsolve's mamba2 names: batch, seq, heads, head_dim, d_state, chunk, groups
(= ngroups of B), dtype. ``tiling``: BM (d_state columns per CTA), BK (chunk positions per loop step), depth (ring
stages), groups (consumer warpgroups; each owns BM/groups d_state columns: 64 or 128).

Kernel: one CTA per (chunk x head, d_state block, batch) (grid x runs over heads first, so the heads of a
group, which share B, run side by side); warpgroup 0 is the producer (one thread: x and B tiles by
``cp.async.bulk.tensor`` with 128B swizzle, dA / dt slices as unswizzled TMA tiles of the float32 (chunk rows,
chunk) view, all into one ``depth``-stage
ring, full/empty mbarriers; the chunk's last dA by a 16-byte bulk copy in the pre phase). Consumer warpgroups:
``scale`` multiplies the x tile by s_l = exp(dA_last - dA_l) * dt_l in shared memory, writing this warpgroup's xs
buffer (same swizzled layout as x; s_l is forced to 0 for positions >= seq, so whatever dt/dA hold there cannot
inject NaN/Inf), then ``fence.proxy.async`` + a warpgroup named barrier make the generic-proxy stores visible to
wgmma; ``mma`` accumulates acc[head_dim, cols] += xs^T * B with both operands MN-major in shared memory (position
is K, the outer dimension of both tiles; ``wgmma`` with trans-a = trans-b = 1). With two warpgroups each scales
the whole x tile into its own xs (the graph's ``xs@g``): duplicated vector work, but no cross-group barrier.
The accumulator is (head_dim rows x d_state columns) so the epilogue writes contiguous d_state pairs (float2).

Plan order: each role's loop follows the plan's (task, stage) list through ``schedule.emit_loop`` (stages of
each role shifted so its earliest is 0; roles meet only through mbarriers). The number of xs buffers follows from
the consumer order (``xs_buffers``): scale and mma at one stage need one buffer (the scale of it+1 waits for the
mma of it: vector and tensor-core work serialise); the mma one stage behind the scale ([mma@g stage 1, scale@g
stage 0], ``default_chunk_state_plan(..., overlap=True)``) gets two, so the scale of it+1 overlaps the mma of it;
[scale@g 0, mma@g 1] three. The mma task waits for its previous group right after committing (``wait_group 1``)
and frees that step's ring slot (as in the GEMM); ``check_ring`` rejects orders that would deadlock on a ring of
``depth`` slots. ``tc_order`` is validated but unused (cooperative: both groups read every stage).

Optional tiling key ``ctas`` (1 default, or 2): CTAs per SM. 1 uses setmaxnreg (producer 24 registers, consumers
the ptsolve budget); 2 drops it and builds with ``__launch_bounds__(threads, 2)`` (80 registers per thread at two
consumer groups, 128 at one; at most half the shared memory), so that two short CTAs overlap on an SM.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from codegen.plan import KernelPlan
from ptsolve.errors import CodegenError, DeviceError

from .common import PRELUDE, PRELUDE_END, PRODUCER_REGS, KernelSource, TensorMapSpec, setup, wgmma_smem
from .schedule import SIM_EXTRA, LoopOrder, Op, check_deps, emit_loop, role_steps, simulate, wait_depths
from .validate import int_params, int_tiling, validate_order

OP = "mamba2_chunk_state"
PARAM_KEYS = ("batch", "seq", "heads", "head_dim", "d_state", "chunk", "groups")
# phase -> (producer tasks, per-warpgroup task bases)
TASKS = {
    "pre": (("load_dalast",), ("zero",)),
    "loop": (("load_b", "load_x", "load_dA", "load_dt"), ("scale", "mma")),
    "post": ((), ("store",)),
}
COMMITS = {"mma"}
LOG2E = 1.4426950408889634


# ------------------------------------------------------------------------------------------------ validation


def validate_chunk_state(plan: KernelPlan) -> tuple[dict[str, Any], dict[str, int], dict[str, dict[str, list]]]:
    """(params, tiling, order) of a ChunkState plan, every name and number checked; CodegenError otherwise."""
    if not isinstance(plan, KernelPlan):
        raise CodegenError(f"emit_chunk_state() takes a codegen.plan.KernelPlan, got {type(plan).__name__}")
    if plan.op != OP:
        raise CodegenError(f"emit_chunk_state() emits {OP!r} plans, not {plan.op!r}")
    q = int_params(OP, plan.params, PARAM_KEYS, {"groups": 1})
    dt = q.pop("dtype")
    if q["head_dim"] not in (64, 128):
        raise CodegenError(f"{OP}: head_dim must be 64 or 128, got {q['head_dim']}")
    if q["d_state"] % 64:
        raise CodegenError(f"{OP}: d_state={q['d_state']} must be a multiple of 64 (128-byte TMA boxes of B)")
    if q["chunk"] % 16:
        raise CodegenError(f"{OP}: chunk={q['chunk']} must be a multiple of 16")
    if q["heads"] % q["groups"]:
        raise CodegenError(f"{OP}: heads={q['heads']} is not a multiple of groups={q['groups']}")
    nchunks = -(-q["seq"] // q["chunk"])
    # x / B are addressed by per-dimension TMA coordinates and the output by 64-bit offsets; the one 32-bit
    # element index is the dt / dA_cumsum row, batch·heads·nchunks·chunk
    if q["batch"] * q["heads"] * nchunks * q["chunk"] >= 1 << 31:
        raise CodegenError(f"{OP}: dt / dA_cumsum too large (batch·heads·nchunks·chunk >= 2^31) for the kernel's "
                           "32-bit index")
    if q["batch"] > 65535:
        raise CodegenError(f"{OP}: batch={q['batch']} exceeds the grid's z limit (65535)")
    params = q | {"dtype": dt}

    # optional ctas: CTAs per SM the kernel is built for. 1 (default): setmaxnreg moves the registers to the
    # consumers (the ptsolve model's budget). 2: no setmaxnreg, __launch_bounds__(threads, 2), every thread gets
    # 65536 / (2 * threads) registers and each CTA at most half the shared memory: two CTAs share an SM, so
    # one's loads and stores overlap the other's work (this kernel is short per CTA and memory bound)
    q_t = int_tiling(OP, plan.tiling, {"BM": (64, 256, None), "BK": (16, 256, None), "depth": (1, 8, None),
                                       "groups": (1, 2, None), "ctas": (1, 2, 1)}, closed=True)
    BM, BK, depth, W, ctas = q_t.values()
    if BM % W or (BM // W) not in (64, 128):
        raise CodegenError(f"{OP}: BM={BM} over {W} warpgroup(s) must give 64 or 128 d_state columns each")
    if q["d_state"] % BM:
        raise CodegenError(f"{OP}: d_state={q['d_state']} is not a multiple of BM={BM}")
    if BK % 16 or q["chunk"] % BK:
        raise CodegenError(f"{OP}: BK={BK} must be a multiple of 16 that divides chunk={q['chunk']}")
    acc = q["head_dim"] // 64 * (BM // W) // 2
    regs = thread_regs(W, ctas)
    if acc > regs - 40:
        raise CodegenError(f"{OP}: the accumulator needs {acc} registers per thread, too many for the {regs} of "
                           f"{W} consumer warpgroup(s) at {ctas} CTA(s) per SM; use a smaller BM or more groups")
    tiling = {"BM": BM, "BK": BK, "depth": depth, "groups": W, "ctas": ctas}
    smem = _layout(params, tiling, 1)["total"]  # emit_chunk_state checks again with the order's xs buffers
    if smem > smem_limit(ctas):
        raise CodegenError(f"{OP} tiling {tiling} needs {smem} B of shared memory, over the {smem_limit(ctas)} B "
                           f"limit of {ctas} CTA(s) per SM")
    return params, tiling, validate_order(plan, W, TASKS, ("mma",))


def thread_regs(W: int, ctas: int) -> int:
    """Registers per consumer thread: the setmaxnreg budget at one CTA per SM, else the even share of the
    register file over ``ctas`` CTAs of 128 * (W + 1) threads (ptsolve.ops.base.consumer_reg_budget)."""
    from ptsolve.hw import load
    from ptsolve.ops.base import consumer_reg_budget
    return consumer_reg_budget(W, load("h100"), ctas)  # every sm_90 part has the same register file


def smem_limit(ctas: int) -> int:
    """Dynamic shared memory one CTA may use when ``ctas`` CTAs share an SM (ptsolve.ops.base.smem_budget)."""
    from ptsolve.hw import load
    from ptsolve.ops.base import smem_budget
    return smem_budget(load("h100"), ctas)


# ------------------------------------------------------------------------------------------------ plans


def default_chunk_state_plan(params: dict[str, Any], tiling: dict[str, int], overlap: bool = False) -> KernelPlan:
    """The textbook order: loads B, x, dA, dt; per warpgroup scale then mma in one stage. ``overlap`` puts the
    mma one stage behind the scale (mma of it-1 issued before the scale of it: two xs buffers, the scaling
    overlaps the tensor cores)."""
    W = int(tiling["groups"])
    pre: dict[str, list[tuple[str, int]]] = {"producer": [("load_dalast", 0)]}
    pre |= {f"wg{g}": [(f"zero@{g}", 0)] for g in range(W)}
    loop: dict[str, list[tuple[str, int]]] = {"producer": [("load_b", 0), ("load_x", 0), ("load_dA", 0),
                                                           ("load_dt", 0)]}
    if overlap:
        loop |= {f"wg{g}": [(f"mma@{g}", 1), (f"scale@{g}", 0)] for g in range(W)}
    else:
        loop |= {f"wg{g}": [(f"scale@{g}", 0), (f"mma@{g}", 0)] for g in range(W)}
    post = {f"wg{g}": [(f"store@{g}", 0)] for g in range(W)}
    return KernelPlan(OP, dict(params), dict(tiling), {"pre": pre, "loop": loop, "post": post},
                      [f"mma@{g}" for g in range(W)])


# ------------------------------------------------------------------------------------------------ emission


def _layout(p: dict[str, Any], t: dict[str, int], nxs: int) -> dict[str, int]:
    """Byte offsets of one ring stage (B | x | dA | dt, 1024-aligned for the 128B-swizzled tiles), the xs
    buffers (W * nxs, after the ring), the barriers, and the total incl. 1 KB alignment slack."""
    BM, BK, depth, W, P = t["BM"], t["BK"], t["depth"], t["groups"], p["head_dim"]
    b_bytes, x_bytes = BM * BK * 2, BK * P * 2
    da_off = b_bytes + x_bytes
    f_slot = -(-BK * 4 // 128) * 128  # dA / dt come by TMA: 128-byte aligned destinations
    stage = -(-(da_off + 2 * f_slot) // 1024) * 1024
    xs_off = depth * stage
    bar_off = xs_off + W * nxs * x_bytes
    dal_off = bar_off + -(-(2 * depth + 1) * 8 // 16) * 16  # bulk copies need 16-byte aligned destinations
    return {"b_bytes": b_bytes, "x_bytes": x_bytes, "x_off": b_bytes, "da_off": da_off, "dt_off": da_off + f_slot,
            "stage": stage, "xs_off": xs_off, "bar_off": bar_off, "dal_off": dal_off, "total": dal_off + 16 + 1024}


def _wgmma_tt(n: int, dtype: str) -> str:
    """``wgmma_tt_n{n}``: D[64 x n] += A * B, both from shared memory and both MN-major (trans-a = trans-b = 1)."""
    return wgmma_smem(f"wgmma_tt_n{n}", n, dtype, 1)


BULK = r"""
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
"""


def _producer(name: str, it: str, parity: int | None, waits: Any) -> str:
    head = (f"{{ const int it_ = {it}; const int s_ = it_ % DEPTH;\n"
            f"  mbar_wait(&empty_bar[s_], ((it_ / DEPTH) & 1) ^ 1);\n")
    row = "c0 * Q + it_ * BK"  # sequence row of this step's first position; rows >= SEQ are zero-filled by TMA
    if name == "load_b":
        return head + ("  mbar_expect_tx(&full_bar[s_], B_BYTES);\n#pragma unroll\n"
                       "  for (int c = 0; c < BM / 64; ++c)\n"
                       "    tma_load_4d(smem + s_ * STAGE + c * BK * 128, &tm_b, &full_bar[s_], "
                       f"n0 + c * 64, grp, {row}, bz); }}")
    if name == "load_x":
        return head + ("  mbar_expect_tx(&full_bar[s_], X_BYTES);\n#pragma unroll\n"
                       "  for (int c = 0; c < P / 64; ++c)\n"
                       "    tma_load_4d(smem + s_ * STAGE + X_OFF + c * BK * 128, &tm_x, &full_bar[s_], "
                       f"c * 64, hd, {row}, bz); }}")
    off, tm = ("DA_OFF", "tm_da") if name == "load_dA" else ("DT_OFF", "tm_dt")
    # dt / dA rows are full chunks in global memory (nchunks * chunk), so this copy never leaves the tensor;
    # a TMA tile of the (rows of chunk, chunk) view rather than a raw cp.async.bulk: the same bytes, and
    # compute-sanitizer's racecheck follows the mbarriers of tensor copies
    return head + (f"  mbar_expect_tx(&full_bar[s_], BK * 4);\n"
                   f"  tma_load_2d(smem + s_ * STAGE + {off}, &{tm}, &full_bar[s_], it_ * BK, vec0 / Q); }}")


def _consumer(nxs: int, P: int, rows: int, bk: int) -> Callable[[str, str, int | None, Any], str]:
    mt = P // 64

    def body(name: str, it: str, parity: int | None, waits: Any) -> str:
        head = f"{{ const int it_ = {it}; const int s_ = it_ % DEPTH;"
        xs = "xs_g" if nxs == 1 else f"(xs_g + (it_ % {nxs}) * X_BYTES)"
        if name == "scale":
            n = 0 if waits is None else waits.get("mma", 0)
            return "\n".join([
                head,
                f"  wg_wait<{n}>();  // the mma that last read this xs buffer (iteration it - {nxs}) is complete",
                "  mbar_wait(&full_bar[s_], (it_ / DEPTH) & 1);",
                "  const float* da_s = reinterpret_cast<const float*>(smem + s_ * STAGE + DA_OFF);",
                "  const float* dt_s = reinterpret_cast<const float*>(smem + s_ * STAGE + DT_OFF);",
                "  const uint8_t* x_s = smem + s_ * STAGE + X_OFF;",
                f"  uint8_t* xs_s = {xs};",
                "  // 16-byte vectors; swizzling permutes vectors within a 128-byte row, so vector v lies in row",
                "  // (v / 8) % BK of its 64-column block whatever the swizzle; xs keeps x's (swizzled) layout",
                "#pragma unroll",
                "  for (int i = 0; i < XVEC / 128; ++i) {",
                "    const int v = tid + 128 * i;",
                "    const int l = (v >> 3) % BK;",
                "    const float sl = (it_ * BK + l < VALID) ? fast_exp2((dal - da_s[l]) * LOG2E) * dt_s[l] : 0.f;",
                "    uint4 u = *reinterpret_cast<const uint4*>(x_s + 16 * v);",
                "    scale8(u, sl);",
                "    *reinterpret_cast<uint4*>(xs_s + 16 * v) = u;",
                "  }",
                "  // generic-proxy stores -> wgmma (async proxy) reads; all 128 threads before any wgmma",
                '  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");',
                '  asm volatile("bar.sync %0, 128;" :: "r"(1 + g) : "memory"); }'])
        assert name == "mma"
        lines = [head,
                 "  // the ring slot's full barrier was waited on by this iteration's scale (issued before)",
                 f"  const uint32_t sa = smem_u32({xs});",
                 "  const uint32_t sb = smem_u32(smem + s_ * STAGE) + COL0 / 64 * BK * 128;",
                 "  wg_fence();"]
        for kk in range(bk // 16):
            for m in range(mt):
                lines.append(f"  wgmma_tt_n{rows}(acc[{m}], make_desc(sa + {m * bk * 128 + kk * 2048}, {bk * 128}, "
                             f"1024), make_desc(sb + {kk * 2048}, {bk * 128}, 1024));")
        lines += ["  wg_commit();",
                  "  wg_wait<1>();  // the previous step's group is done: its ring slot (B, x, dA, dt) is free",
                  "  // the scale's generic reads of the slot (x, dA, dt) before the next async-proxy copy into it",
                  '  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");',
                  "  __syncwarp();",
                  "  if (it_ > 0 && lane == 0) mbar_arrive(&empty_bar[(it_ - 1) % DEPTH]); }"]
        return "\n".join(lines)
    return body


def _fixed(name: str) -> str:
    if name == "zero":
        return "\n".join([
            "#pragma unroll", "for (int m = 0; m < MT; ++m) {", "#pragma unroll",
            "  for (int i = 0; i < COLS / 2; ++i) acc[m][i] = 0.f;", "}",
            "mbar_wait(dal_bar, 0);  // dA_cumsum at the chunk's last position", "dal = dal_s[3];"])
    assert name == "store"
    # thread holds rows p = 64m + 16w + lane/4 (+8) and column pairs n = 8j + 2(lane%4) of its tile
    return "\n".join([
        "wg_wait<0>();", "#pragma unroll", "for (int m = 0; m < MT; ++m) fence_regs(acc[m]);",
        "float* obase = out + ((size_t)(bz * NC + c0) * H + hd) * P * N + n0 + COL0 + 2 * (lane & 3);",
        "#pragma unroll", "for (int m = 0; m < MT; ++m) {", "#pragma unroll", "  for (int hh = 0; hh < 2; ++hh) {",
        "    const int p = 64 * m + 16 * w + (lane >> 2) + 8 * hh;", "#pragma unroll",
        "    for (int j = 0; j < COLS / 8; ++j)",
        "      *reinterpret_cast<float2*>(obase + (size_t)p * N + 8 * j) = "
        "make_float2(acc[m][4 * j + 2 * hh], acc[m][4 * j + 2 * hh + 1]);",
        "  }", "}"])


def _positions(lo: LoopOrder) -> dict[tuple[str, int], int]:
    trips = lo.stages + SIM_EXTRA + 4
    return {(n, it): k for k, (_, n, it) in enumerate(lo.flatten(trips))}


def xs_buffers(lo: LoopOrder) -> int:
    """xs buffers of one consumer order. Let scale(it + k) be the first scale issued after mma(it) (k = 1 when
    scale and mma alternate, 2 when the scale runs one step ahead in the stream). k buffers are the minimum:
    that scale then reuses mma(it)'s buffer and waits for the mma just issued (tensor cores and vector work
    serialise). A plan that puts the mma d stages behind the scale asks for the scaling to run ahead of the
    tensor cores: k + d buffers, so the scale after mma(it) only waits for mma(it - d). CodegenError beyond 3."""
    pos = _positions(lo)
    st = dict(lo.ops)
    it = lo.stages + 1
    k = next(i for i in range(1, 8) if pos[("scale", it + i)] > pos[("mma", it)])
    d = max(0, st["mma"] - st["scale"])
    n = k + d
    if n > 3:
        raise CodegenError(f"plan order needs {n} xs buffers (the scale runs {n - 1} steps ahead of the mma); "
                           "at most 3 are supported")
    return n


def check_ring(role: str, lo: LoopOrder, depth: int) -> None:
    """CodegenError if the ring would deadlock: the load of iteration it needs the slot of it - depth, which
    mma(it - depth + 1) frees; scale(it) waits for that load, so that mma must be issued before scale(it)."""
    pos = _positions(lo)
    trips = lo.stages + SIM_EXTRA + 4
    for it in range(depth, trips):
        if pos[("mma", it - depth + 1)] > pos[("scale", it)]:
            raise CodegenError(f"plan order for {role} with ring depth {depth}: scale of iteration it waits for a "
                               f"load that needs the slot freed by mma of it-{depth - 1}, issued after it; the "
                               f"kernel would deadlock (use a deeper ring or fewer stages between scale and mma)")


def check_sync(prod: LoopOrder, loops: dict[str, LoopOrder], depth: int) -> None:
    """Simulate the emitted kernel's mbarrier traffic on the CPU (``schedule.simulate``) for short and long trip
    counts: the producer's loads (each waits for its ring slot to be freed by every group), each group's scale
    (waits for the four loads of its iteration) and mma (frees the previous iteration's slot). CodegenError if
    the roles would deadlock, e.g. a producer order with a load a stage late on a shallow ring."""
    W = len(loops)
    S = max([prod.stages, *(lo.stages for lo in loops.values())])

    def prod_ops(name: str, it: int) -> list[Op]:
        wait: list[Op] = [("wait", ("free", it - depth), W)] if it >= depth else []
        return [*wait, ("signal", ("full", it, name))]

    def cons_ops(name: str, it: int) -> list[Op]:
        if name == "scale":
            return [("wait", ("full", it, n), 1) for n in TASKS["loop"][0]]
        return [("signal", ("free", it - 1))] if it > 0 else []

    for T in range(1, S + depth + 4):
        prog = {"producer": role_steps(prod, T, {}, prod_ops)}
        prog |= {r: role_steps(lo, T, {}, cons_ops) for r, lo in loops.items()}
        simulate(prog, f"{OP} ring of depth {depth} with {T} loop steps")


def _shift(ops: list[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """Stages shifted so the earliest is 0 (saves empty prologue iterations; roles sync through mbarriers)."""
    base = min((s for _, s in ops), default=0)
    return tuple((n, s - base) for n, s in ops)


def emit_chunk_state(plan: KernelPlan) -> KernelSource:
    """CUDA source and launch metadata of the ChunkState kernel for ``plan`` (op ``mamba2_chunk_state``);
    raises CodegenError for a plan it cannot emit (unknown task or role, bad tiling, order against the
    dependencies, more than two xs buffers)."""
    from . import plan_id as _plan_id

    p, t, order = validate_chunk_state(plan)
    Bt, L, H, P, N, Q, G, dt = (p[k] for k in (*PARAM_KEYS, "dtype"))
    BM, BK, depth, W = t["BM"], t["BK"], t["depth"], t["groups"]
    rows = BM // W
    NC = -(-L // Q)
    pid = _plan_id(plan)
    name = f"pts_chunk_state_{dt}_b{Bt}_l{L}_h{H}_g{G}_p{P}_n{N}_q{Q}_bm{BM}_bk{BK}_d{depth}_w{W}_{pid}"
    threads = 128 * (W + 1)
    ctas = t["ctas"]
    creg = thread_regs(W, ctas)
    # one CTA per SM: shift registers to the consumers; two: every thread keeps the even share (no setmaxnreg)
    dec = f'asm volatile("setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS};");' if ctas == 1 else ""
    inc = f'asm volatile("setmaxnreg.inc.sync.aligned.u32 {creg};");' if ctas == 1 else ""

    prod = LoopOrder(_shift(order["loop"]["producer"]))
    prod_code = emit_loop(prod, "T", _producer, 1, {}, min_trips=1)
    prod_pre = "\n".join(
        "// pre: load_dalast (16 bytes ending at the chunk's last position)\n"
        "mbar_expect_tx(dal_bar, 16);\nbulk_load(dal_s, da + vec0 + Q - 4, 16, dal_bar);"
        for _ in order["pre"]["producer"])
    loops = [LoopOrder(_shift(order["loop"][f"wg{g}"])) for g in range(W)]
    nxss = [xs_buffers(lo) for lo in loops]
    for g, (lo, nxs) in enumerate(zip(loops, nxss)):
        check_deps(f"wg{g}", lo, {"mma": [("scale", 0), ("mma", -1)], "scale": [("mma", -nxs), ("scale", -1)]})
        check_ring(f"wg{g}", lo, depth)
    check_sync(prod, {f"wg{g}": lo for g, lo in enumerate(loops)}, depth)
    roles = []
    for g, (lo, nxs) in enumerate(zip(loops, nxss)):
        steady = wait_depths(lo, COMMITS, {"scale": [("mma", -nxs)]})
        code = [f"// ---- consumer warpgroup {g}: d_state columns {g * rows}..{(g + 1) * rows - 1} of the block; "
                f"{nxs} xs buffer(s)",
                f"constexpr int COL0 = {g * rows};",
                f"uint8_t* xs_g = smem + XS_OFF + {g * max(nxss)} * X_BYTES;  // this group's xs buffers",
                "float acc[MT][COLS / 2];", "float dal = 0.f;"]
        code += [f"// pre: {n}\n{_fixed(n)}" for n, _ in order["pre"][f"wg{g}"]]
        code.append("#pragma unroll\nfor (int m = 0; m < MT; ++m) fence_regs(acc[m]);")
        code.append(emit_loop(lo, "T", _consumer(nxs, P, rows, BK), 1, steady, COMMITS, min_trips=1))
        code += [f"// post: {n}\n{_fixed(n)}" for n, _ in order["post"][f"wg{g}"]]
        roles.append("\n".join(code))
    branches = " else ".join(f"if (g == {g}) {{\n{r}\n}}" for g, r in enumerate(roles))
    lay = _layout(p, t, max(nxss))
    if lay["total"] > smem_limit(t["ctas"]):
        raise CodegenError(f"{OP} tiling {t} with {max(nxss)} xs buffer(s) needs {lay['total']} B of shared "
                           f"memory, over the {smem_limit(t['ctas'])} B limit of {t['ctas']} CTA(s) per SM")
    ct = {"fp16": "__half2", "bf16": "__nv_bfloat162"}[dt]
    to_f2 = {"fp16": "__half22float2", "bf16": "__bfloat1622float2"}[dt]
    to_h2 = {"fp16": "__floats2half2_rn", "bf16": "__floats2bfloat162_rn"}[dt]
    inits = ("    for (int s = 0; s < DEPTH; ++s) { mbar_init(&full_bar[s], 4); "
             f"mbar_init(&empty_bar[s], 4 * {W}); }}\n    mbar_init(dal_bar, 1);")
    src = f"""// generated by ptsolve codegen.cuda (mamba2_chunk_state, plan {pid})
{PRELUDE}
{BULK}
{_wgmma_tt(rows, dt)}
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
{PRELUDE_END}
extern "C" __global__ void __launch_bounds__({threads}, {ctas})
{name}(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_b,
       const __grid_constant__ CUtensorMap tm_dt, const __grid_constant__ CUtensorMap tm_da,
       const float* __restrict__ da, float* __restrict__ out) {{
  using namespace pts;
  constexpr int SEQ = {L}, H = {H}, G = {G}, P = {P}, N = {N}, Q = {Q}, NC = {NC};
  constexpr int BM = {BM}, BK = {BK}, DEPTH = {depth}, MT = P / 64, COLS = {rows};
  constexpr int XVEC = BK * P / 8;  // 16-byte vectors of one x tile
  constexpr uint32_t B_BYTES = {lay['b_bytes']}, X_BYTES = {lay['x_bytes']}, X_OFF = {lay['x_off']};
  constexpr uint32_t DA_OFF = {lay['da_off']}, DT_OFF = {lay['dt_off']}, STAGE = {lay['stage']};
  constexpr uint32_t XS_OFF = {lay['xs_off']};
  constexpr float LOG2E = {LOG2E!r}f;
  extern __shared__ uint8_t smem_raw[];
  // 128B-swizzled TMA tiles need 1024-byte alignment; dynamic smem only guarantees 16
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + {lay['bar_off']});
  uint64_t* empty_bar = full_bar + DEPTH;
  uint64_t* dal_bar = empty_bar + DEPTH;
  float* dal_s = reinterpret_cast<float*>(smem + {lay['dal_off']});
  const int n0 = blockIdx.y * BM, c0 = blockIdx.x / H, hd = blockIdx.x % H, bz = blockIdx.z;
  const int grp = hd / (H / G);
  const int vec0 = ((bz * H + hd) * NC + c0) * Q;  // dt / dA_cumsum row of (batch, head, chunk)
  const int VALID = (SEQ - c0 * Q) < Q ? (SEQ - c0 * Q) : Q;  // positions of this chunk inside the sequence
  const int T = (VALID + BK - 1) / BK;  // loop steps; a ragged last chunk skips its all-padding steps
  (void)grp; (void)vec0; (void)N; (void)G;
{setup(inits, ("x", "b", "dt", "da"))}
  if (wg == 0) {{
    {dec}
    if (threadIdx.x == 0) {{
{prod_pre}
{prod_code}
    }}
  }} else {{
    {inc}
    const int g = wg - 1;
    const int w = (threadIdx.x / 32) & 3;
    const int tid = threadIdx.x & 127;
    (void)tid; (void)w;
{branches}
  }}
}}
"""
    e = 2
    maps = (
        TensorMapSpec("x", dt, (P, H, L, Bt), (P * e, H * P * e, L * H * P * e), (64, 1, BK, 1)),
        TensorMapSpec("b", dt, (N, G, L, Bt), (N * e, G * N * e, L * G * N * e), (64, 1, BK, 1)),
        TensorMapSpec("dt", "fp32", (Q, Bt * H * NC), (Q * 4,), (BK, 1), 0),
        TensorMapSpec("da", "fp32", (Q, Bt * H * NC), (Q * 4,), (BK, 1), 0),
    )
    return KernelSource(source=src, name=name, op=OP, params=dict(p), grid=(NC * H, N // BM, Bt),
                        block=(threads, 1, 1), smem_bytes=lay["total"], tensor_maps=maps,
                        args=("tmap:x", "tmap:b", "tmap:dt", "tmap:da", "ptr:da", "ptr:out"),
                        info={"tiling": dict(t), "consumer_regs": creg, "xs_buffers": nxss, "tc_turns": None})


# ------------------------------------------------------------------------------------------------ runtime

_EMITTED: dict[str, KernelSource] = {}


def _emit_cached(plan: KernelPlan) -> KernelSource:
    try:
        key = plan.to_json()
    except (AttributeError, TypeError, ValueError):
        return emit_chunk_state(plan)
    if key not in _EMITTED:
        _EMITTED[key] = emit_chunk_state(plan)
    return _EMITTED[key]


def _need(t: Any, name: str, shape: tuple[int, ...], dtype: Any) -> None:
    import torch
    if not isinstance(t, torch.Tensor) or not t.is_cuda:
        raise DeviceError(f"{name} must be a CUDA torch tensor")
    if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
        raise DeviceError(f"chunk_state kernel was built for {name} of shape {shape} {dtype} contiguous; got "
                          f"{tuple(t.shape)} {t.dtype}{'' if t.is_contiguous() else ' non-contiguous'}: "
                          f"emit a plan for this shape")
    if t.data_ptr() % 16:
        raise DeviceError(f"{name} must be 16-byte aligned (TMA / bulk copies)")


def run_chunk_state(x: Any, B: Any, dt: Any, dA_cumsum: Any, plan: KernelPlan, out: Any = None) -> Any:
    """states (batch, nchunks, heads, head_dim, d_state) float32 from x (batch, seq, heads, head_dim), B (batch,
    seq, groups, d_state) in the plan's dtype and dt, dA_cumsum (batch, heads, nchunks, chunk) float32, with the
    kernel emitted for ``plan``; ``out`` (same shape, float32) is written in place when given."""
    import torch

    from codegen.runtime import load

    ks = _emit_cached(plan)
    p = ks.params
    Bt, L, H, P, N, Q, G = (p[k] for k in PARAM_KEYS)
    NC = -(-L // Q)
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    _need(x, "x", (Bt, L, H, P), tdt)
    _need(B, "B", (Bt, L, G, N), tdt)
    _need(dt, "dt", (Bt, H, NC, Q), torch.float32)
    _need(dA_cumsum, "dA_cumsum", (Bt, H, NC, Q), torch.float32)
    o = out if out is not None else torch.empty(Bt, NC, H, P, N, dtype=torch.float32, device=x.device)
    _need(o, "out", (Bt, NC, H, P, N), torch.float32)
    stream = int(torch.cuda.current_stream().cuda_stream)
    load(ks).launch({"x": x.data_ptr(), "b": B.data_ptr(), "dt": dt.data_ptr(), "da": dA_cumsum.data_ptr(),
                     "out": o.data_ptr()}, stream)
    return o


# bench_chunk_state's plan: two CTAs per SM (the kernel is short per CTA and memory bound), 2 consumer groups
DEFAULT_TILING = {"BM": 128, "BK": 64, "depth": 2, "groups": 2, "ctas": 2}
# compare_chunk_state's default variants: label -> (tiling, overlap)
VARIANTS = {
    "g2_2cta_overlap": (DEFAULT_TILING, True),
    "g2_1cta_overlap": ({"BM": 128, "BK": 64, "depth": 3, "groups": 2}, True),
    "g2_1cta_default": ({"BM": 128, "BK": 64, "depth": 3, "groups": 2}, False),
    "g1_2cta_overlap": ({"BM": 128, "BK": 64, "depth": 3, "groups": 1, "ctas": 2}, True),
}


def bench_chunk_state(batch: int, seqlen: int, nheads: int = 64, headdim: int = 64, dstate: int = 128,
                      chunk: int = 256, ngroups: int = 1, dtype: str = "bf16", plan: KernelPlan | None = None,
                      nsets: int = 2) -> float:
    """Median milliseconds per call of our ChunkState kernel (``codegen.bench.time_many``) on random inputs of
    the given shape; ``plan`` defaults to ``default_chunk_state_plan(..., DEFAULT_TILING, overlap=True)``."""
    return compare_chunk_state(batch, seqlen, nheads, headdim, dstate, chunk, ngroups, dtype,
                               {"ours": plan}, nsets, triton=False)["ms"]["ours"]


def compare_chunk_state(batch: int, seqlen: int, nheads: int = 64, headdim: int = 64, dstate: int = 128,
                        chunk: int = 256, ngroups: int = 1, dtype: str = "bf16",
                        plans: dict[str, KernelPlan | None] | None = None, nsets: int = 2,
                        triton: bool = True) -> dict[str, Any]:
    """``codegen.mamba.compare`` at this shape: our kernel(s) (``plans``: label -> plan, None = the default
    overlap plan on DEFAULT_TILING; default: the plans of VARIANTS) next to mamba_ssm's Triton
    ``_chunk_state_fwd`` (for head_dim 128 pass plans: some variants exceed the registers of two CTAs per SM).
    Returns {"ms": {label: median ms}, "rel_err_vs_triton": {label: err}, "triton_error": text or None}."""
    from codegen.mamba import compare

    params = {"batch": batch, "seq": seqlen, "heads": nheads, "head_dim": headdim, "d_state": dstate,
              "chunk": chunk, "groups": ngroups, "dtype": dtype}
    if plans is None:
        plans = {k: default_chunk_state_plan(params, t, overlap=ov) for k, (t, ov) in VARIANTS.items()}
    full = {k: v or default_chunk_state_plan(params, DEFAULT_TILING, overlap=True) for k, v in plans.items()}
    return compare(full, nsets, triton)
