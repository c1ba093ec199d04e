"""GEMM emitter: C[M,N] = A[M,K] · B[N,K]^T ("TN": A row-major M×K, B row-major N×K, both K-contiguous),
fp16/bf16 in, fp32 accumulate, C row-major M×N in the input dtype.

Persistent kernel: one CTA per SM walks the BM×BN tiles of C (tile = blockIdx.x + i·gridDim.x, grouped
rasterisation of 8 M-tiles for L2 reuse of B). Warpgroup 0 is the producer (one thread issues TMA loads
into a ``depth``-stage ring of 128B-swizzled A/B tiles; the ring runs on across tiles, so the next tile's
loads overlap this tile's epilogue); warpgroups 1..W are consumers, each owning BM/W rows and issuing
``wgmma.mma_async`` from shared memory.
"""
from __future__ import annotations

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
    wgmma_ss,
)
from .schedule import LoopOrder, check_deps, emit_loop, wait_depths

GROUP_M = 8  # M-tiles per rasterisation group: consecutive CTAs share B tiles in L2
DEFAULT_SMS = 132  # H100/H200 SXM; the runtime re-sizes the persistent grid to the device's SM count


def _producer_body(name: str, it: str, parity: int | None, waits: Any) -> str:
    # Each load task waits for its slot to be empty, announces its bytes on the slot's full barrier, issues TMA.
    tile, tm, row0 = ("A", "tm_a", "m0") if name == "load_a" else ("B", "tm_b", "n0")
    # ring position q_ = tiles done * KT + k-step: slots and phases continue across tiles
    return (f"{{ const int it_ = {it}; const int q_ = rbase + it_; const int s_ = q_ % DEPTH;\n"
            f"  mbar_wait(&empty_bar[s_], ((q_ / DEPTH) & 1) ^ 1);\n"
            f"  mbar_expect_tx(&full_bar[s_], {tile}_BYTES);\n"
            f"  tma_load_2d(smem + s_ * STAGE_BYTES + {tile}_OFF, &{tm}, &full_bar[s_], it_ * 64, {row0}); }}")


def _consumer_body(mt: int, bn: int, dt: str):
    t = PTXTYPE[dt]

    def body(name: str, it: str, parity: int | None, waits: Any) -> str:
        assert name == "mma"
        lines = [f"{{ const int it_ = {it}; const int q_ = rbase + it_; const int s_ = q_ % DEPTH;",
                 "  mbar_wait(&full_bar[s_], (q_ / DEPTH) & 1);",
                 "  const uint32_t sa = smem_u32(smem + s_ * STAGE_BYTES + A_OFF) + ROW0 * 128;",
                 "  const uint32_t sb = smem_u32(smem + s_ * STAGE_BYTES + B_OFF);",
                 "  wg_fence();"]
        for kk in range(4):
            for m in range(mt):
                lines.append(f"  wgmma_ss_n{bn}_{t}(acc[{m}], make_desc(sa + {m * 64 * 128 + kk * 32}, 16, 1024), "
                             f"make_desc(sb + {kk * 32}, 16, 1024), 1);")
        # One group per k-step in this role: wait<1> leaves only this step's group in flight, so the
        # previous step's slot is free. (The tile's last slot is released by the epilogue's wait<0>.)
        lines += ["  wg_commit();",
                  "  wg_wait<1>();",
                  "  if (it_ > 0 && lane == 0) mbar_arrive(&empty_bar[(q_ + DEPTH - 1) % DEPTH]); }"]
        return "\n".join(lines)
    return body


def _post(name: str, mt: int, bn: int, dt: str) -> str:
    if name == "zero":
        return ("#pragma unroll\nfor (int m = 0; m < MT; ++m) {\n#pragma unroll\n"
                "  for (int i = 0; i < BN / 2; ++i) acc[m][i] = 0.f;\n}")
    if name == "epilogue":
        # fp32 accumulators -> packed pairs of the output type (registers reused as acc dies)
        return ("wg_wait<0>();\nif (lane == 0) mbar_arrive(&empty_bar[(rbase + KT - 1) % DEPTH]);  // last slot\n"
                "#pragma unroll\nfor (int m = 0; m < MT; ++m) fence_regs(acc[m]);\n"
                "#pragma unroll\nfor (int m = 0; m < MT; ++m) {\n#pragma unroll\n"
                f"  for (int i = 0; i < BN / 4; ++i) cpk[m][i] = {PACK2[dt]}(acc[m][2 * i], acc[m][2 * i + 1]);\n}}")
    # store: thread holds rows r, r+8 of each 16-row slice, columns 8j + 2*(lane%4) (+1)
    return ("#pragma unroll\nfor (int m = 0; m < MT; ++m) {\n#pragma unroll\n  for (int h = 0; h < 2; ++h) {\n"
            "    const int row = m0 + ROW0 + m * 64 + w * 16 + (lane >> 2) + 8 * h;\n"
            "    if (row < M) {\n      uint32_t* crow = reinterpret_cast<uint32_t*>(c + (size_t)row * N);\n"
            "#pragma unroll\n      for (int jj = 0; jj < BN / 8; ++jj) {\n"
            "        const int col = n0 + jj * 8 + 2 * (lane & 3);\n"
            "        if (col < N) crow[col >> 1] = cpk[m][jj * 2 + h];\n      }\n    }\n  }\n}")


