"""GPU: every row through ``ptsolve.torch`` next to the exact-shape kernel and the peers, in one process.

Writes the JSON rows (and the markdown report beside them).

Per row: fresh fp16 inputs in as many sets as rotate past the 50 MB L2 (200 MB of operands, at most 64 sets); every
candidate called once on every set first (its first-use work: a cold prepared launch, FA4's JIT compile), then
``codegen.harness.time_many``: interleaved rounds, blocks of back-to-back launches between CUDA events, CUDA graphs
(the host's Python is not timed; where a candidate cannot be captured, the row is timed without graphs and says
so), the median. Candidates: ``ptsolve`` (``pt.flash_attention`` / ``flash_attention_varlen`` /
``flash_attention_kvcache`` / ``gemm``), ``exact`` (the row's exact-shape kernel from ``prepare``'s plans, through
``codegen.harness``), and the peers ``fa4`` (``baselines.fa4``), ``cudnn`` and ``sdpa_flash``
(``baselines.attention.sdpa``), ``cublas`` (``torch.matmul``). A peer that refuses a row is absent from it, with the
reason. Every output is checked against a float32 reference with FlashAttention's rule: max |out - ref| <= 2 x that
of the same computation in PyTorch at fp16, plus FlashAttention's atol (the fp32 rounding of the reference).

    python -m bench peers run --plans .cubin_peers/plans.json --out $OUT/h200.json [--only TEXT] [--limit N]
        [--budget-s 470] [--rounds 15] [--skip fa4]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.decode.decode_bench import refs as attention_refs

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PEERS = ("fa4", "cudnn", "sdpa_flash", "tilelang", "cublas")
TILELANG_ABSENT = ("not built in this round: issue 35's TileLang kernels (pipelined GQA attention, an autotuned "
                   "GEMM) are still to be written; tilelang 0.1.15 is a 47 MiB wheel plus z3-solver and pins "
                   "apache-tvm-ffi<0.1.13")
ROTATE_BYTES = 200e6


def nsets(bytes_per_set: float) -> int:
    """Input sets to rotate over: enough for 200 MB of operands (past the 50 MB L2), 1 to 64."""
    return max(1, min(64, math.ceil(ROTATE_BYTES / max(bytes_per_set, 1.0))))


# ------------------------------------------------------------------------------------------------ references


def varlen_refs(q: Any, k: Any, v: Any, cq: list[int], ck: list[int], causal: bool) -> tuple[Any, Any]:
    """attention_refs per sequence of a packed batch (``cq`` / ``ck``: the cumulative lengths)."""
    import torch
    hi, lo = torch.empty(q.shape, dtype=torch.float32, device=q.device), torch.empty_like(q)
    for b in range(len(cq) - 1):
        h, lw = attention_refs(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]], causal)
        hi[cq[b]:cq[b + 1]], lo[cq[b]:cq[b + 1]] = h[0], lw[0]
    return hi, lo


def gemm_refs(a: Any, w: Any) -> tuple[Any, Any]:
    """(float32 a·wᵀ without TF32, torch.matmul at fp16)."""
    import torch
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return a.float() @ w.float().t(), torch.matmul(a, w.t())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def within_rule(err: float, base: float, atol: float) -> bool:
    """FlashAttention's tolerance: at most twice the error of PyTorch at the input precision, plus atol."""
    return math.isfinite(err) and err <= 2 * base + atol


def max_err(out: Any, ref: Any) -> float:
    """max |out - ref| in float32 (inf where out has a NaN or Inf, or the wrong shape)."""
    import torch
    if out is None or tuple(out.shape) != tuple(ref.shape):
        return math.inf
    d = (out.float() - ref).abs()
    return float(d.max()) if bool(torch.isfinite(d).all()) else math.inf


# ------------------------------------------------------------------------------------------------ candidates

Cand = tuple["Callable[[int], Any] | None", str]  # (call(set index) -> output in the reference's layout, note/why)


def _per_set(make: Callable[[int], tuple[Any, str]], n: int) -> Cand:
    """A candidate from a maker of one set's (tried) call: absent where the first set's is."""
    first, note = make(0)
    if first is None:
        return None, note
    calls = [first] + [make(i)[0] for i in range(1, n)]
    if any(c is None for c in calls):
        return None, "refused on another input set"
    return (lambda i: calls[i]()), note


