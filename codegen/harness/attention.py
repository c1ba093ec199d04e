"""Attention's harness (FlashAttention forward and split-KV decode): the exact-shape launch of a plan's kernel
(``run_attention``, ``run_decode``), the float32 reference and check, random inputs, the reduced shape a candidate
is checked at and the hand-written FA3-order plan measurements compare against."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..plan import KernelPlan, default_plan, fa3_order_plan
from ..runtime import emit_cached, load
from .common import TOL, OpHarness, need, register, rel_err, stream, torch_dtype

FA_TILING = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}
FIXED = dict(FA_TILING)  # FA3's tiling, for the same-tiling comparison (the hand plan's)


def run_attention(q: Any, k: Any, v: Any, plan: Any, out: Any = None) -> Any:
    """FlashAttention forward, or split-KV attention for a flash_decode plan: q [B,Sq,H,D], k/v [B,Skv,Hkv,D] →
    o [B,Sq,H,D], scale 1/sqrt(D), causal (bottom-right aligned) when the plan's operator is."""
    import torch

    ks = emit_cached(plan)
    p = ks.params
    B, H, Hkv, D = p["batch"], p["heads"], p["kv_heads"], p["head_dim"]
    need(q, "q", (B, p["seq_q"], H, D), p["dtype"])
    need(k, "k", (B, p["seq_kv"], Hkv, D), p["dtype"])
    need(v, "v", (B, p["seq_kv"], Hkv, D), p["dtype"])
    o = out if out is not None else torch.empty_like(q)
    need(o, "out", tuple(q.shape), p["dtype"])
    load(ks).launch({"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": o.data_ptr()}, stream())
    return o


# split-KV attention (ptsolve.ops.decode) launches like FlashAttention: the plan's operator picks the kernel, and its
# scratch (ws / lse / cnt, info["workspace"]) is passed by launch, one set per kernel and device, so launches of one
# kernel must not overlap on different streams
run_decode = run_attention


def keep_mask(sq: int, skv: int, causal: bool, window: tuple[int, int], device: Any) -> Any:
    """FlashAttention-3's mask as a bool [sq, skv] tensor: query i sees keys i + off - left .. i + off + right
    (off = skv - sq; causal: right 0; -1 unbounded), the reference of the softcap / window tests and study."""
    import torch
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(skv, device=device)[None, :]
    off, (left, right) = skv - sq, window
    keep = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if causal:
        keep &= j <= i + off
    if right >= 0:
        keep &= j <= i + off + right
    if left >= 0:
        keep &= j >= i + off - left
    return keep


def attention_ref(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """float32 reference, q [B,Sq,H,D], k/v [B,Skv,Hkv,D]; causal bottom-right aligned."""
    import torch
    B, Sq, H, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    s = (qf @ kf.transpose(-1, -2)) / math.sqrt(D)
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Skv, device=q.device)[None, :]
        s = s.masked_fill(j > i + (Skv - Sq), float("-inf"))
    return (torch.softmax(s, dim=-1) @ vf).transpose(1, 2)


def check_fa(p: dict[str, Any], tiling: dict[str, int], plan: KernelPlan | None = None, trials: int = 2,
             label: str = "default") -> dict[str, Any]:
    """Worst relative error of the generated attention kernel over ``trials`` fresh inputs (``label``: the order's
    name in the result)."""
    import torch

    plan = plan or default_plan("flash_attention", p, tiling)
    tdt = torch_dtype(p["dtype"])
    B, H, Hkv, D = p["batch"], p["heads"], p["kv_heads"], p["head_dim"]
    worst = 0.0
    for _ in range(trials):
        q = torch.randn(B, p["seq_q"], H, D, device="cuda", dtype=tdt)
        k = torch.randn(B, p["seq_kv"], Hkv, D, device="cuda", dtype=tdt)
        v = torch.randn(B, p["seq_kv"], Hkv, D, device="cuda", dtype=tdt)
        o = torch.full_like(q, float("nan"))
        run_attention(q, k, v, plan, out=o)
        torch.cuda.synchronize()
        e = rel_err(o, attention_ref(q, k, v, p["causal"]))
        worst = e if math.isnan(e) else max(worst, e)
        if math.isnan(worst):
            break
    return {"op": "flash_attention", **p, "tiling": tiling, "order": label, "rel_err": worst,
            "ok": (not math.isnan(worst)) and worst <= TOL}


def _random_args(p: dict[str, Any], seed: int) -> dict[str, Any]:
    import torch

    torch.manual_seed(seed)
    t = torch_dtype(p["dtype"])
    B, D = p["batch"], p["head_dim"]
    q = torch.randn(B, p["seq_q"], p["heads"], D, device="cuda", dtype=t)
    return {"q": q, "k": torch.randn(B, p["seq_kv"], p["kv_heads"], D, device="cuda", dtype=t),
            "v": torch.randn(B, p["seq_kv"], p["kv_heads"], D, device="cuda", dtype=t),
            "o": torch.full_like(q, float("nan"))}  # flash_decode's scratch: launch passes it (workspace_ptrs)


def _reduced(p: dict[str, Any]) -> dict[str, Any]:
    """The same schedule on a shape small enough for a float32 reference: batch 1, the GQA ratio kept."""
    g = p["heads"] // p["kv_heads"]
    s = min(p["seq_q"], 2048)
    return p | {"batch": 1, "heads": 2 * g, "kv_heads": 2, "seq_q": s, "seq_kv": s}


def _check(label: str, plan: Any) -> dict[str, Any]:
    small = dataclasses.replace(plan, params=_reduced(dict(plan.params)))
    return check_fa(small.params, plan.tiling, small, trials=1, label=label)


def _hand(p: dict[str, Any]) -> Any:
    return fa3_order_plan(p, FIXED | {"persistent": 1})


register("flash_attention", OpHarness(random_args=_random_args, check=_check, reduced=_reduced, hand=_hand))
register("flash_decode", OpHarness(random_args=_random_args, reduced=_reduced))
