"""Split-KV attention (ptsolve.ops.decode) on the H200: correctness and timing next to PyTorch SDPA.

Three steps, so that the GPU machine (no ortools) only loads plans and cubins::

    # CPU: solve every shape (CP-SAT, compiler in the loop), the best split-KV schedule and the best with
    # splits=1, plus the plain flash_attention kernel for the prefill shapes; compile the cubins into the cache
    PTSOLVE_CACHE_DIR=<stage>/.cache python -m bench decode prepare --out results/decode_h200/plans.json
    # GPU: correctness (float32 reference, FlashAttention's rule) and timing (CUDA graphs, rotating inputs)
    python -m bench decode run --plans results/decode_h200/plans.json --out $OUT/decode.json
    # CPU: the markdown report
    python -m bench decode report --runs results/decode_h200/decode.json --out results/decode_h200.md

Shapes: decode (batch 1/16/64, seq_q 1 and 4, seq_kv 1000/4097/32768) for Llama-3-8B (32/8 heads, d128),
Qwen2.5-0.5B (14/2, d64), Falcon-7B (71/1, d64); seq_q 4 is causal (bottom-right: speculative decoding);
and batch-1 causal prefill with 8 heads, d128 (seq 1000-4097), where the plain kernel leaves SMs idle.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

REF_CHUNK = 1 << 29  # score elements of one reference chunk (2 GiB in float32)
MODELS = {"llama3-8b": (32, 8, 128), "qwen2.5-0.5b": (14, 2, 64), "falcon-7b": (71, 1, 64)}


def shapes(quick: bool = False) -> list[dict[str, Any]]:
    out = []
    for model, (h, kv, d) in MODELS.items():
        for b in (1, 16, 64):
            for sq in (1, 4):
                for skv in (1000, 4097, 32768):
                    out.append({"name": f"dec_{model}_b{b}_q{sq}_k{skv}", "kind": "decode",
                                "params": {"batch": b, "heads": h, "kv_heads": kv, "seq_q": sq, "seq_kv": skv,
                                           "head_dim": d, "causal": sq > 1}})
    for s in (1000, 2048, 4097):
        out.append({"name": f"prefill_b1_h8_s{s}_c", "kind": "prefill",
                    "params": {"batch": 1, "heads": 8, "kv_heads": 8, "seq_q": s, "seq_kv": s, "head_dim": 128,
                               "causal": True}})
    return out[::9] if quick else out


# ------------------------------------------------------------------------------------------------- CPU: prepare


def prepare(out: Path, time_limit: float, quick: bool, part: str = "0/1", only: str | None = None) -> None:
    import ptsolve
    from codegen.cuda import emit
    from codegen.plan import plan_from_program
    from codegen.runtime import compile_kernel
    from ptsolve.provenance import stamp

    recs = []
    i, n = map(int, part.split("/"))
    for sh in shapes(quick)[i::n]:
        if only and only not in sh["name"]:
            continue
        p = sh["params"]
        rec: dict[str, Any] = {**sh, "plans": {}}
        t0 = time.time()
        variants = {"split": ("flash_decode", None), "nosplit": ("flash_decode", {"splits": 1})}
        if sh["kind"] == "prefill":
            variants["plain"] = ("flash_attention", None)
        for label, (opname, fix) in variants.items():
            op = ptsolve.ops.make(opname, **p)
            res = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=time_limit, cache=False,
                                   executor="serial", fix=fix, compile_check=True)
            plan = plan_from_program(res.program, "h200")
            ks = emit(plan, "h200")
            c = compile_kernel(ks)
            rec["plans"][label] = {"op": opname, "plan": json.loads(plan.to_json()), "tiling": res.tiling,
                                   "predicted_us": res.predicted_us, "status": res.status,
                                   "kernel": ks.name, "grid": ks.grid[0], "registers": c.report["registers"],
                                   "spills": c.report["spill_stores"], "serialized": c.report["wgmma_serialized"]}
        rec["solve_s"] = round(time.time() - t0, 1)
        print(sh["name"], {k: (v["tiling"].get("splits"), round(v["predicted_us"], 2))
                           for k, v in rec["plans"].items()}, f"{rec['solve_s']}s", flush=True)
        recs.append(rec)
        out.parent.mkdir(parents=True, exist_ok=True)  # after every shape: an interrupted prepare keeps its work
        out.write_text(json.dumps({"provenance": stamp(), "solver": "cpsat", "time_limit": time_limit,
                                   "shapes": recs, "big": []}, indent=1, sort_keys=True))
    # 64-bit indexing: the FA18c / FA19 shapes of the paper suite (2^31 and 2^32 elements of q and o)
    from codegen.plan import default_plan
    big = []
    for name, s, causal in (("FA18c", 4096, True), ("FA19", 8192, False)):
        p = {"batch": 64, "heads": 64, "kv_heads": 8, "seq_q": s, "seq_kv": s, "head_dim": 128, "causal": causal,
             "dtype": "fp16"}
        plan = default_plan("flash_attention", p, {"BM": 128, "BN": 128, "depth": 2, "groups": 2})
        compile_kernel(emit(plan, "h200"))
        big.append({"name": name, "params": p, "plan": json.loads(plan.to_json())})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"provenance": stamp(), "solver": "cpsat", "time_limit": time_limit, "shapes": recs,
                               "big": big}, indent=1, sort_keys=True))


def sweep(plans: Path, out: Path, names: list[str], time_limit: float) -> None:
    """A second set of plans from ``plans``: every seq_q=4 shape with the model's choice (for unmasked SDPA
    timings), and for each shape in ``names`` the model's best schedule at the neighbouring splits values (the
    operator's candidate list) next to its choice: is the model's ranking of splits the measured one?"""
    import ptsolve
    from codegen.plan import plan_from_program
    from ptsolve.ops.decode import _tilings
    from ptsolve.provenance import stamp
    data = json.loads(plans.read_text())
    recs = []
    for sh in data["shapes"]:
        var = sh["plans"]
        pick = min(("split", "nosplit"), key=lambda k: var[k]["predicted_us"])
        if sh["params"]["seq_q"] == 4 and sh["kind"] == "decode":
            recs.append({**sh, "plans": {"choice": var[pick]}})
        if sh["name"] not in names:
            continue
        op = ptsolve.ops.make("flash_decode", **sh["params"])
        s0 = var[pick]["tiling"]["splits"]
        cands = sorted({t["splits"] for t in _tilings(op.params) if t["BN"] == var[pick]["tiling"]["BN"]})
        k = cands.index(s0)
        rec = {**sh, "plans": {f"s{s0}": var[pick]}}
        for s in cands[max(0, k - 1):k] + cands[k + 1:k + 3]:
            try:
                res = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=time_limit, cache=False,
                                       executor="serial", fix={"splits": s}, compile_check=True)
            except ptsolve.errors.InfeasibleError as e:  # every tiling with this splits value rejected by ptxas
                rec.setdefault("rejected", {})[f"s{s}"] = str(e)[:300]
                continue
            rec["plans"][f"s{s}"] = {"op": "flash_decode", "plan": json.loads(plan_from_program(res.program,
                                     "h200").to_json()), "tiling": res.tiling, "predicted_us": res.predicted_us,
                                     "status": res.status}
        print(sh["name"], {k: (v["tiling"]["splits"], round(v["predicted_us"], 2)) for k, v in rec["plans"].items()},
              flush=True)
        recs.append(rec)
    out.write_text(json.dumps({"provenance": stamp(), "solver": "cpsat", "time_limit": time_limit, "shapes": recs,
                               "big": []}, indent=1, sort_keys=True))


def precompile(plans: Path) -> None:
    """Compile every kernel ``run`` will launch exactly as the launchers emit it (codegen.runtime), so that the GPU
    machine finds every cubin in the carried cache."""
    from concurrent.futures import ThreadPoolExecutor

    from codegen.plan import KernelPlan
    from codegen.runtime import compile_kernel, emit_cached
    data = json.loads(plans.read_text())
    todo = [v["plan"] for sh in data["shapes"] for v in sh["plans"].values()] + [b["plan"] for b in data["big"]]
    kss = [emit_cached(KernelPlan.from_json(json.dumps(p))) for p in todo]
    with ThreadPoolExecutor(2) as ex:
        reps = list(ex.map(lambda ks: compile_kernel(ks).report, kss))
    bad = [(ks.name, r["spill_stores"], r["wgmma_serialized"]) for ks, r in zip(kss, reps)
           if r["spill_stores"] or r["wgmma_serialized"]]
    print(f"{len(kss)} kernels compiled; spilling or serialised: {bad or 'none'}")


# ------------------------------------------------------------------------------------------------- GPU: run


def refs(q: Any, k: Any, v: Any, causal: bool) -> tuple[Any, Any]:
    """(float32 reference, the same math in q's dtype), q [B, Sq, H, D], k / v [B, Skv, Hkv, D], causal
    bottom-right; by batch and head chunks, so neither a long KV cache expanded to every query head nor a 16k x 16k
    score matrix exists whole in float32. Rows that see no key are zeros (FlashAttention's output there)."""
    import torch
    B, Sq, H, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    hi, lo = torch.empty(q.shape, dtype=torch.float32, device=q.device), torch.empty_like(q)
    mask = None
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        mask = torch.arange(Skv, device=q.device)[None, :] > i + (Skv - Sq)
    hc = max(1, min(H, REF_CHUNK // max(1, Sq * Skv)))
    for b in range(B):
        for h0 in range(0, H, hc):
            hs = torch.arange(h0, min(H, h0 + hc), device=q.device)
            for dst, dt in ((hi, torch.float32), (lo, q.dtype)):
                qb = q[b, :, h0:h0 + len(hs)].transpose(0, 1).to(dt)              # h, Sq, D
                kb = k[b].transpose(0, 1)[hs // (H // Hkv)].to(dt)                 # h, Skv, D
                vb = v[b].transpose(0, 1)[hs // (H // Hkv)].to(dt)
                s = (qb @ kb.transpose(-1, -2)) * (1.0 / math.sqrt(D))
                if mask is not None:
                    s = s.masked_fill(mask, float("-inf"))
                o = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0) @ vb
                dst[b, :, h0:h0 + len(hs)] = o.transpose(0, 1).to(dst.dtype)
    return hi, lo


def check(run: Any, p: dict[str, Any], seed: int) -> dict[str, Any]:
    """FlashAttention's rule on fresh inputs, output poisoned with NaN; two launches (the combine counters must
    be back at zero) must agree bit for bit."""
    import torch
    torch.manual_seed(seed)
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.get("dtype", "fp16")]
    B, Sq, Skv, H, Hkv, D = (p[x] for x in ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim"))
    q = torch.randn(B, Sq, H, D, device="cuda", dtype=tdt)
    k = torch.randn(B, Skv, Hkv, D, device="cuda", dtype=tdt)
    v = torch.randn(B, Skv, Hkv, D, device="cuda", dtype=tdt)
    o1, o2 = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    run(q, k, v, o1)
    run(q, k, v, o2)
    torch.cuda.synchronize()
    hi, lo = refs(q, k, v, p["causal"])
    err = float((o1.float() - hi).abs().max())
    base = float((lo.float() - hi).abs().max())
    ok = math.isfinite(err) and err <= 2 * base + 1e-3 and bool(torch.equal(o1, o2))
    return {"max_err": err, "lowprec_err": base, "repeat_equal": bool(torch.equal(o1, o2)), "ok": ok}


def timing_sets(p: dict[str, Any], min_sets: int = 1) -> tuple[list[Any], int]:
    """Inputs for timing a decode shape: (q, k, v, o) fp16 sets (BSHD; o poisoned with NaN), as many as keep K/V
    from staying in the 50 MB L2 when the timing rotates over them (at least ``min_sets``, at most 16), and the bytes
    of K and V of one set."""
    import torch
    B, Sq, Skv, H, Hkv, D = (p[x] for x in ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim"))
    kv_bytes = 2 * B * Skv * Hkv * D * 2
    n = max(min_sets, min(16, math.ceil(200e6 / kv_bytes)))
    return [(torch.randn(B, Sq, H, D, device="cuda", dtype=torch.float16),
             torch.randn(B, Skv, Hkv, D, device="cuda", dtype=torch.float16),
             torch.randn(B, Skv, Hkv, D, device="cuda", dtype=torch.float16),
             torch.full((B, Sq, H, D), float("nan"), device="cuda", dtype=torch.float16)) for _ in range(n)], kv_bytes


def sdpa_fns(p: dict[str, Any], sets: list[Any], nc: bool = False) -> dict[str, tuple[Any, Any]]:
    """name -> (fn(i), context) for the SDPA backends that accept the shape (GQA through enable_gqa; a causal
    decode with seq_q < seq_kv through causal_lower_right, which cuDNN may refuse). ``nc``: for such a shape also
    the backends without the mask (``<name>_nc``): torch's lower-right causal path expands the K/V heads for GQA,
    so its times are no target; the unmasked call moves the same bytes."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    Sq, Skv = p["seq_q"], p["seq_kv"]
    bottom_right = p["causal"] and Sq < Skv

    def call(i: int) -> Any:
        q, k, v, _ = sets[i]
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if bottom_right:
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=causal_lower_right(Sq, Skv),
                                                  enable_gqa=True)
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=p["causal"], enable_gqa=True)

    def call_nc(i: int) -> Any:  # the same K/V traffic without the mask: what a fused GQA decode would cost
        q, k, v, _ = sets[i]
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              enable_gqa=True)

    out = {}
    backends = [("sdpa_default", None), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                ("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)]
    for name, be in backends + ([(n + "_nc", b) for n, b in backends] if nc and bottom_right else []):
        ctx = (lambda be=be: sdpa_kernel([be])) if be is not None else contextlib.nullcontext
        fn = call_nc if name.endswith("_nc") else call
        try:
            with ctx():
                fn(0)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (a backend that refuses the shape is reported, not fatal)
            out[name] = (None, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
            continue
        out[name] = (fn, ctx)
    return out


def run(plans: Path, out: Path, only: str | None, nc: bool = False) -> None:
    import torch

    from codegen.harness import run_attention, run_decode, time_many
    from codegen.plan import KernelPlan

    data = json.loads(plans.read_text())
    dev = torch.cuda.get_device_name()
    results: list[dict[str, Any]] = []
    big = []  # first: the 64-bit runs are short and must not be cut by a time limit
    for b in data.get("big", []):
        if only and only not in b["name"]:
            continue
        big.append(run_big(b))
        print(b["name"], big[-1], flush=True)
        torch.cuda.empty_cache()
    for sh in data["shapes"]:
        if only and only not in sh["name"]:
            continue
        p = {**sh["params"], "dtype": "fp16"}
        rec: dict[str, Any] = {"name": sh["name"], "kind": sh["kind"], "params": p, "variants": {}}
        runners = {}
        for label, v in sh["plans"].items():
            plan = KernelPlan.from_json(json.dumps(v["plan"]))
            fn = run_decode if v["op"] == "flash_decode" else run_attention
            runners[label] = (lambda q, k, v_, o, plan=plan, fn=fn: fn(q, k, v_, plan, out=o))
            try:
                rec["variants"][label] = {"tiling": v["tiling"], "predicted_us": v["predicted_us"],
                                          **check(runners[label], p, seed=len(results))}
            except Exception as e:  # noqa: BLE001  (reported per shape; the others still run)
                rec["variants"][label] = {"tiling": v["tiling"], "ok": False, "error": repr(e)[:300]}
        sets, kv_bytes = timing_sets(p)  # timing: CUDA graphs, inputs rotating past the 50 MB L2
        nsets = len(sets)
        fns, ctxs = {}, {}
        for label, r in runners.items():
            if rec["variants"][label].get("ok"):
                fns[label] = (lambda i, r=r, sets=sets: r(*sets[i]))
        for name, (fn, ctx) in sdpa_fns(p, sets, nc).items():
            if fn is None:
                rec[name + "_error"] = ctx
            else:
                fns[name], ctxs[name] = fn, ctx
        try:
            ms = time_many(fns, nsets, ctxs=ctxs, graphs=True, rounds=11, block_ms=1.0)
            # the graphs wrote our outputs: a timing of an empty graph would leave the NaN poison in place
            rec["outputs_written"] = all(bool(torch.isfinite(s[3]).all()) for s in sets) if any(
                k in fns for k in runners) else None
        except Exception as e:  # noqa: BLE001
            ms, rec["timing_error"] = {}, repr(e)[:300]
        rec["us"] = {k: v * 1e3 for k, v in ms.items()}
        rec["kv_gb_per_s"] = {k: kv_bytes / (v * 1e-3) / 1e9 for k, v in ms.items()}
        results.append(rec)
        print(sh["name"], {k: round(v, 2) for k, v in rec["us"].items()},
              {k: v.get("ok") for k, v in rec["variants"].items()}, flush=True)
        sets.clear()
        torch.cuda.empty_cache()
        save(out, dev, data, results, big)  # after every shape: a time limit keeps what was measured


def save(out: Path, dev: str, data: dict[str, Any], results: list[dict[str, Any]], big: list[dict[str, Any]]) -> None:
    import torch
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": dev, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "plans_provenance": data["provenance"], "torch": torch.__version__,
                               "shapes": results, "big": big}, indent=1, sort_keys=True))


def run_big(b: dict[str, Any]) -> dict[str, Any]:
    """A 2^31 / 2^32-element attention: one launch, then (batch, GQA group) slices checked against float32,
    including the last batch's last group (whose offsets overflow 32 bits)."""
    import torch

    from codegen.harness import run_attention
    from codegen.plan import KernelPlan
    p = b["params"]
    plan = KernelPlan.from_json(json.dumps(b["plan"]))
    B, S, H, Hkv, D = p["batch"], p["seq_q"], p["heads"], p["kv_heads"], p["head_dim"]
    torch.manual_seed(0)
    try:
        q = torch.randn(B, S, H, D, device="cuda", dtype=torch.float16)
        k = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.float16)
        v = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.float16)
        o = torch.full_like(q, float("nan"))
        t0 = time.time()
        run_attention(q, k, v, plan, out=o)
        torch.cuda.synchronize()
        secs = time.time() - t0
        worst = 0.0
        ok = True
        G = H // Hkv
        for bb, kv in ((0, 0), (B // 2, Hkv // 2), (B - 1, Hkv - 1)):  # one GQA group each (the last: past 2^31)
            hs = slice(kv * G, (kv + 1) * G)
            hi, lo = refs(q[bb:bb + 1, :, hs], k[bb:bb + 1, :, kv:kv + 1], v[bb:bb + 1, :, kv:kv + 1], p["causal"])
            err = float((o[bb:bb + 1, :, hs].float() - hi).abs().max())
            base = float((lo.float() - hi).abs().max())
            ok = ok and math.isfinite(err) and err <= 2 * base + 1e-3
            worst = max(worst, err) if math.isfinite(err) else float("nan")
        return {"name": b["name"], "elements_q": q.numel(), "first_launch_s": round(secs, 3), "max_err": worst,
                "finite": bool(torch.isfinite(o).all()), "ok": ok and bool(torch.isfinite(o).all())}
    except Exception as e:  # noqa: BLE001
        return {"name": b["name"], "ok": False, "error": repr(e)[:300]}


# ------------------------------------------------------------------------------------------------- CPU: report


def sweep_section(sw: dict[str, Any], main: dict[str, Any]) -> list[str]:
    """The second device run: unmasked SDPA next to the seq_q=4 shapes, and neighbouring splits values."""
    def geo(x: list[float]) -> str:
        return f"{math.exp(sum(map(math.log, x)) / len(x)):.3f}" if x else "—"
    lines = ["", f"## Second run ({sw['date']}): a fair SDPA baseline for seq_q = 4, and the splits the model did "
             "not pick", "",
             "torch's bottom-right causal path (`causal_lower_right`) does not reach a fused kernel for GQA (it "
             "expands the K/V heads, see the warnings in the log), so the masked SDPA times above are no target for "
             "the seq_q = 4 rows. Here SDPA also runs *unmasked* on the same tensors (`_nc`: the same K/V bytes, at "
             "least the causal work); the fair baseline is the faster of masked and unmasked.", "",
             "SDPA has no GQA packing for seq_q > 1 (each query head streams its K/V), so even unmasked it reads "
             "the cache H/Hkv times; as a same-bytes proxy the last column divides cuDNN's seq_q = 1 time on the same "
             "cache (first run) by ours: what a packed decode kernel at cuDNN's seq_q = 1 speed would score.", "",
             "| shape | ours µs | cuDNN masked | cuDNN unmasked | best SDPA (either) | fair ratio vs cuDNN | "
             "fair ratio vs best | cuDNN seq_q=1 proxy ratio |", "|---|---|---|---|---|---|---|---|"]
    q1 = {r["name"]: r["us"].get("sdpa_cudnn") for r in main["shapes"]}
    fair_c, fair_b, proxies = [], [], []
    for r in sw["shapes"]:
        us = r["us"]
        if "choice" not in us:
            continue
        ours = us["choice"]
        cud = min((us[k] for k in ("sdpa_cudnn", "sdpa_cudnn_nc") if k in us), default=None)
        best = min((v for k, v in us.items() if k.startswith("sdpa")), default=None)
        if cud:
            fair_c.append(cud / ours)
        if best:
            fair_b.append(best / ours)
        proxy = q1.get(r["name"].replace("_q4_", "_q1_"))
        if proxy:
            proxies.append(proxy / ours)
        lines.append(f"| {r['name']} | {ours:.2f} | {us.get('sdpa_cudnn', float('nan')):.2f} | "
                     f"{us.get('sdpa_cudnn_nc', float('nan')):.2f} | {best:.2f} | "
                     f"{cud / ours if cud else float('nan'):.2f} | {best / ours if best else float('nan'):.2f} | "
                     f"{proxy / ours if proxy else float('nan'):.2f} |")
    lines += ["", f"seq_q = 4, fair: geomean ratio vs cuDNN {geo(fair_c)}, vs the best SDPA {geo(fair_b)}; at >= 0.9x "
              f"cuDNN: {sum(x >= 0.9 for x in fair_c)} of {len(fair_c)}. Against the seq_q = 1 proxy: geomean "
              f"{geo(proxies)}, >= 0.9x on {sum(x >= 0.9 for x in proxies)} of {len(proxies)}.", ""]
    rest_c = []
    for r in main["shapes"]:
        if r["params"]["seq_q"] == 4 and r["kind"] == "decode":
            continue
        var, us = r["variants"], r["us"]
        pick = min(("split", "nosplit"), key=lambda k: var.get(k, {}).get("predicted_us") or math.inf)
        if pick in us and "sdpa_cudnn" in us:
            rest_c.append(us["sdpa_cudnn"] / us[pick])
    allc = rest_c + fair_c
    lines += [f"All {len(allc)} shapes with the fair seq_q = 4 baseline: geomean ratio vs cuDNN {geo(allc)}; at "
              f">= 0.9x cuDNN: {sum(x >= 0.9 for x in allc)} of {len(allc)} (the issue's target: every decode and "
              f"batch-1 causal shape >= 0.9x). Without the seq_q = 4 shapes (where SDPA lacks GQA packing): "
              f"geomean {geo(rest_c)} over {len(rest_c)}, >= 0.9x on {sum(x >= 0.9 for x in rest_c)}.", "",
              "### Neighbouring splits (each the solver's best schedule at that splits value; pieces of the longest "
              "query tile)", "", "| shape | splits: predicted µs / measured µs |", "|---|---|"]
    for r in sw["shapes"]:
        if "choice" in r["us"]:
            continue
        cells = []
        for k, v in sorted(r["variants"].items(), key=lambda kv: kv[1]["tiling"]["splits"]):
            m = r["us"].get(k)
            cells.append(f"{v['tiling']['splits']}: {v.get('predicted_us', float('nan')):.2f} / "
                         f"{m if m is None else round(m, 2)}")
        rej = ", ".join(r.get("rejected", {})) if r.get("rejected") else ""
        note = f" (the compiler rejected every tiling at {rej})" if rej else ""
        lines.append(f"| {r['name']} | {'; '.join(cells)}{note} |")
    return lines


def report(runs: Path, out: Path, command: str, sweep: Path | None = None) -> None:
    d = json.loads(runs.read_text())
    lines = [f"# Split-KV attention (flash_decode) on the {d['device']}", "",
             f"Measured {d['date']} (torch {d['torch']}); schedules solved {d['plans_provenance']['date']} at commit "
             f"{d['plans_provenance']['commit']} (CP-SAT, compiler in the loop). Command: `{command}`.", "",
             "Times in µs per call (CUDA graphs, median of interleaved rounds, inputs rotating past the L2). "
             "`split`: the time-limited search's best flash_decode schedule (splits free); `nosplit`: its best "
             "with splits=1; the model's choice (`choice`) is the one of the two with the lower prediction (the "
             "time-limited search over all splits sometimes returns a worse schedule than the splits=1 search "
             "finds, after the compiler rejected its first picks); `plain`: the flash_attention kernel. "
             "`best SDPA`: the fastest SDPA backend that accepts the shape; ratios are SDPA time / the choice's "
             "time (> 1: ours faster). cuDNN: `sdpa_cudnn` where it accepts the shape.", "",
             "| shape | choice (splits) | pred µs | split µs | nosplit µs | plain µs | cuDNN µs | "
             "best SDPA µs (backend) | ratio vs cuDNN | ratio vs best | ok |", "|" + "---|" * 11]
    ratios_c, ratios_b = [], []
    for r in d["shapes"]:
        us, var = r["us"], r["variants"]
        sd = {k: v for k, v in us.items() if k.startswith("sdpa")}
        best = min(sd, key=sd.get) if sd else None
        pick = min(("split", "nosplit"), key=lambda k: var.get(k, {}).get("predicted_us") or math.inf)
        sp = us.get(pick)
        rc = (us["sdpa_cudnn"] / sp) if sp and "sdpa_cudnn" in us else None
        rb = (sd[best] / sp) if sp and best else None
        if rc:
            ratios_c.append(rc)
        if rb:
            ratios_b.append(rb)
        ok = all(v.get("ok") for v in var.values())

        def f(x: float | None) -> str:
            return "—" if x is None else f"{x:.2f}"
        lines.append(f"| {r['name']} | {pick} ({var[pick]['tiling'].get('splits')}) | "
                     f"{f(var[pick].get('predicted_us'))} | {f(us.get('split'))} | {f(us.get('nosplit'))} | "
                     f"{f(us.get('plain'))} | {f(us.get('sdpa_cudnn'))} | "
                     f"{f(sd.get(best) if best else None)} ({best}) | {f(rc)} | {f(rb)} | {'yes' if ok else 'NO'} |")

    def geo(x: list[float]) -> str:
        return f"{math.exp(sum(map(math.log, x)) / len(x)):.3f}" if x else "—"
    lines += ["", f"Geomean ratio vs cuDNN: {geo(ratios_c)} over {len(ratios_c)} shapes; vs the best SDPA backend: "
              f"{geo(ratios_b)} over {len(ratios_b)} shapes; shapes at >= 0.9x cuDNN: "
              f"{sum(r >= 0.9 for r in ratios_c)} of {len(ratios_c)}.", ""]
    lines += ["## Split-KV: predicted vs measured gain", "",
              "| shape | splits | predicted nosplit/split | measured nosplit/split |", "|---|---|---|---|"]
    for r in d["shapes"]:
        var, us = r["variants"], r["us"]
        if "split" in us and "nosplit" in us and var["split"]["tiling"].get("splits", 1) > 1:
            lines.append(f"| {r['name']} | {var['split']['tiling']['splits']} | "
                         f"{var['nosplit']['predicted_us'] / var['split']['predicted_us']:.2f} | "
                         f"{us['nosplit'] / us['split']:.2f} |")
    if sweep is not None:
        lines += sweep_section(json.loads(sweep.read_text()), d)
    errs = [f"{r['name']}: {k}: {v.get('error', '')} max_err {v.get('max_err')} lowprec {v.get('lowprec_err')} "
            f"repeat_equal {v.get('repeat_equal')}" for r in d["shapes"] for k, v in r["variants"].items()
            if not v.get("ok")]
    lines += ["", "## Correctness failures", ""] + ([f"- {e}" for e in errs] or ["none"])
    lines += ["", "## 64-bit indexing (flash_attention)", ""]
    lines += [f"- {b['name']}: {json.dumps(b)}" for b in d.get("big", [])] or ["not run"]
    refused = sorted({f"{k[:-6]}: {v}" for r in d["shapes"] for k, v in r.items() if k.endswith("_error")})
    lines += ["", "## SDPA backends that refused a shape", ""] + [f"- {x}" for x in refused[:20]]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--time-limit", type=float, default=10.0)
    a.add_argument("--quick", action="store_true")
    a.add_argument("--part", default="0/1", help="i/n: every n-th shape from the i-th (parallel prepares; merge)")
    a.add_argument("--only", help="only the shapes whose name contains this")
    sw = sub.add_parser("sweep")
    sw.add_argument("--plans", type=Path, required=True)
    sw.add_argument("--out", type=Path, required=True)
    sw.add_argument("--names", nargs="+", required=True)
    sw.add_argument("--time-limit", type=float, default=4.0)
    pc = sub.add_parser("precompile")
    pc.add_argument("--plans", type=Path, required=True)
    m = sub.add_parser("merge")
    m.add_argument("parts", type=Path, nargs="+")
    m.add_argument("--out", type=Path, required=True)
    b = sub.add_parser("run")
    b.add_argument("--plans", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--only")
    b.add_argument("--nc", action="store_true", help="also time SDPA unmasked on bottom-right causal shapes")
    c = sub.add_parser("report")
    c.add_argument("--runs", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--command", default="python -m bench decode run")
    c.add_argument("--sweep", type=Path, help="the second run (sweep plans, --nc)")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.out, args.time_limit, args.quick, args.part, args.only)
    elif args.cmd == "sweep":
        sweep(args.plans, args.out, args.names, args.time_limit)
    elif args.cmd == "precompile":
        precompile(args.plans)
    elif args.cmd == "merge":
        ds = [json.loads(x.read_text()) for x in args.parts]
        order = {s["name"]: k for k, s in enumerate(shapes())}
        merged = {**ds[0], "shapes": sorted((s for d in ds for s in d["shapes"]), key=lambda s: order[s["name"]])}
        args.out.write_text(json.dumps(merged, indent=1, sort_keys=True))
    elif args.cmd == "run":
        run(args.plans, args.out, args.only, args.nc)
    else:
        report(args.runs, args.out, args.command, args.sweep)


if __name__ == "__main__":
    main()