def _user(fn: Callable[[int], Any]) -> Cand:
    """The user call, tried on set 0 (a ShapeError or a failure makes it absent, with the reason)."""
    try:
        fn(0)
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    return fn, ""


def _exact(plan: Any, why: str, run: Callable[..., Any], sets: list[dict[str, Any]], args: tuple[str, ...]) -> Cand:
    if plan is None:
        return None, why
    return _user(lambda i: run(*(sets[i][a] for a in args), plan, out=sets[i]["o"]))


def _sdpa(backend: str, sets: list[dict[str, Any]], causal: bool) -> Cand:
    from baselines.attention import sdpa

    def make(i: int) -> tuple[Any, str]:
        s = sets[i]
        fn, why = sdpa(backend, s["qh"], s["kh"], s["vh"], causal)
        return ((lambda: fn().transpose(1, 2)), "") if fn is not None else (None, why)
    return _per_set(make, len(sets))


def prefill_cands(s: dict[str, Any], sets: list[dict[str, Any]], plan: Any, why: str,
                  decode: bool = False) -> dict[str, Callable[[], Cand]]:
    """Dense attention (prefill, or decode against its cache when ``decode``): the user call, the exact kernel,
    FA4, SDPA cuDNN and FLASH; each a maker whose first call ``run_row`` times (first use)."""
    import ptsolve.torch as pt
    from baselines import fa4
    from codegen.harness import run_attention
    c = s["causal"]
    if decode:
        def user() -> Cand:
            return _user(lambda i: pt.flash_attention_kvcache(sets[i]["q"], sets[i]["k"], sets[i]["v"],
                                                              sets[i]["lens"], causal=c))

        def peer() -> Cand:
            return _per_set(lambda i: fa4.decode(sets[i]["q"], sets[i]["k"], sets[i]["v"], sets[i]["lens"], c,
                                                 full=True), len(sets))
    else:
        def user() -> Cand:
            return _user(lambda i: pt.flash_attention(sets[i]["q"], sets[i]["k"], sets[i]["v"], causal=c))

        def peer() -> Cand:
            return _per_set(lambda i: fa4.prefill(sets[i]["q"], sets[i]["k"], sets[i]["v"], c), len(sets))
    return {"ptsolve": user, "exact": lambda: _exact(plan, why, run_attention, sets, ("q", "k", "v")), "fa4": peer,
            "cudnn": lambda: _sdpa("cudnn", sets, c), "sdpa_flash": lambda: _sdpa("flash", sets, c)}


def varlen_cands(s: dict[str, Any], sets: list[dict[str, Any]], plan: Any, why: str) -> dict[str, Callable[[], Cand]]:
    """Packed sequences: the user call and FA4; no exact-shape kernel, no SDPA form."""
    import ptsolve.torch as pt
    from baselines import fa4
    c, mq, mk = s["causal"], max(s["seqlens_q"]), max(s["seqlens_k"])
    no_sdpa: Cand = (None, "SDPA has no varlen (cu_seqlens) form")
    return {"ptsolve": lambda: _user(lambda i: pt.flash_attention_varlen(
                sets[i]["q"], sets[i]["k"], sets[i]["v"], sets[i]["cu_q"], sets[i]["cu_k"], mq, mk, causal=c)),
            "exact": lambda: (None, "no exact-shape varlen kernel: the harness runs dense shapes only"),
            "fa4": lambda: _per_set(lambda i: fa4.varlen(sets[i]["q"], sets[i]["k"], sets[i]["v"], sets[i]["cu_q"],
                                                         sets[i]["cu_k"], mq, mk, c), len(sets)),
            "cudnn": lambda: no_sdpa, "sdpa_flash": lambda: no_sdpa}


def gemm_cands(s: dict[str, Any], sets: list[dict[str, Any]], plan: Any, why: str) -> dict[str, Callable[[], Cand]]:
    """a [M, K] · w [N, K]ᵀ: the user call, the exact kernel, cuBLAS (torch.matmul on wᵀ, a view)."""
    import ptsolve.torch as pt
    from baselines.gemm import make_fn
    from codegen.harness import run_gemm
    return {"ptsolve": lambda: _user(lambda i: pt.gemm(sets[i]["a"], sets[i]["w"])),
            "exact": lambda: _exact(plan, why, run_gemm, sets, ("a", "w")),
            "cublas": lambda: _per_set(lambda i: (make_fn(sets[i]["a"], sets[i]["w"].t()), ""), len(sets))}


