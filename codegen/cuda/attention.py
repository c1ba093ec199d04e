"""FlashAttention forward emitter (GQA, causal bottom-right aligned, ragged sequence lengths).

Layout: q/o [B, Sq, H, D], k/v [B, Skv, Hkv, D] (FlashAttention's), softmax scale 1/sqrt(D). One CTA owns BM
query rows of one (batch, head); consumer warpgroup g owns rows 64g..64g+63. Per key block of BN keys:
S = Q Kᵀ (wgmma, both operands in smem, K-major), online softmax in registers (exp2 domain), O += P V
(wgmma with P from registers, V MN-major in smem). Ragged tails: TMA zero-fills out-of-range rows, scores
of keys >= seq_kv (and above the causal diagonal) become -inf, rows >= seq_q are not stored.
The plan's ``tc_order`` (the order in which the tensor cores serve the groups' QK and PV) is enforced with
named barriers between the consumer warpgroups; see ``codegen.cuda.schedule``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .common import (
    CTYPE,
    PACK2,
    PRELUDE,
    PRELUDE_END,
    PRODUCER_REGS,
    PTXTYPE,
    KernelSource,
    TensorMapSpec,
    consumer_regs,
    setup,
    wgmma_rs,
    wgmma_ss,
)
from .gemm import DEFAULT_SMS
from .schedule import (
    LoopOrder,
    Op,
    Turns,
    buffers_needed,
    check_deps,
    emit_loop,
    plan_turns,
    role_steps,
    simulate,
    wait_depths,
)

# exp2 computes P in place in the fp32 score registers. The packing of P into fp16/bf16 wgmma A fragments
# is appended to whichever of exp2 / rescale of the same iteration runs later: by then P is final and the
# previous PV, which reads the fragments asynchronously, is complete (rescale waits for it). The scores
# then die before the next QK in FA3's order (QK j, PV j-1, softmax j), so one score buffer suffices.
COMMITS = {"mma_qk", "mma_pv"}
# which wgmma groups a task must see complete: rowmax reads S; rescale scales O, which the previous PV
# accumulates into
NEEDS = {"rowmax": [("mma_qk", 0)], "rescale": [("mma_pv", -1)]}


def pack_host(order: LoopOrder) -> str:
    """The task (exp2 or rescale) after which P is packed: the later of the two in issue order."""
    pos = {(n, it): k for k, (_, n, it) in enumerate(order.flatten(order.stages + 4))}
    return "exp2" if pos[("exp2", 1)] > pos[("rescale", 1)] else "rescale"


def s_readers(host: str) -> tuple[str, ...]:
    return ("rowmax", "exp2", "rowsum", host)


def _deps(nbuf: int, host: str) -> dict[str, list[tuple[str, int]]]:
    """Same-role dependencies: (task, iteration offset) each task needs issued before it."""
    return {
        "mma_qk": [(r, -nbuf) for r in s_readers(host)],  # register buffer of S is reused nbuf iterations later
        "rowmax": [("mma_qk", 0), ("rowmax", -1), ("rescale", -1), ("rowsum", -1)],  # m, alpha carried
        "exp2": [("rowmax", 0)],
        "rowsum": [("exp2", 0), ("rowmax", 0)],
        "rescale": [("rowmax", 0), ("mma_pv", -1)],
        "mma_pv": [("exp2", 0), ("rescale", 0)],
    }


def _producer(name: str, it: str, parity: int | None, waits: Any) -> str:
    ring = "k" if name == "load_k" else "v"
    # ring position q_ = key blocks of this CTA's earlier tiles + it_: slots and phases run on across tiles
    return (f"{{ const int it_ = {it}; const int q_ = rbase + it_; const int s_ = q_ % DEPTH;\n"
            f"  mbar_wait(&{ring}_empty[s_], ((q_ / DEPTH) & 1) ^ 1);\n"
            f"  mbar_expect_tx(&{ring}_full[s_], KV_BYTES);\n"
            f"#pragma unroll\n  for (int c = 0; c < DCH; ++c)\n"
            f"    tma_load_4d({ring}_s + s_ * KV_BYTES + c * BN * 128, &tm_{ring}, &{ring}_full[s_], c * 64, hkv, "
            f"it_ * BN, bz); }}")


def _consumer(D: int, BN: int, BM: int, dt: str, nbuf: int, host: str):
    t = PTXTYPE[dt]

    def pack(S: str) -> list[str]:
        out = ["  fence_regs(pf_flat);",
               "  // P (fp32 accumulator layout) is exactly the wgmma A-fragment layout once packed in pairs"]
        for kk in range(BN // 16):
            for r in range(4):
                out.append(f"  pf[{kk}][{r}] = {PACK2[dt]}({S}[{8 * kk + 2 * r}], {S}[{8 * kk + 2 * r + 1}]);")
        return out

    def sbuf(parity: int | None) -> str:
        return f"sacc{parity if nbuf == 2 else 0}"

    def body(name: str, it: str, parity: int | None, waits: Mapping[str, int] | None) -> str:
        S = sbuf(parity)
        head = f"{{ const int it_ = {it};"
        if name == "mma_qk":
            lines = [head, "  const int q_ = rbase + it_; const int s_ = q_ % DEPTH;",
                     "  mbar_wait(&k_full[s_], (q_ / DEPTH) & 1);",
                     "  const uint32_t sq = smem_u32(q_s) + ROW0 * 128;",
                     "  const uint32_t sk = smem_u32(k_s + s_ * KV_BYTES);", "  wg_fence();"]
            for kk in range(D // 16):
                c, off = divmod(kk, 4)
                fn, last = (f"wgmma_ss_n{BN}_{t}", ", 1") if kk else (f"wgmma_ss_n{BN}_{t}_z", "")
                lines.append(f"  {fn}({S}, make_desc(sq + {c * BM * 128 + off * 32}, 16, 1024), "
                             f"make_desc(sk + {c * BN * 128 + off * 32}, 16, 1024){last});")
            lines.append("  wg_commit(); }")
            return "\n".join(lines)
        if name == "rowmax":
            n = 0 if waits is None else waits.get("mma_qk", 0)
            return "\n".join([
                head, f"  wg_wait<{n}>();  // S of this iteration is complete", f"  fence_regs({S});",
                "  if (lane == 0) mbar_arrive(&k_empty[(rbase + it_) % DEPTH]);  // K slot no longer read",
                "  const int kb = it_ * BN;",
                "  if (kb + BN > SKV || (CAUSAL && kb + BN - 1 > m0 + ROW0 + OFF)) {  // tile crosses a mask edge",
                "#pragma unroll", "    for (int j = 0; j < BN / 8; ++j)", "#pragma unroll",
                "      for (int hh = 0; hh < 2; ++hh)", "#pragma unroll", "        for (int c = 0; c < 2; ++c) {",
                "          const int key = kb + 8 * j + 2 * (lane & 3) + c;",
                "          const int row = m0 + ROW0 + w * 16 + (lane >> 2) + 8 * hh;",
                f"          if (key >= SKV || (CAUSAL && key > row + OFF)) {S}[4 * j + 2 * hh + c] = -INFINITY;",
                "        }", "  }", "#pragma unroll", "  for (int hh = 0; hh < 2; ++hh) {",
                f"    float mx = {S}[2 * hh];", "#pragma unroll", "    for (int j = 0; j < BN / 8; ++j)",
                f"      mx = fmaxf(mx, fmaxf({S}[4 * j + 2 * hh], {S}[4 * j + 2 * hh + 1]));",
                "    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));",
                "    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));",
                "    const float mn = fmaxf(m_r[hh], mx * SCALE_LOG2);",
                "    const float mu = (mn == -INFINITY) ? 0.f : mn;  // fully masked row so far: keep exp2 finite",
                "    alpha[hh] = fast_exp2(m_r[hh] - mu);", "    m_r[hh] = mn;", "    muse[hh] = mu;", "  }", "}"])
        if name == "exp2":
            return "\n".join([
                head, "#pragma unroll", "  for (int j = 0; j < BN / 8; ++j)", "#pragma unroll",
                "    for (int i = 0; i < 4; ++i)",
                f"      {S}[4 * j + i] = fast_exp2(fmaf({S}[4 * j + i], SCALE_LOG2, -muse[i >> 1]));",
                *(pack(S) if host == "exp2" else []), "  (void)it_; }"])
        if name == "rowsum":
            # per-thread partial sums; the 4 lanes sharing a row are combined once, in normalize
            return "\n".join([
                head, "#pragma unroll", "  for (int hh = 0; hh < 2; ++hh) {", "    float sm = 0.f;", "#pragma unroll",
                "    for (int j = 0; j < BN / 8; ++j)",
                f"      sm += {S}[4 * j + 2 * hh] + {S}[4 * j + 2 * hh + 1];",
                "    l_r[hh] = l_r[hh] * alpha[hh] + sm;", "  }", "  (void)it_; }"])
        if name == "rescale":
            n = 0 if waits is None else waits.get("mma_pv", 0)
            return "\n".join([
                head, f"  wg_wait<{n}>();  // O is not being accumulated any more", "  fence_regs(o);",
                "  if (it_ > 0 && lane == 0) mbar_arrive(&v_empty[(rbase + it_ - 1) % DEPTH]);  // previous V slot",
                "#pragma unroll", "  for (int j = 0; j < D / 8; ++j)", "#pragma unroll",
                "    for (int i = 0; i < 4; ++i)",
                "      o[4 * j + i] *= alpha[i >> 1];", *(pack(S) if host == "rescale" else []), "}"])
        assert name == "mma_pv"
        lines = [head, "  const int q_ = rbase + it_; const int s_ = q_ % DEPTH;"]
        lines += ["  mbar_wait(&v_full[s_], (q_ / DEPTH) & 1);",
                  "  const uint32_t sv = smem_u32(v_s + s_ * KV_BYTES);",
                  "  wg_fence();"]
        for kk in range(BN // 16):
            lines.append(f"  wgmma_rs_n{D}_{t}_t1(o, pf[{kk}], make_desc(sv + {kk * 16 * 128}, BN * 128, 1024));")
        lines.append("  wg_commit(); }")
        return "\n".join(lines)
    return body


def _fixed(name: str, dt: str) -> str:
    if name == "init":
        return "\n".join([
            "#pragma unroll", "for (int i = 0; i < D / 2; ++i) o[i] = 0.f;",
            "m_r[0] = m_r[1] = -INFINITY; l_r[0] = l_r[1] = 0.f; alpha[0] = alpha[1] = 0.f; muse[0] = muse[1] = 0.f;",
            "mbar_wait(q_bar, lt & 1);  // Q tile resident (phase flips per tile of a persistent CTA)"])
    if name == "normalize":
        return "\n".join([
            "wg_wait<0>();", "fence_regs(o);",
            "if (PERSISTENT && lane == 0) {  // all of this tile's wgmma are done: free Q and the last V slot",
            "  mbar_arrive(q_empty);", "  mbar_arrive(&v_empty[(rbase + T - 1) % DEPTH]);", "}",
            "#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {",
            "  float l = l_r[hh];", "  l += __shfl_xor_sync(0xffffffff, l, 1);",
            "  l += __shfl_xor_sync(0xffffffff, l, 2);", "  inv_l[hh] = l > 0.f ? 1.f / l : 0.f;", "}",
            "#pragma unroll", "for (int j = 0; j < D / 8; ++j)", "#pragma unroll", "  for (int i = 0; i < 4; ++i)",
            "    o[4 * j + i] *= inv_l[i >> 1];"])
    assert name == "store"
    return "\n".join([
        "#pragma unroll", "for (int hh = 0; hh < 2; ++hh) {",
        "  const int row = m0 + ROW0 + w * 16 + (lane >> 2) + 8 * hh;",
        "  if (row < SQ) {  // ragged tail: rows past seq_q are not written",
        "    uint32_t* orow = reinterpret_cast<uint32_t*>(out + ((size_t)(bz * SQ + row) * H + hq) * D);",
        "#pragma unroll", "    for (int j = 0; j < D / 8; ++j)",
        f"      orow[4 * j + (lane & 3)] = {PACK2[dt]}(o[4 * j + 2 * hh], o[4 * j + 2 * hh + 1]);",
        "  }", "}"])


def consumer_loops(order: dict[str, dict[str, list[tuple[str, int]]]], W: int,
                   equal_span: bool = False) -> dict[str, LoopOrder]:
    """Each consumer role's loop order, stages shifted so that the earliest consumer stage is 0. The shift is
    common to all consumers, so their alignment (which tc_order refers to) is kept; the producer is decoupled
    by mbarriers, so its offset does not matter, and empty prologue iterations are saved. ``equal_span``
    gives every role the largest stage count, so all run equally many emitted iterations: the condition for
    identical tensor-core turn sequences (without turns each role keeps its own, fewer guarded paths)."""
    roles = [f"wg{g}" for g in range(W)]
    base = min((s for r in roles for _, s in order["loop"][r]), default=0)
    ops = {r: tuple((n, s - base) for n, s in order["loop"][r]) for r in roles}
    span = max(1 + max((s for _, s in o), default=0) for o in ops.values()) if equal_span else 0
    return {r: LoopOrder(o, span) for r, o in ops.items()}


def turn_plan(loops: dict[str, LoopOrder], tc_order: list[str]) -> Turns | None:
    """Named-barrier turns enforcing ``tc_order`` (barrier 1 + g is "warpgroup g's turn"; 0 is
    __syncthreads'), or None when it names fewer than two warpgroups."""
    tc = [(f"wg{x.split('@')[1]}", x.split("@")[0]) for x in tc_order]
    return plan_turns(loops, tc, {r: 1 + int(r[2:]) for r in loops})


def check_turns(loops: dict[str, LoopOrder], prod: LoopOrder, turns: Turns, depth: int, persistent: bool) -> None:
    """Simulate the emitted kernel's synchronisation on the CPU (named-barrier turns, the K/V ring's full/empty
    mbarriers, the Q buffer of persistent CTAs) for short and long trip counts and, for persistent CTAs,
    several tiles of different lengths in a row; raise CodegenError if the roles would deadlock."""
    W = len(loops)
    S = max(lo.stages for lo in loops.values())
    runs = [[T] for T in range(1, S + 4)]
    if persistent:
        runs += [[S + 3, 1, 2, S + 1, 1], [1, 1, S + 2]]
    for tiles in runs:
        prog: dict[str, list[Op]] = {"producer": []}
        for r in loops:
            prog[r] = [] if turns.first is None or turns.first[0] != r else [("arrive", turns.first[1])]
        rb = 0
        for t, T in enumerate(tiles):
            def prod_ops(name: str, it: int, rb: int = rb) -> list[Op]:
                q, ring = rb + it, name[-1]  # load_k / load_v
                wait = [("wait", (ring, "free", q - depth), W)] if q >= depth else []
                return [*wait, ("signal", (ring, "full", q))]
            prog["producer"] += [("wait", ("q", "free", t - 1), W)] if t else []
            prog["producer"] += [("signal", ("q", "full", t))]
            prog["producer"] += role_steps(prod, T, {}, prod_ops)
            for r, lo in loops.items():
                def cons_ops(name: str, it: int, rb: int = rb) -> list[Op]:
                    q = rb + it
                    if name == "mma_qk":
                        return [("wait", ("k", "full", q), 1)]
                    if name == "rowmax":
                        return [("signal", ("k", "free", q))]
                    if name == "mma_pv":
                        return [("wait", ("v", "full", q), 1)]
                    if name == "rescale" and it > 0:
                        return [("signal", ("v", "free", q - 1))]
                    return []
                prog[r] += [("wait", ("q", "full", t), 1)]
                prog[r] += role_steps(lo, T, turns.ops.get(r, {}), cons_ops)
                prog[r] += [("signal", ("q", "free", t)), ("signal", ("v", "free", rb + T - 1))]  # normalize
            rb += T
        simulate(prog, f"tc_order turns with trip counts {tiles}")


def emit_attention(p: dict[str, Any], t: dict[str, int], order: dict[str, dict[str, list[tuple[str, int]]]],
                   plan_id: str, tc_order: list[str] | None = None) -> KernelSource:
    """The FlashAttention kernel of a validated plan. A ``tc_order`` naming two or more warpgroups is
    enforced with named-barrier turns (``schedule.plan_turns``), after a CPU simulation of the kernel's
    synchronisation shows it cannot deadlock (``check_turns``); an empty one leaves the groups free-running."""
    B, H, Hkv, SQ, SKV, D = (p[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"))
    causal, dt = p["causal"], p["dtype"]
    BM, BN, depth, W = t["BM"], t["BN"], t["depth"], t["groups"]
    persistent = bool(t["persistent"])
    nmb, nkb = -(-SQ // BM), -(-SKV // BN)
    threads = 128 * (W + 1)
    creg = consumer_regs(W)
    name = (f"pts_fa_{dt}_b{B}_h{H}_kv{Hkv}_q{SQ}_k{SKV}_d{D}{'_causal' if causal else ''}"
            f"_bm{BM}_bn{BN}_d{depth}_g{W}_{plan_id}")
    prod = LoopOrder(tuple(order["loop"]["producer"]))
    prod_code = emit_loop(prod, "T", _producer, 1, {})
    prod_pre = "\n".join(
        "// pre: load_q\nif (PERSISTENT) mbar_wait(q_empty, (lt & 1) ^ 1);  // previous tile's QK done\n"
        "mbar_expect_tx(q_bar, Q_BYTES);\n#pragma unroll\nfor (int c = 0; c < DCH; ++c)\n"
        "  tma_load_4d(q_s + c * BM * 128, &tm_q, q_bar, c * 64, hq, m0, bz);" for _ in order["pre"]["producer"])
    roles, nbufs = [], []
    loops = consumer_loops(order, W)
    turns = turn_plan(loops, tc_order or [])
    if turns is not None:
        loops = consumer_loops(order, W, equal_span=True)
        check_turns(loops, prod, turns, depth, persistent)
    for g in range(W):
        lo = loops[f"wg{g}"]
        host = pack_host(lo)
        nbuf = buffers_needed(lo, "mma_qk", s_readers(host))
        check_deps(f"wg{g}", lo, _deps(nbuf, host))
        steady = wait_depths(lo, COMMITS, NEEDS)
        nbufs.append(nbuf)
        code = [f"// ---- consumer warpgroup {g}: query rows {64 * g}..{64 * g + 63} of the tile; "
                f"{nbuf} score buffer(s), P packed after {host}", f"constexpr int ROW0 = {64 * g};",
                "float o[D / 2];", "float m_r[2], l_r[2], alpha[2], muse[2], inv_l[2];",
                "uint32_t pf_flat[BN / 4];",
                "uint32_t (&pf)[BN / 16][4] = *reinterpret_cast<uint32_t (*)[BN / 16][4]>(pf_flat);"]
        code += [f"float sacc{i}[BN / 2];" for i in range(nbuf)]
        code += [f"// pre: {n}\n{_fixed(n, dt)}" for n, _ in order["pre"][f"wg{g}"]]
        # named barrier 1+g = "group g's turn on the tensor cores"; 256 threads = the two groups of a handoff
        turn = None if turns is None else turns.code(f"wg{g}", 256)
        # min_trips 1: every query block sees key block 0 (causal needs seq_q <= seq_kv)
        code.append(emit_loop(lo, "T", _consumer(D, BN, BM, dt, nbuf, host), nbuf, steady, COMMITS, min_trips=1,
                              turn=turn))
        code += [f"// post: {n}\n{_fixed(n, dt)}" for n, _ in order["post"][f"wg{g}"]]
        roles.append("\n".join(code))
    # once per CTA: the owner of the last tc_order entry lets the owner of the first one start (a persistent
    # CTA's later tiles continue the same cyclic sequence)
    first_turn = "" if turns is None or turns.first is None else (
        f"if (g == {int(turns.first[0][2:])}) asm volatile(\"bar.arrive {turns.first[1]}, 256;\" "
        f"::: \"memory\");  // first turn")
    branches = " else ".join(f"if (g == {g}) {{\n{r}\n}}" for g, r in enumerate(roles))
    q_bytes, kv_bytes = BM * D * 2, BN * D * 2
    bar_off = q_bytes + 2 * depth * kv_bytes
    smem_bytes = bar_off + (2 + 4 * depth) * 8 + 1024
    scale_log2 = math.log2(math.e) / math.sqrt(D)
    wg_fns = wgmma_ss(BN, dt) + wgmma_rs(D, dt, 1)
    inits = (f"    mbar_init(q_bar, 1);\n    mbar_init(q_empty, 4 * {W});\n    for (int s = 0; s < DEPTH; ++s) {{\n"
             f"      mbar_init(&k_full[s], 1); mbar_init(&v_full[s], 1);\n"
             f"      mbar_init(&k_empty[s], 4 * {W}); mbar_init(&v_empty[s], 4 * {W});\n    }}")
    src = f"""// generated by ptsolve codegen.cuda (flash_attention, plan {plan_id})
{PRELUDE}
{wg_fns}
{PRELUDE_END}
extern "C" __global__ void __launch_bounds__({threads}, 1)
{name}(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
       const __grid_constant__ CUtensorMap tm_v, {CTYPE[dt]}* __restrict__ out) {{
  using namespace pts;
  constexpr int H = {H}, HKV = {Hkv}, SQ = {SQ}, SKV = {SKV}, D = {D}, DCH = D / 64;
  constexpr int BM = {BM}, BN = {BN}, DEPTH = {depth}, NMB = {nmb}, NKB = {nkb}, B_ = {B};
  constexpr bool CAUSAL = {'true' if causal else 'false'}, PERSISTENT = {'true' if persistent else 'false'};
  constexpr int OFF = SKV - SQ;  // bottom-right aligned causal mask: query i sees keys <= i + OFF
  constexpr float SCALE_LOG2 = {scale_log2!r}f;  // log2(e) / sqrt(D)
  constexpr uint32_t Q_BYTES = {q_bytes}, KV_BYTES = {kv_bytes};
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* q_s = smem;
  uint8_t* k_s = smem + Q_BYTES;
  uint8_t* v_s = k_s + DEPTH * KV_BYTES;
  uint64_t* q_bar = reinterpret_cast<uint64_t*>(smem + {bar_off});
  uint64_t* k_full = q_bar + 1;
  uint64_t* k_empty = k_full + DEPTH;
  uint64_t* v_full = k_empty + DEPTH;
  uint64_t* v_empty = v_full + DEPTH;
  uint64_t* q_empty = v_empty + DEPTH;
{setup(inits, ("q", "k", "v"))}
  if (wg == 0) {{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS};");
    if (threadIdx.x == 0) {{
      TILE_LOOP {{
{prod_pre}
{prod_code}
      TILE_END
    }}
  }} else {{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 {creg};");
    const int g = wg - 1;
    const int w = (threadIdx.x / 32) & 3;
{first_turn}
    TILE_LOOP {{
{branches}
    TILE_END
  }}
}}
"""
    # causal: the longest query blocks (most keys) start first (blockIdx.x, or the slowest tile index)
    decode = ("  const int mb = CAUSAL ? (NMB - 1 - mb_) : mb_;\n"
              "  const int m0 = mb * BM, hkv = hq / (H / HKV);\n  (void)hkv;  // only the producer uses it\n"
              "  int T = NKB;  // key blocks this query block visits\n"
              "  if (CAUSAL) { const int lim = (m0 + BM + OFF + BN - 1) / BN; T = lim < T ? lim : T; }\n")
    if persistent:
        head = ("for (int tile = blockIdx.x, lt = 0, rbase = 0; tile < NMB * H * B_; tile += gridDim.x, ++lt) {\n"
                "  const int mb_ = tile / (H * B_), hq = tile % H, bz = (tile / H) % B_;\n" + decode)
        end = "  rbase += T;  // ring position of the next tile's first key block\n}"
    else:
        head = ("{\n  constexpr int lt = 0, rbase = 0;\n"
                "  const int mb_ = blockIdx.x, hq = blockIdx.y, bz = blockIdx.z;\n  (void)B_;\n" + decode)
        end = "}"
    src = src.replace("TILE_LOOP {", head).replace("TILE_END", end)
    e = 2
    maps = (
        TensorMapSpec("q", dt, (D, H, SQ, B), (D * e, H * D * e, SQ * H * D * e), (64, 1, BM, 1)),
        TensorMapSpec("k", dt, (D, Hkv, SKV, B), (D * e, Hkv * D * e, SKV * Hkv * D * e), (64, 1, BN, 1)),
        TensorMapSpec("v", dt, (D, Hkv, SKV, B), (D * e, Hkv * D * e, SKV * Hkv * D * e), (64, 1, BN, 1)),
    )
    ntiles = nmb * H * B
    grid = (min(ntiles, DEFAULT_SMS), 1, 1) if persistent else (nmb, H, B)
    return KernelSource(source=src, name=name, op="flash_attention", params=dict(p), grid=grid,
                        block=(threads, 1, 1), smem_bytes=smem_bytes, tensor_maps=maps,
                        persistent_tiles=ntiles if persistent else 0,
                        args=("tmap:q", "tmap:k", "tmap:v", "ptr:o"),
                        info={"tiling": dict(t), "consumer_regs": creg, "score_buffers": nbufs,
                              "tc_turns": None if turns is None else turns.handoffs})
