"""The hand plans and the reduced-shape check of a GPU round: what ``codegen.tune_runner`` checks every candidate with
(``check``, ``reduced``) and the hand-written plans measurements compare against (``_hand``, ``FIXED``, ``HAND``).
The round itself (prepare, compile, run, its table) is ``python -m bench round`` (bench/round/round.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any

# Mamba2 hand plans (tiling, overlapped order): the fastest of our sweeps on the H200 (chunk_scan: two consumer
# warpgroups, BK 64, textbook order; chunk_state: two CTAs per SM, the mma one stage behind the scale)
HAND = {"mamba2_chunk_scan": ({"BM": 128, "BK": 64, "depth": 2, "groups": 2}, False),
        "mamba2_chunk_state": ({"BM": 128, "BK": 64, "depth": 2, "groups": 2, "ctas": 2}, True)}


FIXED = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}  # FA3's tiling, for the same-tiling comparison


def _small(p: dict[str, Any]) -> dict[str, Any]:
    """The same schedule on a shape small enough for a float32 reference: batch 1, the GQA ratio kept (Mamba2:
    8 heads, and a seq that leaves the last chunk ragged)."""
    if "kv_heads" not in p:
        return p | {"batch": 1, "heads": 8 * p.get("groups", 1), "seq": min(p["seq"], 2048) - 24}
    g = p["heads"] // p["kv_heads"]
    s = min(p["seq_q"], 2048)
    return p | {"batch": 1, "heads": 2 * g, "kv_heads": 2, "seq_q": s, "seq_kv": s}


def _hand(op: str, params: dict[str, Any]) -> Any:
    from codegen.plan import default_plan, fa3_order_plan
    if op == "flash_attention":
        return fa3_order_plan(params, FIXED | {"persistent": 1})
    if op == "gemm":  # the 4-stage 128x256 tiling of codegen.bench (0.96-1.01x cuBLAS, results/codegen_h200.md)
        return default_plan(op, params, {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2})
    t, ov = HAND[op]
    if op == "mamba2_chunk_state" and t["BM"] > params["d_state"]:  # d_state 64: one 64-column block per warpgroup
        t = t | {"BM": params["d_state"], "groups": 1}
    return default_plan(op, params, t, ov)


def reduced(plan: Any) -> Any:
    """``plan`` on the reduced shape ``check`` runs it at (GEMM 1000 x 768 x 1000; the others see _small)."""
    if plan.op == "gemm":
        return dataclasses.replace(plan, params=plan.params | {"M": 1000, "N": 768, "K": 1000})
    return dataclasses.replace(plan, params=_small(dict(plan.params)))


def check(op: str, label: str, plan: Any) -> dict[str, Any]:
    """Check ``plan``'s kernel on a reduced shape (``reduced``): the same plan, smaller sizes, a float32 / float64
    reference, the output poisoned with NaN."""
    from codegen.bench import TOL, check_fa, check_gemm
    small = reduced(plan)
    if op == "flash_attention":
        return check_fa(small.params, plan.tiling, small, trials=1, label=label)
    if op == "gemm":
        return check_gemm(1000, 768, 1000, plan.params["dtype"], plan.tiling, small, trials=1)
    from codegen.mamba import check as check_mamba
    err = check_mamba(small, trials=1)
    return {"rel_err": err, "ok": bool(err <= TOL)}