# ------------------------------------------------------------------------------------------------ inputs


def attn_inputs(s: dict[str, Any], sdpa: bool = True) -> list[dict[str, Any]]:
    """Sets of q [B, Sq, H, D], k / v [B, Skv, Hkv, D] (fp16, randn), o (NaN, the exact kernel's output), lens
    (int32 [B], the whole cache) and, for SDPA, contiguous (B, H, S, D) copies."""
    import torch
    B, Sq, Skv, H, Hkv, D = (s[x] for x in ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim"))
    out = []
    for _ in range(nsets(2 * 2 * (B * Sq * H * D + B * Skv * Hkv * D))):
        q = torch.randn(B, Sq, H, D, device="cuda", dtype=torch.float16)
        k = torch.randn(B, Skv, Hkv, D, device="cuda", dtype=torch.float16)
        v = torch.randn(B, Skv, Hkv, D, device="cuda", dtype=torch.float16)
        d = {"q": q, "k": k, "v": v, "o": torch.full_like(q, float("nan")),
             "lens": torch.full((B,), Skv, dtype=torch.int32, device="cuda")}
        if sdpa:
            d |= {"qh": q.transpose(1, 2).contiguous(), "kh": k.transpose(1, 2).contiguous(),
                  "vh": v.transpose(1, 2).contiguous()}
        out.append(d)
    return out


def cumulative(lens: list[int]) -> list[int]:
    """[0, l0, l0 + l1, ...]: cu_seqlens."""
    out = [0]
    for x in lens:
        out.append(out[-1] + x)
    return out


def varlen_inputs(s: dict[str, Any]) -> list[dict[str, Any]]:
    """Sets of packed q [Tq, H, D], k / v [Tk, Hkv, D] and int32 cu_seqlens on the device."""
    import torch
    cq, ck = cumulative(s["seqlens_q"]), cumulative(s["seqlens_k"])
    H, Hkv, D = s["heads"], s["kv_heads"], s["head_dim"]
    out = []
    for _ in range(nsets(2 * 2 * (cq[-1] * H * D + ck[-1] * Hkv * D))):
        out.append({"q": torch.randn(cq[-1], H, D, device="cuda", dtype=torch.float16),
                    "k": torch.randn(ck[-1], Hkv, D, device="cuda", dtype=torch.float16),
                    "v": torch.randn(ck[-1], Hkv, D, device="cuda", dtype=torch.float16),
                    "cu_q": torch.tensor(cq, dtype=torch.int32, device="cuda"),
                    "cu_k": torch.tensor(ck, dtype=torch.int32, device="cuda")})
    return out


def gemm_inputs(s: dict[str, Any]) -> list[dict[str, Any]]:
    """Sets of a [M, K], w [N, K] (fp16, randn) and o [M, N] (NaN, the exact kernel's output)."""
    import torch
    M, N, K = s["M"], s["N"], s["K"]
    return [{"a": torch.randn(M, K, device="cuda", dtype=torch.float16),
             "w": torch.randn(N, K, device="cuda", dtype=torch.float16),
             "o": torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)}
            for _ in range(nsets(2 * (M * K + N * K + M * N)))]


def inputs_and_refs(row: dict[str, Any]) -> tuple[list[dict[str, Any]], Any, Any]:
    """A row's input sets and its (float32, fp16) references on the first set."""
    s, w = row["shape"], row["workload"]
    if w == "gemm":
        sets = gemm_inputs(s)
        return (sets, *gemm_refs(sets[0]["a"], sets[0]["w"]))
    if w == "varlen":
        sets = varlen_inputs(s)
        return (sets, *varlen_refs(sets[0]["q"], sets[0]["k"], sets[0]["v"], cumulative(s["seqlens_q"]),
                                   cumulative(s["seqlens_k"]), s["causal"]))
    sets = attn_inputs(s)
    return (sets, *attention_refs(sets[0]["q"], sets[0]["k"], sets[0]["v"], s["causal"]))


# ------------------------------------------------------------------------------------------------ one row

BUILDERS = {"prefill": prefill_cands, "decode": lambda s, sets, plan, why: prefill_cands(s, sets, plan, why, True),
            "varlen": varlen_cands, "gemm": gemm_cands}


