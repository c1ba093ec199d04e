"""The GEMM schedule space against cuBLAS: ptsolve's chosen kernel per shape, timed next to ``torch.matmul``.

CPU (solver, nvcc; the candidates travel with the repository, the cubins in the cache)::

    python -m bench gemm_space prepare --tag after --out results/gemm_space_h200/cands_after.json

For every shape of ``SHAPES`` (the paper's four GEMMs and the GEMM list of ``../shared/shapes.md``): the schedule
``ptsolve.optimize(gemm, hw)`` returns (CP-SAT, compile-checked), its tiling and predicted time, and the same
search restricted to the tilings without split-K (``splits`` = 1) for the "what split-K buys" column.

GPU (one call; no solver needed)::

    python -m bench gemm_space run results/gemm_space_h200/cands_*.json --out $OUT

Every distinct kernel is checked at the full shape against a float32 product (output poisoned with NaN, relative
Frobenius error <= 1e-2), then all of a shape's kernels and cuBLAS (``torch.matmul(a, b.T)``) are timed in one
``time_many`` call (CUDA graphs, interleaved rounds, median). Writes ``gemm_space.json``; ``report`` turns it
into the markdown table.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ptsolve.suites import GEMMS

# (name, M, N, K, set): "paper" = ptsolve.suites.GEMMS; "llm" = M tokens x the N x K projections of shapes.md;
# "square" / "odd" = the other GEMM shapes of shapes.md (16384³ left out: one call's budget)
_NK = ((4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672), (1024, 4096), (151936, 3584))
SHAPES: tuple[tuple[str, int, int, int, str], ...] = (
    *((f"GEMM{i}", m, n, k, "paper") for i, (m, n, k) in enumerate(GEMMS)),
    *((f"M{m}_{n}x{k}", m, n, k, "llm") for m in (1, 16, 128, 1024, 4096) for n, k in _NK),
    *((f"sq{s}", s, s, s, "square") for s in (1024, 2048, 4096, 8192)),
    ("odd1000", 1000, 1000, 1000, "odd"),
    ("odd4095x4097x1024", 4095, 4097, 1024, "odd"),
)


# held out ("heldout"): GEMMs of neither the paper nor shapes.md, for checking what was tuned on SHAPES (results/
# gemm_heldout); only run when named (--only)
HELDOUT: tuple[tuple[str, int, int, int, str], ...] = tuple((f"H_{m}x{n}x{k}", m, n, k, "heldout") for m, n, k in (
    (512, 11008, 4096),    # Llama-2-7B up-projection, 512 tokens
    (4096, 3072, 768),     # BERT-base FFN in, 32 x 128 tokens
    (4096, 768, 3072),     # BERT-base FFN out
    (77, 4096, 14336),     # Mistral-7B down-projection, 77 tokens (ragged)
    (333, 4608, 3584),     # Qwen2.5-7B fused QKV, 333 tokens
    (1024, 50304, 768),    # GPT-2 LM head (vocabulary padded to 64)
    (3000, 3000, 3000),    # odd square
    (2048, 2048, 8192),    # deep K
    (8, 8192, 8192),       # skinny, batch-8 decode projection
    (257, 1024, 1024),     # ragged small
    (96, 12288, 12288),    # GPT-3-size projection, 96 tokens
    (6144, 6144, 2048),    # wide, shallow K
))


def shapes(only: tuple[str, ...] = ()) -> list[tuple[str, int, int, int, str]]:
    """SHAPES, or the shapes of SHAPES and HELDOUT named in ``only``."""
    return [s for s in (*SHAPES, *HELDOUT) if s[0] in only] if only else list(SHAPES)


def prepare(out: Path, tag: str, hw: str = "h200", only: tuple[str, ...] = (), base: bool = True,
            executor: str = "serial", top_k: int = 0, pingpong: bool = False,
            probes: tuple[dict[str, int], ...] = (), per: tuple[str, ...] = ()) -> dict[str, Any]:
    """Solve every shape (the full space and, when ``base``, the space without split-K; with ``top_k``, instead the
    model's ``top_k`` best compile-clean tilings, labelled ``<tag>_c<rank>``, for a measured selection); write the
    JSON. ``pingpong``: the full space (``<tag>``), its cooperative part (``<tag>_coop``) and its ping-pong part
    (``<tag>_ping``), and with ``top_k`` the ping-pong part's ``top_k`` best (``<tag>_ping_c<rank>``) too.
    ``probes``: only these tilings (each fixed whole, where the shape's space has it; ``<tag>_probe<k>``), as
    measurement probes beside the model's choices, not instead of them. ``per`` (with ``top_k``): the candidates
    ``ptsolve tune --per`` times, the ``top_k`` best of each value combination of these tiling keys."""
    import ptsolve
    from codegen.plan import plan_from_program
    from ptsolve.errors import PtsolveError
    from ptsolve.provenance import stamp

    doc: dict[str, Any] = {"hw": hw, "tag": tag, "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
                           "commit": stamp()["commit"], "shapes": {}}
    for name, M, N, K, kind in shapes(only):
        e: dict[str, Any] = {"M": M, "N": N, "K": K, "set": kind, "cands": {}}
        spaces: dict[str, dict[str, int] | None] = {tag: None}
        if base:
            spaces[f"{tag}_nosplit"] = {"splits": 1}
        if pingpong:
            spaces = {tag: None, f"{tag}_coop": {"pingpong": 0}, f"{tag}_ping": {"pingpong": 1}}
        if probes:
            spaces = {f"{tag}_probe{k}": dict(t) for k, t in enumerate(probes)}
        if top_k:  # measured selection (ptsolve tune's procedure): the model's top_k compile-clean tilings
            from ptsolve.tune import candidates
            pre, fx = (f"{tag}_ping", {"pingpong": 1}) if pingpong else (tag, None)
            try:
                cands, _ = candidates(ptsolve.ops.gemm(M=M, N=N, K=K), hw, top_k, fix=fx, per=per)
                for c in cands:
                    e["cands"][f"{pre}_c{c.rank}"] = {
                        "tiling": dict(c.result.program.graph.tiling), "predicted_us": c.result.predicted_us,
                        "status": c.result.status, "check": c.check.status,
                        "plan": plan_from_program(c.result.program, hw).to_json()}
            except PtsolveError as ex:
                e["cands"][f"{pre}_c0"] = {"error": f"{type(ex).__name__}: {ex}"}
            if not pingpong:
                spaces = {}
        for label, fix in spaces.items():
            try:
                # no result cache: the cached schedules may predate the space's current structures
                r = ptsolve.optimize(ptsolve.ops.gemm(M=M, N=N, K=K), hw=hw, fix=fix, cache=False, executor=executor)
                e["cands"][label] = {"tiling": dict(r.program.graph.tiling), "predicted_us": r.predicted_us,
                                     "status": r.status, "check": (r.kernel_check or {}).get("status"),
                                     "plan": plan_from_program(r.program, hw).to_json()}
            except PtsolveError as ex:
                e["cands"][label] = {"error": f"{type(ex).__name__}: {ex}"}
        if pingpong or probes:  # a plan found twice is timed once: the later label names the first ("same_as")
            seen: dict[str, str] = {}
            for label in sorted(e["cands"], key=lambda k: (k == tag, k)):
                plan = e["cands"][label].get("plan")
                if plan in seen:
                    e["cands"][label]["same_as"] = seen[plan]
                    del e["cands"][label]["plan"]
                elif plan:
                    seen[plan] = label
        doc["shapes"][name] = e
        print(name, {k: (v.get("tiling"), round(v["predicted_us"], 1)) if "tiling" in v else v["error"][:80]
                     for k, v in e["cands"].items()}, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    return doc


def _plans(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """shape -> label -> KernelPlan, over every candidates file (labels are the files' tags)."""
    from codegen.plan import KernelPlan
    out: dict[str, dict[str, Any]] = {}
    for d in docs:
        for name, e in d["shapes"].items():
            for label, c in e["cands"].items():
                if "plan" in c:
                    out.setdefault(name, {})[label] = KernelPlan.from_json(c["plan"])
    return out


def precompile(docs: list[dict[str, Any]]) -> int:
    """Compile every kernel the run launches into $PTSOLVE_CACHE_DIR; returns how many distinct ones."""
    from codegen.harness import precompile as pc
    plans = [p for v in _plans(docs).values() for p in v.values()]
    pc(plans)
    return len(plans)


def run(paths: list[Path], out: Path, only: tuple[str, ...] = ()) -> int:
    """Check and time every shape's kernels next to cuBLAS; write gemm_space.json (after every shape)."""
    import torch

    from codegen.cuda import emit
    from codegen.harness import TOL, precompile, rel_err, time_many
    from codegen.runtime import load

    docs = [json.loads(p.read_text()) for p in paths]
    plans = _plans(docs)
    t0 = time.time()
    precompile([p for v in plans.values() for p in v.values()])
    print(f"compiled/loaded {sum(map(len, plans.values()))} plans in {time.time() - t0:.0f} s", flush=True)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()), "shapes": {}}
    torch.backends.cuda.matmul.allow_tf32 = False
    ok_all = True
    for name, M, N, K, kind in shapes(only):
        if name not in plans:
            continue
        tdt = torch.float16
        sets = [(torch.randn(M, K, device="cuda", dtype=tdt), torch.randn(N, K, device="cuda", dtype=tdt))
                for _ in range(2)]
        c = torch.empty(M, N, device="cuda", dtype=tdt)
        ref = sets[0][0].float() @ sets[0][1].float().T
        fns, checks = {}, {}
        kern = {label: load(emit(p)) for label, p in plans[name].items()}
        for label, kk in kern.items():
            ptrs = [{"a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr()} for a, b in sets]
            c.fill_(float("nan"))
            kk.launch(ptrs[0], int(torch.cuda.current_stream().cuda_stream))
            torch.cuda.synchronize()
            err = rel_err(c, ref)
            checks[label] = {"rel_err": err, "ok": bool(err <= TOL)}
            ok_all &= checks[label]["ok"]
            if checks[label]["ok"]:
                fns[label] = (lambda i, kk=kk, ptrs=ptrs:
                              kk.launch(ptrs[i], int(torch.cuda.current_stream().cuda_stream)))
        del ref
        fns["cublas"] = lambda i, sets=sets: torch.matmul(sets[i][0], sets[i][1].T)
        ms = time_many(fns, 2, graphs=True)
        res["shapes"][name] = {"M": M, "N": N, "K": K, "set": kind, "checks": checks,
                               "us": {k: v * 1e3 for k, v in ms.items()}}
        print(f"{name}: cublas {ms['cublas'] * 1e3:.1f} µs; " + ", ".join(
            f"{k} {v * 1e3:.1f} ({ms['cublas'] / v:.3f}x)" for k, v in ms.items() if k != "cublas")
            + "".join(f"; {k} FAILED check {v['rel_err']:.2e}" for k, v in checks.items() if not v["ok"]), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gemm_space.json").write_text(json.dumps(res, indent=1))
    print(f"done in {time.time() - t0:.0f} s")
    return 0 if ok_all else 1


def _geo(xs: list[float]) -> float:
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _tiling(t: dict[str, Any]) -> str:
    s = f"{t['BM']}x{t['BN']} d{t['depth']} g{t['groups']}"
    return s + (f" **split{t['splits']}**" if t.get("splits", 1) > 1 else "") + (" **pingpong**" if t.get("pingpong")
                                                                                 else "")


def report(cand_paths: list[Path], run_path: Path, meta: str = "") -> str:
    """Markdown: per shape cuBLAS, the schedule before split-K, the model's choice with it ("after"; the same as
    before where the space has no split tiling for the shape), the measured best of the model's top 3 (tune), ratios
    (cuBLAS time / ours: > 1 is faster than cuBLAS), the predicted and measured gain of the split choice; geomeans."""
    cands: dict[str, dict[str, Any]] = {}
    for p in cand_paths:
        for name, e in json.loads(p.read_text())["shapes"].items():
            cands.setdefault(name, {}).update(e["cands"])
    res = json.loads(run_path.read_text())
    rows, ratios = [], {"before": {}, "after": {}, "tune": {}}
    for name, M, N, K, kind in SHAPES:
        r = res["shapes"].get(name)
        if r is None:
            continue
        us, c = r["us"], cands.get(name, {})
        cub = us["cublas"]
        # the model's first choice in the space with split-K: "after" where the space has split tilings for the
        # shape; else the old choice (same space, same model), or the top-1 candidate where the old space refused it
        after = next((k for k in ("after", "before", "tune_c0") if k in us), "after")
        tl = [k for k in us if k.startswith("tune_c")]
        best = min(tl, key=lambda k: us[k]) if tl else None
        for col, lab in (("before", "before"), ("after", after), ("tune", best)):
            if lab in us:
                ratios[col][name] = cub / us[lab]

        def cell(lab: str | None, us: dict[str, float] = us, cub: float = cub) -> str:
            return f"{us[lab]:.1f} ({cub / us[lab]:.3f})" if lab in us else "-"
        pb, pa = (c.get(k, {}).get("predicted_us") for k in ("before", after))
        gain_p = f"{pb / pa:.2f}" if pb and pa else "-"
        gain_m = f"{us['before'] / us[after]:.2f}" if "before" in us and after in us else "-"
        chose = _tiling(c[after]["tiling"]) if "tiling" in c.get(after, {}) else c.get(after, {}).get("error", "-")
        rows.append(f"| {name} | {kind} | {M}x{N}x{K} | {cub:.1f} | {cell('before')} | {cell(after)} | {chose} | "
                    f"{gain_p} / {gain_m} | {cell(best)} | {_tiling(c[best]['tiling']) if best else '-'} |")
    out = [meta, "", "Times in µs (median of interleaved CUDA-graph rounds, one process); in brackets cuBLAS time / "
           "ours (> 1: faster than cuBLAS). before: ptsolve's choice without split-K (the space as it was); after: "
           "ptsolve's choice (CP-SAT + compile check) in the space with split-K (where the space has no split tiling "
           "for the shape, the space and the choice are the old ones, timed once); gain: before / after, predicted "
           "by the model / measured; tune: the measured best of the model's 3 best compile-clean tilings "
           "(`ptsolve tune`'s procedure).", "",
           "| shape | set | MxNxK | cuBLAS | before | after | after's structure | gain pred / meas | tune | tune's "
           "tiling |", "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
           "| geomean of cuBLAS / ours | shapes | before | after | tune |", "|---|---|---|---|---|"]
    for label, sel in (("paper (GEMM0-3)", {"paper"}), ("shapes.md (LLM, square, odd)", {"llm", "square", "odd"}),
                       ("shapes.md without 4095x4097x1024 (cuBLAS's outlier)", {"llm", "square", "odd1000"}),
                       ("skinny M (1, 16, 128)", None), ("all", {"paper", "llm", "square", "odd"}),
                       ("all without 4095x4097x1024", {"paper", "llm", "square", "odd1000"})):
        names = [n for n, M, _, _, k in SHAPES if (k in sel or n in sel if sel else (k == "llm" and M <= 128))]
        cols = [_geo([ratios[c][n] for n in names if n in ratios[c]]) for c in ("before", "after", "tune")]
        cnt = len([n for n in names if n in ratios["after"]])
        out.append(f"| {label} | {cnt} | " + " | ".join(f"{x:.3f}" for x in cols) + " |")
    out += ["", "(before: over the shapes the old space accepted; odd N was refused.)"]
    return "\n".join(out) + "\n"


def report_pingpong(cand_paths: list[Path], run_path: Path, tag: str = "pp") -> str:
    """Markdown for the ping-pong candidates (``prepare --pingpong``): per shape cuBLAS, the model's cooperative
    choice (``<tag>_coop``), its best ping-pong tiling (``<tag>_ping``), the measured best of its ping-pong top 3,
    the model's choice in the whole space (``<tag>``: which structure it took), the predicted and measured gain of
    ping-pong over the cooperative choice, the measured best of the model's 3 best cooperative (``tune_c*``, from a
    ``--top-k`` candidates file) and 3 best ping-pong tilings; ratios are cuBLAS time / ours; geomeans."""
    cands: dict[str, dict[str, Any]] = {}
    for p in cand_paths:
        for name, e in json.loads(p.read_text())["shapes"].items():
            cands.setdefault(name, {}).update(e["cands"])
    res = json.loads(run_path.read_text())
    rows = []
    cols = ("coop", "ping", "pingbest", "probe", "model", "tune", "best")
    ratios: dict[str, dict[str, float]] = {c: {} for c in cols}
    chose_pp = []
    for name, M, N, K, _kind in SHAPES:
        r = res["shapes"].get(name)
        if r is None:
            continue
        us, c = r["us"], cands.get(name, {})
        cub = us["cublas"]

        def timed(k: str, c: dict[str, Any] = c) -> str:
            """The label whose kernel was timed for ``k`` (a plan found twice is timed once, ``same_as``)."""
            return c.get(k, {}).get("same_as", k)
        coop, ping, model = timed(f"{tag}_coop"), timed(f"{tag}_ping"), timed(tag)
        tops = sorted({timed(k) for k in c if k.startswith(f"{tag}_ping_c")} & set(us))
        pbest = min(tops, key=lambda k: us[k]) if tops else None
        probes = sorted({timed(k) for k in c if k.startswith(f"{tag}_probe")} & set(us))
        qbest = min(probes, key=lambda k: us[k]) if probes else None
        # the measured selection over both structures: the model's 3 best cooperative (tune_c*) and ping-pong tilings
        both = sorted(({timed(k) for k in c if k.startswith("tune_c")} & set(us)) | set(tops))
        tbest = min(both, key=lambda k: us[k]) if both else None
        pp = bool(c.get(tag, {}).get("tiling", {}).get("pingpong"))
        if pp:
            chose_pp.append(name)
        everything = [k for k in (coop, ping, *tops, *probes, *both) if k in us]
        lab = {"coop": coop, "ping": ping, "pingbest": pbest, "probe": qbest, "model": model, "tune": tbest,
               "best": min(everything, key=lambda k: us[k]) if everything else None}
        for col, k in lab.items():
            if k in us:
                ratios[col][name] = cub / us[k]

        def cell(k: str | None, us: dict[str, float] = us, cub: float = cub) -> str:
            return f"{us[k]:.1f} ({cub / us[k]:.3f})" if k in us else "-"

        def tl(k: str | None, c: dict[str, Any] = c) -> str:
            return _tiling(c[k]["tiling"]) if k and "tiling" in c.get(k, {}) else "-"
        pc, pp_ = (c.get(k, {}).get("predicted_us") for k in (coop, ping))
        gain = (f"{pc / pp_:.2f}" if pc and pp_ else "-") + " / " + (
            f"{us[coop] / us[ping]:.2f}" if coop in us and ping in us else "-")
        rows.append(f"| {name} | {M}x{N}x{K} | {cub:.1f} | {cell(coop)} | {tl(coop)} | {cell(ping)} | {tl(ping)} | "
                    f"{gain} | {cell(pbest)} | {tl(pbest)} | {cell(qbest)} | {tl(qbest)} | "
                    f"{'**ping-pong**' if pp else 'coop'} | {cell(tbest)} | {tl(tbest)} |")
    out = ["| shape | MxNxK | cuBLAS | coop | coop tiling | ping-pong | ping-pong tiling | gain pred / meas | "
           "ping-pong best of 3 | its tiling | probes' best | its tiling | model's choice | tune (3 + 3) | "
           "its tiling |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
           "| geomean of cuBLAS / ours | shapes | coop | ping-pong | ping-pong best of 3 | probes' best | "
           "model's choice | tune (3 + 3) | best of all |", "|---|---|---|---|---|---|---|---|---|"]
    for label, sel in (("paper (GEMM0-3)", {"paper"}), ("shapes.md (LLM, square, odd)", {"llm", "square", "odd"}),
                       ("skinny M (1, 16, 128)", None), ("M >= 1024 and square", {"big"}),
                       ("all", {"paper", "llm", "square", "odd"}),
                       ("all without 4095x4097x1024", {"paper", "llm", "square", "odd1000"})):
        if sel == {"big"}:
            names = [n for n, M, _, _, k in SHAPES if M >= 1000 and n != "odd4095x4097x1024"]
        else:
            names = [n for n, M, _, _, k in SHAPES if (k in sel or n in sel if sel else (k == "llm" and M <= 128))]
        vals = [_geo([ratios[col][n] for n in names if n in ratios[col]]) for col in cols]
        out.append(f"| {label} | {len([n for n in names if n in ratios['model']])} | "
                   + " | ".join(f"{v:.3f}" for v in vals)
                   + " |")
    out += ["", f"The model chose ping-pong for {len(chose_pp)} shape(s): {', '.join(chose_pp) or 'none'}."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench gemm_space", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tag", default="after")
    p.add_argument("--hw", default="h200")
    p.add_argument("--only", default="")
    p.add_argument("--no-base", action="store_true", help="skip the search without split-K")
    p.add_argument("--executor", default="serial", help="ptsolve.optimize's executor (serial: few CPUs)")
    p.add_argument("--top-k", type=int, default=0, help="the model's K best tilings instead (measured selection)")
    p.add_argument("--probe", action="append", default=[], help="a whole tiling to time as a probe, e.g. "
                   "BM=128,BN=128,BK=64,depth=4,groups=1,splits=1,pingpong=1 (repeatable)")
    p.add_argument("--per", default="", help="with --top-k: the K best of each value of these tiling keys "
                   "(comma-separated, e.g. pingpong: ptsolve tune --per's candidates)")
    p.add_argument("--pingpong", action="store_true", help="the whole space, its cooperative and its ping-pong "
                   "parts (with --top-k: the ping-pong part's K best too)")
    c = sub.add_parser("precompile")
    c.add_argument("cands", type=Path, nargs="+")
    r = sub.add_parser("run")
    r.add_argument("cands", type=Path, nargs="+")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", default="")
    rp = sub.add_parser("report")
    rp.add_argument("run", type=Path, help="gemm_space.json of a run")
    rp.add_argument("cands", type=Path, nargs="+")
    rp.add_argument("--meta", default="", help="markdown put above the table (device, date, commit, command)")
    rp.add_argument("--pingpong", default="", help="the ping-pong table of the candidates of this tag instead")
    a = ap.parse_args(argv)
    if a.cmd == "report":
        print(report_pingpong(a.cands, a.run, a.pingpong) if a.pingpong else report(a.cands, a.run, a.meta))
        return 0
    only = tuple(x for x in getattr(a, "only", "").split(",") if x)
    if a.cmd == "prepare":
        prepare(a.out, a.tag, a.hw, only, base=not a.no_base, executor=a.executor, top_k=a.top_k,
                pingpong=a.pingpong, probes=tuple({k: int(v) for k, v in (x.split("=") for x in pr.split(","))}
                                                  for pr in a.probe),
                per=tuple(x for x in a.per.split(",") if x))
        return 0
    if a.cmd == "precompile":
        print(precompile([json.loads(x.read_text()) for x in a.cands]), "plans compiled")
        return 0
    return run(a.cands, a.out, only)


if __name__ == "__main__":
    sys.exit(main())
