"""HIP gfx942 backend: every kernel builds with clang-19 (no ROCm), without spills, within 64 KB of LDS, with MFMA
in its ISA and the schedule's structure in its source; small shapes also run in the CPU emulation
(codegen.hip.emulate) against a float32 reference. Compile-verified and emulated, not run on an MI300X."""
from __future__ import annotations

import re

import numpy as np
import pytest

import ptsolve
from codegen import hip
from codegen.hip import emulate
from codegen.kernel_ir import KernelIR
from codegen.lower import lower
from codegen.plan import default_plan, fa3_order_plan
from codegen.sync_sim import loops
from ptsolve.errors import CodegenError

pytestmark = pytest.mark.skipif(hip.clang_path() is None or emulate.host_compiler() is None,
                                reason="clang-19 not installed (bash .ci/hip_toolchain.sh)")

LDS_LIMIT = 64 * 1024
EMU_TIMEOUT = 120.0  # seconds; an emulated kernel that deadlocks fails here instead of hanging CI


def fa_params(**kw: object) -> dict:
    p = {"batch": 1, "heads": 4, "kv_heads": 2, "seq_q": 100, "seq_kv": 130, "head_dim": 64, "causal": True,
         "dtype": "fp16"}
    return p | kw


def check_build(ir: KernelIR) -> tuple[hip.HipSource, hip.HipReport]:
    """Emit and compile ``ir``; assert what CI promises: no spills, LDS within budget and equal to the layout,
    MFMA in the ISA, occupancy for every role's wave on a SIMD, and the schedule visible in the source."""
    src = hip.emit(ir)
    rep = hip.compile(src)
    assert rep.vgpr_spill == 0 and rep.sgpr_spill == 0 and rep.scratch_bytes == 0, rep.summary()
    assert rep.lds_bytes == ir.smem_bytes == src.lds_bytes <= LDS_LIMIT
    assert rep.mfma > 0 and re.search(r"v_mfma_f32_(32x32x8|16x16x16)_(f16|bf16)", rep.isa)
    assert rep.occupancy >= ir.groups + 1  # the producer's and each group's wave share a SIMD
    assert rep.vgpr + rep.agpr <= 512 // (ir.groups + 1)
    s = src.source
    for r in ir.rings:  # ring depth = LDS stages, slot indices and semaphores modulo the depth
        assert f"ring {r.name}: {r.depth} LDS stages" in s
        if r.phase == "loop":
            assert f"{r.name}_full[q_ % {r.depth}]" in s and f"{r.name}_empty[s_]" in s
            assert f"u32* const {r.name}_empty = {r.name}_full + {r.depth};" in s  # one semaphore pair per stage
            for b in r.buffers:  # the slot of iteration q is stage q % depth of the KernelIR's layout
                buf = ir.buffer(b)
                assert f"smem + {buf.offset} + ((q_) % {r.depth}) * {buf.stride}" in s
            for x in r.releases:  # an arrival on the empty semaphore at each release point of the KernelIR
                slot = {"end": "q_", "wait": f"q_ - {x.dist}", "commit": "q_ - 1"}[x.mode]
                assert f"sem_arrive(&{r.name}_empty[({slot}) % {r.depth}], lane)" in s, (r.name, x)
    lo = loops(ir)
    for role in ir.roles:  # each role's loop follows its own (task, stage) order with its stage count
        assert f"// loop: {lo[role.name].stages} stage(s)" in s
        order = ", ".join(f"{n}(stage {st})" for n, st in role.loop)
        assert order in s, (role.name, order)
    assert s.count("// ---- consumer group ") == ir.groups
    assert ("turns_seen += 4u" in s) == ir.turns
    if ir.turns:  # the group holding the tensor-core turn raises its priority (the ping-pong of the schedule)
        assert "s_setprio 1" in rep.isa and "s_setprio 0" in rep.isa
    return src, rep


def bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> fp16 / bf16 bits (uint16), round to nearest even."""
    if dtype == "fp16":
        return x.astype(np.float16).view(np.uint16)
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def unbits(b: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "fp16":
        return b.view(np.float16).astype(np.float32)
    return (b.astype(np.uint32) << 16).view(np.float32)


def run_gemm(src: hip.HipSource, M: int, N: int, K: int, dtype: str, blocks: int | None = None) -> float:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)
    ab, bb = bits(a, dtype), bits(b, dtype)
    c = np.full((M, N), 0x7E00, np.uint16)  # NaN: every element must be written
    out = emulate.run(src, {"a": ab, "b": bb, "c": c}, blocks=blocks, timeout=EMU_TIMEOUT)
    ref = unbits(ab, dtype) @ unbits(bb, dtype).T
    return float(np.max(np.abs(unbits(out["c"], dtype) - ref)) / np.max(np.abs(ref)))


def fa_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    _, sq, h, d = q.shape
    skv, hkv = k.shape[1], k.shape[2]
    kk, vv = np.repeat(k, h // hkv, axis=2), np.repeat(v, h // hkv, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) / np.sqrt(d)
    if causal:
        s = np.where(np.arange(skv)[None, :] > np.arange(sq)[:, None] + (skv - sq), -np.inf, s)
    pr = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", pr / pr.sum(-1, keepdims=True), vv)


def run_fa(src: hip.HipSource, p: dict, blocks: int | None = None) -> float:
    rng = np.random.default_rng(1)
    B, H, HKV, SQ, SKV, D = (p[x] for x in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"))
    q, k, v = (bits(rng.standard_normal(s).astype(np.float32), p["dtype"])
               for s in ((B, SQ, H, D), (B, SKV, HKV, D), (B, SKV, HKV, D)))
    o = np.full((B, SQ, H, D), 0x7E00, np.uint16)
    out = emulate.run(src, {"q": q, "k": k, "v": v, "o": o}, blocks=blocks, timeout=EMU_TIMEOUT)
    ref = fa_reference(*(unbits(x, p["dtype"]) for x in (q, k, v)), p["causal"])
    return float(np.max(np.abs(unbits(out["o"], p["dtype"]) - ref)))


GEMM_PLANS = [
    ({"M": 200, "N": 136, "K": 200, "dtype": "fp16"}, {"BM": 64, "BN": 64, "BK": 64, "depth": 3, "groups": 1}),
    ({"M": 130, "N": 72, "K": 264, "dtype": "bf16"}, {"BM": 128, "BN": 64, "BK": 64, "depth": 2, "groups": 2}),
    ({"M": 64, "N": 256, "K": 128, "dtype": "fp16"}, {"BM": 64, "BN": 128, "BK": 64, "depth": 2, "groups": 1}),
]


@pytest.mark.parametrize("p,t", GEMM_PLANS)
def test_gemm_hand_plans_build_and_match(p: dict, t: dict) -> None:
    src, rep = check_build(lower(default_plan("gemm", p, t), "mi300x"))
    assert src.persistent_tiles > 0 and "tile += num_blocks()" in src.source
    err = run_gemm(src, p["M"], p["N"], p["K"], p["dtype"], blocks=2)  # 2 persistent CTAs walk all tiles
    assert err < (1e-2 if p["dtype"] == "bf16" else 2e-3), err


FA_PLANS = [
    ("d64", fa_params(), {"BM": 64, "BN": 64, "depth": 2, "groups": 1}, "default"),
    ("d64_32x32", fa_params(causal=False), {"BM": 128, "BN": 64, "depth": 2, "groups": 1}, "default"),
    ("d128_bn32", fa_params(head_dim=128), {"BM": 64, "BN": 32, "depth": 2, "groups": 1}, "default"),
    ("overlap_turns", fa_params(), {"BM": 128, "BN": 64, "depth": 2, "groups": 2}, "overlap"),
    ("fa3_order", fa_params(), {"BM": 128, "BN": 32, "depth": 2, "groups": 2}, "fa3"),
    ("bf16_3groups", fa_params(dtype="bf16", seq_q=130), {"BM": 192, "BN": 32, "depth": 2, "groups": 3}, "overlap"),
]


@pytest.mark.parametrize("name,p,t,kind", FA_PLANS, ids=[x[0] for x in FA_PLANS])
def test_fa_hand_plans_build_and_match(name: str, p: dict, t: dict, kind: str) -> None:
    plan = fa3_order_plan(p, t) if kind == "fa3" else default_plan("flash_attention", p, t, overlap=kind == "overlap")
    ir = lower(plan, "mi300x")
    if kind != "default":
        assert ir.turns and len({x.split("@")[1] for x in ir.tc_order}) == t["groups"]
    src, _ = check_build(ir)
    if kind == "overlap":  # two score buffers: the loop is unrolled by two and picks them by parity
        assert ir.copies["s@0"] == 2 and "sacc1" in src.source and "const int j1 = j + 1;" in src.source
    err = run_fa(src, p)
    assert err < (3e-2 if p["dtype"] == "bf16" else 4e-3), err


def test_persistent_attention_matches() -> None:
    p = fa_params(seq_q=130, seq_kv=130)
    src, _ = check_build(lower(default_plan("flash_attention", p, {"BM": 64, "BN": 64, "depth": 2, "groups": 1}),
                               "mi300x", persistent=True))
    assert src.persistent_tiles == 12
    assert run_fa(src, p, blocks=5) < 4e-3  # five CTAs, tiles of unequal trip counts, the rings run on


@pytest.mark.parametrize("solver", ["greedy", "cpsat"])
def test_optimized_schedules_build(solver: str) -> None:
    """What `ptsolve optimize ... --hw mi300x` returns becomes a gfx942 code object (the issue's example shapes)."""
    cases = [ptsolve.ops.flash_attention(batch=1, heads=8, kv_heads=2, seq=2048, head_dim=64),
             ptsolve.ops.flash_attention(batch=2, heads=16, kv_heads=4, seq=1024, head_dim=128, causal=True),
             ptsolve.ops.gemm(M=4096, N=4096, K=4096, dtype="bf16")]
    for op in cases:
        r = ptsolve.optimize(op, hw="mi300x", solver=solver, time_limit=20)
        ir = lower(r.program, "mi300x")
        assert ir.smem_bytes <= LDS_LIMIT
        check_build(ir)


def test_optimized_schedule_runs_in_emulation() -> None:
    """A CP-SAT schedule for MI300X (stages, its own orders), emitted for a small shape of the same tiling."""
    import dataclasses

    from codegen.plan import plan_from_program
    r = ptsolve.optimize(ptsolve.ops.flash_attention(batch=1, heads=8, kv_heads=2, seq=2048, head_dim=64),
                         hw="mi300x", solver="cpsat", time_limit=20)
    small = fa_params(heads=8, seq_q=150, seq_kv=150, causal=False)
    plan = dataclasses.replace(plan_from_program(r.program, "mi300x"), params=small)
    src, _ = check_build(lower(plan, "mi300x"))
    assert run_fa(src, small) < 4e-3


def test_emulation_catches_a_layout_bug() -> None:
    """The emulated check can fail: a producer that writes each tile row into its neighbour's place. (Reading
    the wrong K chunk of both operands would not do: the same permutation of K on both sides cancels.)"""
    import dataclasses

    p, t = GEMM_PLANS[0]
    src = hip.emit(default_plan("gemm", p, t), "mi300x")
    write = "*reinterpret_cast<u32x4*>(base + lds_off(row, col, row_bytes, mask)) = v;"
    assert write in src.source
    bad = dataclasses.replace(src, source=src.source.replace(write, write.replace("(row,", "(row ^ 1,")))
    assert run_gemm(bad, p["M"], p["N"], p["K"], p["dtype"], blocks=1) > 0.1


def test_emit_is_deterministic_and_sanitised() -> None:
    p, t = GEMM_PLANS[0]
    a, b = (hip.emit(default_plan("gemm", p, t), "mi300x") for _ in range(2))
    assert a.source == b.source and a.name == b.name
    assert re.fullmatch(r"pts_hip_gemm_fp16_[a-z0-9_]+", a.name)


def test_errors_name_the_fix() -> None:
    p = fa_params()
    t = {"BM": 64, "BN": 64, "depth": 2, "groups": 1}
    with pytest.raises(CodegenError, match="lower it with hw='mi300x'"):
        hip.emit(lower(default_plan("flash_attention", p, t), "h100"))
    with pytest.raises(CodegenError, match="65536 B"):  # Q 16 KB + 3 stages of 16 KB K and V: over 64 KB
        hip.emit(default_plan("flash_attention", fa_params(head_dim=128), {**t, "depth": 3}), "mi300x")
    op = ptsolve.ops.mamba2_chunk_scan(1, 512, 2, 64, 128, 256)
    scan = default_plan(op.op, op.params, op.tilings()[0])
    with pytest.raises(CodegenError, match="emits \\['flash_attention', 'gemm'\\]"):
        hip.emit(scan, "mi300x")
    pp = {"BM": 64, "BN": 64, "BK": 64, "depth": 2, "groups": 1, "pingpong": 1}
    with pytest.raises(CodegenError, match="use pingpong=0"):  # the search's compile check drops such tilings
        hip.emit(default_plan("gemm", {"M": 512, "N": 512, "K": 512, "dtype": "fp16"}, pp), "mi300x")


def test_cli_writes_code_object(tmp_path) -> None:
    from codegen.hip.__main__ import main
    plan = default_plan("gemm", *GEMM_PLANS[0])
    f = tmp_path / "plan.json"
    f.write_text(plan.to_json())
    assert main([str(f), "--out", str(tmp_path / "out")]) == 0
    objs = list((tmp_path / "out").glob("*.hsaco"))
    assert len(objs) == 1 and objs[0].read_bytes()[:4] == b"\x7fELF"