def exact_plan(plans: dict[str, Any] | None, name: str) -> tuple[Any, str, dict[str, Any]]:
    """(the row's exact-shape KernelPlan or None, why absent, what prepare recorded of it)."""
    from codegen.plan import KernelPlan
    if plans is None:
        return None, "no plans file (run prepare)", {}
    rec = plans.get("rows", {}).get(name)
    if rec is None:
        return None, "not prepared (run prepare for this row)", {}
    info = {k: rec[k] for k in ("status", "tiling", "predicted_us", "solve_s", "error") if k in rec}
    if "plan" not in rec:
        return None, f"optimize refused: {rec.get('error', '?')}", info
    return KernelPlan.from_json(json.dumps(rec["plan"])), "", info


def first_use(makers: dict[str, Callable[[], Cand]], nsets: int, skip: tuple[str, ...] = ()) -> tuple[
        dict[str, Callable[[int], Any]], dict[str, str], dict[str, float]]:
    """Each candidate's first call (timed: first use, e.g. FA4's JIT compile), then a call on every set, so that
    the timing (and its graph capture) finds everything built; (present calls, absent -> why, first-call s).
    Candidates in ``skip`` are absent unrun."""
    import torch
    calls, absent, first = {}, {}, {}
    for name, mk in makers.items():
        if name in skip:
            absent[name] = "skipped (--skip)"
            continue
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call, why = mk()
        torch.cuda.synchronize()
        first[name] = round(time.perf_counter() - t0, 4)
        if call is None:
            absent[name] = why
            continue
        try:
            for i in range(nsets):
                call(i)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            absent[name] = f"failed on another input set: {type(e).__name__}: {str(e)[:160]}"
            continue
        calls[name] = call
    return calls, absent, first


def timed(calls: dict[str, Callable[[int], Any]], nsets: int, rounds: int, block_ms: float) -> tuple[
        dict[str, float], bool]:
    """Median µs per call of each candidate (interleaved rounds, CUDA graphs; without graphs where one candidate
    cannot be captured); (µs, graphs used)."""
    import torch

    from codegen.harness import time_many
    if not calls:
        return {}, False
    try:
        ms = time_many(calls, nsets, rounds=rounds, block_ms=block_ms, graphs=True)
        graphs = True
    except Exception as e:  # noqa: BLE001  (a capture that fails: time the row without graphs)
        print(f"  graph capture failed ({type(e).__name__}: {str(e)[:120]}); timing without graphs", flush=True)
        torch.cuda.synchronize()
        ms, graphs = time_many(calls, nsets, rounds=rounds, block_ms=block_ms, graphs=False), False
    return {k: v * 1e3 for k, v in ms.items()}, graphs


def checked(calls: dict[str, Callable[[int], Any]], hi: Any, lo: Any) -> tuple[dict[str, float | None], float, float]:
    """Each candidate's max |out - ref| on the first set (None: NaN / Inf / wrong shape), PyTorch's error at fp16
    and FlashAttention's atol."""
    import torch
    base = max_err(lo, hi)
    atol = 2 * float((hi + 0.3 - 0.3 - hi).abs().max())
    errs: dict[str, float | None] = {}
    for name, call in calls.items():
        out = call(0)
        torch.cuda.synchronize()
        e = max_err(out, hi)
        errs[name] = e if math.isfinite(e) else None
        del out
    return errs, base, atol


