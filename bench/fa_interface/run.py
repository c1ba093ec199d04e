"""GPU: every (feature, head_dim) case through ptsolve.torch and FlashAttention-4, checked and timed; JSON + markdown.

``python -m bench fa_interface run --out F.json [--only softcap,window] [--rounds 15] [--budget-s 470]``
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

HEAD_DIMS = (64, 96, 128, 192, 256)
# feature -> (causal, softcap, window, varlen with seqused, return the log-sum-exp); Gemma-2's cap, Mistral's window
# of a quarter of the keys, a band of 512 each way, and a varlen batch whose used rows are fewer than its slots
FEATURES = {
    "plain": (True, 0.0, (-1, -1), False, False),
    "lse": (True, 0.0, (-1, -1), False, True),
    "softcap": (True, 30.0, (-1, -1), False, False),
    "window": (True, 0.0, (1024, 0), False, False),
    "window+softcap": (True, 30.0, (1024, 0), False, False),
    "band": (False, 0.0, (512, 512), False, False),
    "seqused": (True, 0.0, (-1, -1), True, False),
}
B, S, H, HKV = 2, 4096, 16, 8
LENS, USED = [4096, 3000, 1500, 2000], [4000, 3000, 700, 1999]  # the varlen batch: slots, used rows


def cases() -> list[dict[str, Any]]:
    return [{"feature": f, "head_dim": d} for f in FEATURES for d in HEAD_DIMS]


def reference(q: Any, k: Any, v: Any, causal: bool, softcap: float, window: tuple[int, int], dtype: Any) -> Any:
    """softmax(softcap(q kᵀ / sqrt(D)), masked) v in ``dtype`` (q [B, Sq, H, D]), head by head (memory)."""
    import torch

    from codegen.harness.attention import keep_mask
    outs = []
    rep = q.shape[2] // k.shape[2]
    keep = keep_mask(q.shape[1], k.shape[1], causal, window, q.device)
    for h in range(q.shape[2]):
        qh, kh, vh = q[:, :, h].to(dtype), k[:, :, h // rep].to(dtype), v[:, :, h // rep].to(dtype)
        s = (qh @ kh.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        p = torch.softmax(s.float().masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0).to(dtype)
        outs.append(p @ vh)
    return torch.stack(outs, 2)


def _inputs(d: int, varlen: bool) -> dict[str, Any]:
    import torch
    g = torch.Generator(device="cuda").manual_seed(d)
    n, nk = (sum(LENS), sum(LENS)) if varlen else (B * S, B * S)
    mk = lambda rows, h: torch.randn(rows, h, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    x = {"q": mk(n, H), "k": mk(nk, HKV), "v": mk(nk, HKV)}
    if not varlen:
        return {n_: t.view(B, S, t.shape[1], d) for n_, t in x.items()}
    cu = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return x | {"cu": cu, "used": torch.tensor(USED, dtype=torch.int32, device="cuda")}


def _refs(x: dict[str, Any], causal: bool, softcap: float, window: tuple[int, int], varlen: bool) -> tuple[Any, Any]:
    """(fp32 reference, bf16 PyTorch) in the user call's layout; varlen: the used rows of each sequence, packed."""
    import torch
    if not varlen:
        return tuple(reference(x["q"], x["k"], x["v"], causal, softcap, window, dt) for dt in (torch.float32,
                                                                                             torch.bfloat16))
    hi, lo = [], []
    for b, u in enumerate(USED):
        s = slice(int(x["cu"][b]), int(x["cu"][b]) + u)
        for dt, acc in ((torch.float32, hi), (torch.bfloat16, lo)):
            acc.append(reference(x["q"][s][None], x["k"][s][None], x["v"][s][None], causal, softcap, window, dt)[0])
    return torch.cat(hi), torch.cat(lo)


def _used_rows(out: Any, x: dict[str, Any]) -> Any:
    import torch
    return torch.cat([out[int(x["cu"][b]): int(x["cu"][b]) + u] for b, u in enumerate(USED)])


