"""Checks every name and number of a KernelPlan before any of it reaches CUDA source.

Only known task names, role names ``producer``/``wg<g>``, and ints in the ranges the emitters support
pass; anything else raises ``CodegenError`` saying what was wrong and what would be accepted.
"""
from __future__ import annotations

import re
from typing import Any

from codegen.plan import PHASES, KernelPlan
from ptsolve.errors import CodegenError

from .common import SMEM_LIMIT, consumer_regs

DTYPES = ("fp16", "bf16")
MAX_DIM = 1 << 30  # TMA coordinates and our int index math are 32-bit
MAX_STAGE = 3

# per op: phase -> (producer tasks, per-group consumer task bases)
TASKS = {
    "gemm": {"pre": ((), ("zero",)), "loop": (("load_a", "load_b"), ("mma",)), "post": ((), ("epilogue", "store"))},
    "flash_attention": {
        "pre": (("load_q",), ("init",)),
        "loop": (("load_k", "load_v"), ("mma_qk", "rowmax", "exp2", "rowsum", "rescale", "mma_pv")),
        "post": ((), ("normalize", "store")),
    },
}
_TASK_RE = re.compile(r"^([a-z_0-9]+)@([0-9]{1,2})$")


def _int(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise CodegenError(f"{name} must be an int in [{lo}, {hi}], got {v!r}")
    return v


def int_params(op: str, p: Any, keys: tuple[str, ...], defaults: dict[str, int] | None = None) -> dict[str, Any]:
    """``p`` as a dict of positive ints for ``keys`` (``defaults`` fill missing ones) plus a supported
    ``dtype``; CodegenError for anything else (not a dict, unknown keys, out-of-range numbers)."""
    if not isinstance(p, dict):
        raise CodegenError(f"plan.params must be a dict, got {type(p).__name__}")
    extra = set(p) - set(keys) - {"dtype"}
    if extra:
        raise CodegenError(f"unknown {op} parameter(s) {sorted(map(str, extra))}; it takes {keys}, dtype")
    dt = p.get("dtype", "fp16")
    if dt not in DTYPES:
        raise CodegenError(f"dtype {dt!r} is not supported by the CUDA generator; use one of {DTYPES}")
    d = defaults or {}
    return {k: _int(f"{op} {k}", p.get(k, d.get(k)), 1, MAX_DIM) for k in keys} | {"dtype": dt}


def validate_params(op: str, p: dict[str, Any]) -> dict[str, Any]:
    """The operator's shape parameters, checked and normalised (ints, bool, dtype string)."""
    if not isinstance(p, dict):
        raise CodegenError(f"plan.params must be a dict, got {type(p).__name__}")
    dt = p.get("dtype", "fp16")
    if dt not in DTYPES:
        raise CodegenError(f"dtype {dt!r} is not supported by the CUDA generator; use one of {DTYPES}")
    if op == "gemm":
        extra = set(p) - {"M", "N", "K", "dtype"}
        if extra:
            raise CodegenError(f"unknown gemm parameter(s) {sorted(extra)}; gemm takes M, N, K, dtype")
        q = {k: _int(f"gemm {k}", p.get(k), 1, MAX_DIM) for k in ("M", "N", "K")}
        if q["K"] % 8 or q["N"] % 8:
            raise CodegenError(f"gemm needs K and N multiples of 8 (16-byte TMA rows); got K={q['K']} N={q['N']}")
        return q | {"dtype": dt}
    keys = ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim")
    extra = set(p) - set(keys) - {"causal", "dtype"}
    if extra:
        raise CodegenError(f"unknown flash_attention parameter(s) {sorted(extra)}; it takes {keys}, causal, dtype")
    q = {k: _int(f"flash_attention {k}", p.get(k), 1, MAX_DIM) for k in keys}
    if q["head_dim"] not in (64, 128):
        raise CodegenError(f"the CUDA generator supports head_dim 64 or 128, got {q['head_dim']}")
    if q["heads"] % q["kv_heads"]:
        raise CodegenError(f"heads={q['heads']} is not a multiple of kv_heads={q['kv_heads']}")
    causal = p.get("causal", False)
    if not isinstance(causal, bool):
        raise CodegenError(f"causal must be a bool, got {causal!r}")
    if causal and q["seq_q"] > q["seq_kv"]:
        raise CodegenError("causal attention needs seq_q <= seq_kv (bottom-right aligned mask)")
    if q["batch"] * q["heads"] * q["seq_q"] * q["head_dim"] >= 1 << 31 or \
            q["batch"] * q["kv_heads"] * q["seq_kv"] * q["head_dim"] >= 1 << 31:
        raise CodegenError("tensor too large for 32-bit element indices in the generated kernel")
    return q | {"causal": causal, "dtype": dt}


def int_tiling(op: str, t: Any, ranges: dict[str, tuple[int, int, int | None]], closed: bool = False
               ) -> dict[str, int]:
    """``t`` read as ints: ``ranges`` maps each key to (lo, hi, default; None = required); ``closed`` rejects any
    other key. CodegenError for anything else (not a dict, a missing or out-of-range value)."""
    if not isinstance(t, dict):
        raise CodegenError("plan.tiling must be a dict")
    extra = set(t) - set(ranges)
    if closed and extra:
        raise CodegenError(f"unknown {op} tiling key(s) {sorted(map(str, extra))}; it takes {', '.join(ranges)}")
    return {k: _int(f"tiling {k}", t.get(k, d), lo, hi) for k, (lo, hi, d) in ranges.items()}


def validate_tiling(op: str, t: dict[str, Any], p: dict[str, Any]) -> dict[str, int]:
    """Tiling checked against what the emitter can generate (shapes of wgmma, TMA boxes, registers, smem)."""
    # optional persistent: gemm 1 (default) = a persistent grid of one CTA per SM looping over tiles, 0 = one CTA
    # per tile; attention 0 (default) = one CTA per (query block, head, batch), 1 = persistent CTAs
    ranges = {"groups": (1, 3, None), "BM": (64, 256, None), "BN": (16, 256, None), "depth": (1, 8, None),
              "persistent": (0, 1, 1 if op == "gemm" else 0)}
    q = int_tiling(op, t, ranges | ({"BK": (64, 64, 64)} if op == "gemm" else {}))
    W, BM, BN, depth, persistent = (q[k] for k in ranges)
    if BM % (64 * W):
        raise CodegenError(f"BM={BM} over {W} warpgroups must give a multiple of 64 rows per warpgroup")
    rows = BM // W
    regs = consumer_regs(W)
    if op == "gemm":
        BK = q["BK"]
        if BN % 8:
            raise CodegenError(f"gemm BN={BN} must be a multiple of 8 (wgmma N)")
        acc = rows // 64 * BN // 2
        if acc > regs - 40:
            raise CodegenError(f"gemm accumulator needs {acc} registers per thread, over the {regs - 40} left of "
                               f"{regs} for {W} consumer warpgroup(s); use a smaller BN or fewer rows per group")
        smem = depth * (BM + BN) * BK * 2
        out = {"BM": BM, "BN": BN, "BK": BK, "depth": depth, "groups": W, "persistent": persistent}
    else:
        if rows != 64:
            raise CodegenError(f"flash_attention needs 64 query rows per consumer warpgroup, got BM={BM} groups={W}")
        if BN % 16:
            raise CodegenError(f"flash_attention BN={BN} must be a multiple of 16")
        if depth > 4:
            raise CodegenError(f"flash_attention depth={depth}: at most 4 K/V stages")
        D = p["head_dim"]
        smem = (BM + 2 * depth * BN) * D * 2
        out = {"BM": BM, "BN": BN, "depth": depth, "groups": W, "persistent": persistent}
    if smem + 2048 > SMEM_LIMIT:
        raise CodegenError(f"{op} tiling {out} needs {smem} B of shared memory, over the {SMEM_LIMIT} B limit")
    return out


def validate_order(plan: KernelPlan, W: int, tasks: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] | None = None,
                   tc_tasks: tuple[str, ...] | None = None) -> dict[str, dict[str, list[tuple[str, int]]]]:
    """phase -> role -> [(task base name, stage)] for known roles/tasks, each task exactly once.
    ``tasks``: phase -> (producer tasks, per-warpgroup tasks), default the op's; ``tc_tasks``: the task
    bases ``tc_order`` may name (default the op's mma tasks)."""
    spec = tasks if tasks is not None else TASKS[plan.op]
    if not isinstance(plan.order, dict) or set(plan.order) - set(PHASES):
        raise CodegenError(f"plan.order must map phases {PHASES} to roles")
    roles = ["producer"] + [f"wg{g}" for g in range(W)]
    out: dict[str, dict[str, list[tuple[str, int]]]] = {}
    for ph in PHASES:
        prod_tasks, cons_tasks = spec[ph]
        got = plan.order.get(ph, {})
        if not isinstance(got, dict):
            raise CodegenError(f"plan.order[{ph!r}] must map roles to task lists")
        bad = set(got) - set(roles)
        if bad:
            raise CodegenError(f"unknown role(s) {sorted(map(repr, bad))} in phase {ph}; roles are {roles}")
        out[ph] = {}
        for role in roles:
            want = set(prod_tasks) if role == "producer" else set(cons_tasks)
            seq = []
            items = got.get(role, [])
            if not isinstance(items, (list, tuple)):
                raise CodegenError(f"{ph}/{role}: expected a list of (task, stage)")
            for item in items:
                if not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[0], str):
                    raise CodegenError(f"{ph}/{role}: entries must be (task name, stage), got {item!r}")
                name, stage = item
                stage = _int(f"stage of {name!r}", stage, 0, MAX_STAGE if ph == "loop" else 0)
                if role == "producer":
                    base = name
                else:
                    m = _TASK_RE.match(name)
                    if not m or int(m.group(2)) != int(role[2:]):
                        raise CodegenError(f"{ph}/{role}: task {name!r} is not one of this warpgroup's tasks "
                                           f"({sorted(f'{t}@{role[2:]}' for t in want)})")
                    base = m.group(1)
                if base not in want:
                    raise CodegenError(f"{ph}/{role}: unknown task {name!r}; expected {sorted(want)}")
                seq.append((base, stage))
            names = [b for b, _ in seq]
            if sorted(names) != sorted(want):
                raise CodegenError(f"{ph}/{role}: tasks {names} must be exactly {sorted(want)}, each once")
            out[ph][role] = seq
    mma = tc_tasks if tc_tasks is not None else {"gemm": ("mma",), "flash_attention": ("mma_qk", "mma_pv")}[plan.op]
    allowed = {f"{b}@{g}" for b in mma for g in range(W)}
    tc = list(plan.tc_order)
    if any(not isinstance(x, str) or x not in allowed for x in tc) or len(set(tc)) != len(tc):
        raise CodegenError(f"tc_order {tc!r} must list distinct tensor-core tasks from {sorted(allowed)}")
    return out


def validate(plan: KernelPlan) -> tuple[dict[str, Any], dict[str, int], dict[str, dict[str, list[tuple[str, int]]]]]:
    """(params, tiling, order) of ``plan``, all checked; raises CodegenError otherwise."""
    if not isinstance(plan, KernelPlan):
        raise CodegenError(f"emit() takes a codegen.plan.KernelPlan, got {type(plan).__name__}")
    if plan.op not in TASKS:
        raise CodegenError(f"the CUDA generator emits {sorted(TASKS)}, not {plan.op!r}")
    p = validate_params(plan.op, plan.params)
    t = validate_tiling(plan.op, plan.tiling, p)
    return p, t, validate_order(plan, t["groups"])