def run_row(row: dict[str, Any], plans: dict[str, Any] | None, rounds: int, block_ms: float,
            skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """One row: inputs, references, candidates, their first use, the check and the timing; the JSON row."""
    import torch

    from codegen.runtime import NVCC_RUNS
    torch.manual_seed(0)
    sets, hi, lo = inputs_and_refs(row)
    plan, why, info = exact_plan(plans, row["name"]) if row["workload"] != "varlen" else (None, "", {})
    nv0 = NVCC_RUNS[0]
    calls, absent, first = first_use(BUILDERS[row["workload"]](row["shape"], sets, plan, why), len(sets), skip)
    if "o" in sets[0]:
        sets[0]["o"].fill_(float("nan"))  # the exact kernel's output poisoned again: the check sees only its write
    errs, base, atol = checked(calls, hi, lo)
    del hi, lo
    us, graphs = timed(calls, len(sets), rounds, block_ms)
    ok_by = {k: e is not None and within_rule(e, base, atol) for k, e in errs.items()}
    absent["tilelang"] = TILELANG_ABSENT
    return {"name": row["name"], "workload": row["workload"], "shape": row["shape"],
            "ptsolve_us": us.get("ptsolve"), "exact_us": us.get("exact"),
            "peers": {p: us[p] for p in PEERS if p in us}, "max_abs_err": errs.get("ptsolve"),
            "ok": bool(ok_by.get("ptsolve")), "ref_err": base, "atol": atol, "errs": errs, "within_rule": ok_by,
            "absent": absent, "first_call_s": first, "nvcc_runs": NVCC_RUNS[0] - nv0, "graphs": graphs,
            "sets": len(sets), "exact_plan": info}


# ------------------------------------------------------------------------------------------------ the run


def _commit() -> str:
    c = os.environ.get("COMMIT", "")
    if c:
        return c
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def meta(argv: list[str]) -> dict[str, Any]:
    """What made the run: device, date, commit, command, versions, and whether FA4 imports (why not)."""
    import torch

    from baselines import fa4
    mod, why = fa4.load()
    try:
        from importlib.metadata import version
        cutlass = version("nvidia-cutlass-dsl")
    except Exception:  # noqa: BLE001
        cutlass = ""
    return {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": _commit(), "command": os.environ.get("PEERS_COMMAND", "python -m bench peers run " +
                                                           " ".join(argv)),
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "fa4_version": fa4.version(),
            "cutlass_dsl": cutlass, "fa4_importable": mod is not None, "fa4_why": why,
            "tilelang": TILELANG_ABSENT, "cache_dir": os.environ.get("PTSOLVE_CACHE_DIR", "")}


def main(argv: list[str] | None = None) -> int:
    from bench.peers.report import report
    from bench.peers.suite import rows, select
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench peers run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=Path, default=ROOT / ".cubin_peers" / "plans.json")
    ap.add_argument("--out", type=Path, required=True, help="the JSON; the markdown goes beside it (.md)")
    ap.add_argument("--only", default="", help="rows whose name contains one of these comma-separated parts")
    ap.add_argument("--limit", type=int, default=0, help="at most N rows of each workload (a smoke run)")
    ap.add_argument("--budget-s", type=float, default=0.0, help="start no row after this many seconds (0: none)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block-ms", type=float, default=1.0)
    ap.add_argument("--skip", default="", help="candidates not to run, comma-separated (e.g. fa4): absent")
    a = ap.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    plans = json.loads(a.plans.read_text()) if a.plans.exists() else None
    res: dict[str, Any] = {**meta(argv), "plans": str(a.plans) if plans else "", "rows": [], "not_run": []}
    t0 = time.time()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for row in select(rows(), a.only, a.limit):
        if a.budget_s and time.time() - t0 > a.budget_s:
            res["not_run"].append(row["name"])
            continue
        t1 = time.time()
        try:
            rec = run_row(row, plans, a.rounds, a.block_ms, tuple(x for x in a.skip.split(",") if x))
        except Exception as e:  # noqa: BLE001  (one row's failure is recorded; the others still run)
            rec = {"name": row["name"], "workload": row["workload"], "shape": row["shape"], "ptsolve_us": None,
                   "exact_us": None, "peers": {}, "max_abs_err": None, "ok": False,
                   "error": f"{type(e).__name__}: {str(e)[:300]}"}
        rec["row_s"] = round(time.time() - t1, 2)
        res["rows"].append(rec)
        torch.cuda.empty_cache()
        print(rec["name"], {k: round(v, 1) for k, v in [("ptsolve", rec["ptsolve_us"]), ("exact", rec["exact_us"]),
                                                        *rec["peers"].items()] if v is not None},
              f"err {rec['max_abs_err']} ok {rec['ok']} {rec['row_s']} s", rec.get("error", ""), flush=True)
        res["wall_s"] = round(time.time() - t0, 1)
        a.out.write_text(json.dumps(res, indent=1, sort_keys=True))
    a.out.with_suffix(".md").write_text(report(res))
    print(f"wrote {a.out} and {a.out.with_suffix('.md')} ({res['wall_s'] if res['rows'] else 0} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