def candidates(case: dict[str, Any], x: dict[str, Any]) -> dict[str, Any]:
    """The user call and FlashAttention-4's (where it takes the case), each (call() -> out in the check's layout,
    note), absent as (None, why)."""
    import ptsolve.torch as pt
    from baselines import fa4
    causal, softcap, window, varlen, lse = FEATURES[case["feature"]]
    feat = {"softcap": softcap, "window_size": window}
    if varlen:
        mx = max(LENS)
        user = lambda: _used_rows(pt.flash_attention_varlen(  # noqa: E731
            x["q"], x["k"], x["v"], x["cu"], x["cu"], mx, mx, causal=causal, seqused_q=x["used"], seqused_k=x["used"],
            **feat), x)
    else:
        user = lambda: (lambda r: r[0] if lse else r)(pt.flash_attention(  # noqa: E731
            x["q"], x["k"], x["v"], causal=causal, return_lse=lse, **feat))
    mod, why = fa4.load()
    fn = None if mod is None else getattr(mod, "flash_attn_varlen_func" if varlen else "flash_attn_func", None)
    want = {"causal": causal} | ({"softcap": softcap} if softcap else {}) | \
        ({"window_size": window} if window != (-1, -1) else {}) | ({"return_lse": True} if lse else {})
    if varlen:
        want |= {"cu_seqlens_q": x["cu"], "cu_seqlens_k": x["cu"], "max_seqlen_q": max(LENS),
                 "max_seqlen_k": max(LENS), "seqused_q": x["used"], "seqused_k": x["used"]}
    kw = None if fn is None else fa4.kwargs_for(fn, want, tuple(want))
    if kw is None:
        peer = (None, why or f"FlashAttention-4 takes no {sorted(want)}")
    else:
        call = (lambda: _used_rows(fa4._output(fn(x["q"], x["k"], x["v"], **kw)), x)) if varlen else \
            (lambda: fa4._output(fn(x["q"], x["k"], x["v"], **kw)))
        shape = (sum(USED), H, case["head_dim"]) if varlen else tuple(x["q"].shape)
        peer = fa4.tried(call, shape, "flash_attn.cute")
    return {"ptsolve": (user, ""), "fa4": peer}


def run_case(case: dict[str, Any], rounds: int) -> dict[str, Any]:
    import torch

    from bench.peers.run import first_use, max_err, timed, within_rule
    causal, softcap, window, varlen, _ = FEATURES[case["feature"]]
    x = _inputs(case["head_dim"], varlen)
    hi, lo = _refs(x, causal, softcap, window, varlen)
    base, atol = max_err(lo, hi), 2 * float((hi + 0.3 - 0.3 - hi).abs().max())
    makers = {n: (lambda c=c: ((lambda i: c[0]()) if c[0] else None, c[1])) for n, c in candidates(case, x).items()}
    calls, absent, first = first_use(makers, 1)
    errs = {}
    for n, call in calls.items():
        e = max_err(call(0), hi)
        errs[n] = e if math.isfinite(e) else None
    torch.cuda.synchronize()
    us, graphs = timed(calls, 1, rounds, 1.0)
    ok = {n: e is not None and within_rule(e, base, atol) for n, e in errs.items()}
    return case | {"ptsolve_us": us.get("ptsolve"), "fa4_us": us.get("fa4"), "errs": errs, "ref_err": base,
                   "atol": atol, "within_rule": ok, "ok": bool(ok.get("ptsolve")), "absent": absent,
                   "first_call_s": first, "graphs": graphs}


def main(argv: list[str] | None = None) -> int:
    from bench.fa_interface.report import report
    from bench.peers.run import meta
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench fa_interface run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON; the markdown goes beside it (.md)")
    ap.add_argument("--only", default="", help="features whose name is one of these, comma-separated")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--budget-s", type=float, default=0.0, help="start no case after this many seconds (0: none)")
    a = ap.parse_args(argv)
    import os
    cmd = os.environ.get("PEERS_COMMAND") or "python -m bench fa_interface run " + " ".join(argv)
    res: dict[str, Any] = {**meta(argv), "command": cmd, "shape": {"batch": B, "seq": S, "heads": H, "kv_heads": HKV,
                                                   "dtype": "bf16", "varlen_lens": LENS, "varlen_used": USED},
                           "rows": [], "not_run": []}
    t0 = time.time()
    only = {x for x in a.only.split(",") if x}
    for case in cases():
        if only and case["feature"] not in only:
            continue
        if a.budget_s and time.time() - t0 > a.budget_s:
            res["not_run"].append(case)
            continue
        try:
            rec = run_case(case, a.rounds)
        except Exception as e:  # noqa: BLE001  (one case's failure is recorded; the others still run)
            rec = case | {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        res["rows"].append(rec)
        print(json.dumps(rec)[:400], flush=True)
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    a.out.with_suffix(".md").write_text(report(res))
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