def emit_gemm(p: dict[str, Any], t: dict[str, int], order: dict[str, dict[str, list[tuple[str, int]]]],
              plan_id: str) -> KernelSource:
    M, N, K, dt = p["M"], p["N"], p["K"], p["dtype"]
    BM, BN, depth, W = t["BM"], t["BN"], t["depth"], t["groups"]
    rows = BM // W
    mt = rows // 64
    kt = -(-K // 64)
    tm, tn = -(-M // BM), -(-N // BN)
    name = f"pts_gemm_{dt}_m{M}_n{N}_k{K}_bm{BM}_bn{BN}_d{depth}_g{W}_{plan_id}"
    threads = 128 * (W + 1)
    creg = consumer_regs(W)

    prod = LoopOrder(tuple(order["loop"]["producer"]))
    prod_code = emit_loop(prod, kt, _producer_body, 1, {})
    roles = []
    for g in range(W):
        lo = LoopOrder(tuple(order["loop"][f"wg{g}"]))
        check_deps(f"wg{g}", lo, {"mma": [("mma", -1)]})
        steady = wait_depths(lo, {"mma"}, {})
        code = [f"// ---- consumer warpgroup {g}: rows {g * rows}..{(g + 1) * rows - 1} of the tile",
                f"constexpr int ROW0 = {g * rows};",
                "float acc[MT][BN / 2];", "uint32_t cpk[MT][BN / 4];"]
        code += [f"// pre: {n}\n{_post(n, mt, BN, dt)}" for n, _ in order["pre"][f"wg{g}"]]
        code.append("#pragma unroll\nfor (int m = 0; m < MT; ++m) fence_regs(acc[m]);")
        code.append(emit_loop(lo, kt, _consumer_body(mt, BN, dt), 1, steady, {"mma"}))
        code += [f"// post: {n}\n{_post(n, mt, BN, dt)}" for n, _ in order["post"][f"wg{g}"]]
        roles.append("\n".join(code))
    branches = " else ".join(f"if (g == {g}) {{\n{r}\n}}" for g, r in enumerate(roles))
    stage_bytes = (BM + BN) * 128
    ring = depth * stage_bytes
    smem_bytes = ring + 2 * depth * 8 + 1024  # + barriers + alignment slack
    tile_loop = (  # persistent: this CTA's tiles; grouped rasterisation (GROUP_M M-tiles sweep N together)
        "for (int tile = blockIdx.x, lt = 0; tile < TM * TN; tile += gridDim.x, ++lt) {\n"
        "  const int per_group = GROUP_M * TN;\n"
        "  const int first_m = (tile / per_group) * GROUP_M;\n"
        "  const int gsz = (TM - first_m) < GROUP_M ? (TM - first_m) : GROUP_M;\n"
        "  const int m0 = (first_m + (tile % per_group) % gsz) * BM;\n"
        "  const int n0 = ((tile % per_group) / gsz) * BN;\n"
        "  const int rbase = lt * KT;  // ring position of this tile's first k-step\n")
    inits = f"    for (int s = 0; s < DEPTH; ++s) {{ mbar_init(&full_bar[s], 2); mbar_init(&empty_bar[s], 4 * {W}); }}"
    src = f"""// generated by ptsolve codegen.cuda (gemm, plan {plan_id}); C[M,N] = A[M,K] * B[N,K]^T
{PRELUDE}
{wgmma_ss(BN, dt)}
{PRELUDE_END}
extern "C" __global__ void __launch_bounds__({threads}, 1)
{name}(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
       {CTYPE[dt]}* __restrict__ c) {{
  using namespace pts;
  constexpr int M = {M}, N = {N}, BM = {BM}, BN = {BN}, DEPTH = {depth}, MT = {mt};
  constexpr int TM = {tm}, TN = {tn}, GROUP_M = {GROUP_M}, KT = {kt};
  constexpr uint32_t A_OFF = 0, A_BYTES = BM * 128, B_OFF = A_BYTES, B_BYTES = BN * 128;
  constexpr uint32_t STAGE_BYTES = A_BYTES + B_BYTES;
  extern __shared__ uint8_t smem_raw[];
  // 128B-swizzled TMA tiles need 1024-byte alignment; dynamic smem only guarantees 16
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + DEPTH * STAGE_BYTES);
  uint64_t* empty_bar = full_bar + DEPTH;
{setup(inits, ("a", "b"))}
  if (wg == 0) {{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS};");
    if (threadIdx.x == 0) {{
      TILE_LOOP {{
{prod_code}
      }}
    }}
  }} else {{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 {creg};");
    const int g = wg - 1;
    const int w = (threadIdx.x / 32) & 3;
    TILE_LOOP {{
{branches}
    }}
  }}
}}
"""
    src = src.replace("TILE_LOOP {", tile_loop)
    maps = (TensorMapSpec("a", dt, (K, M), (K * 2,), (64, BM)), TensorMapSpec("b", dt, (K, N), (K * 2,), (64, BN)))
    grid_x = min(tm * tn, DEFAULT_SMS) if t["persistent"] else tm * tn
    return KernelSource(source=src, name=name, op="gemm", params=dict(p), grid=(grid_x, 1, 1), block=(threads, 1, 1),
                        persistent_tiles=tm * tn if t["persistent"] else 0,
                        smem_bytes=smem_bytes, tensor_maps=maps, args=("tmap:a", "tmap:b", "ptr:c"),
                        info={"tiling": dict(t), "consumer_regs": creg, "trips": kt,
                              "tc_turns": None})  # cooperative: both groups consume every stage; tc_order unused
