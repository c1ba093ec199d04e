"""Which generic attention binary should a prefill shape run? Each attention class's plan from a schedule table run
as the generic kernel on a grid and on persistent CTAs (the same plan, ``persistent`` 1: one CTA per SM dealing
itself the query tiles, longest first, its producer loading the next tile while the consumers finish the last), for
two tables (``--tables A B``: the shipped one at a commit and a file; a class whose plans agree is run once), on the
prefill shapes of ``torch_prefill.py``, next to SDPA-cuDNN, in one process (CUDA graphs, inputs rotating past the L2,
every output checked against float32 first).

    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_prefill variants_ab compile --tables A.json B.json
    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_prefill variants_ab run --tables A.json B.json --out $OUT/v

``--as-tabled`` (both steps): each plan only as its table has it (grid or persistent), not both.
"""
from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2] / "results/torch_prefill"  # the study's data
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))


def _table(src: str) -> dict[str, Any]:
    """A schedule table's classes: a file, else the shipped table at git revision ``src`` (where it was then)."""
    p = Path(src)
    if p.exists():
        return json.loads(p.read_text())["classes"]
    for path in ("ptsolve/serve/schedule_table.json", "codegen/schedule_table.json"):
        r = subprocess.run(["git", "show", f"{src}:{path}"], capture_output=True, text=True, cwd=ROOT)
        if r.returncode == 0:
            return json.loads(r.stdout)["classes"]
    raise FileNotFoundError(f"no schedule table at {src}")


def variants(c: Any, tables: list[dict[str, Any]], as_tabled: bool = False) -> dict[str, tuple[Any, Any]]:
    """tag -> (stand-in class, KernelPlan) for class ``c``: each table's plan, grid and persistent (``as_tabled``: only
    as the table has it); the stand-in classes differ in ``persistent`` (0, 1, 2, ...) only so that each binary has
    its own kernel and launch cache. A plan equal to an earlier table's (tiling and issue orders) is run once."""
    from codegen.plan import KernelPlan
    out: dict[str, tuple[Any, Any]] = {}
    seen: list[Any] = []
    for i, tb in enumerate(tables):
        d = tb[c.key]["plan"]
        if d in seen:
            continue
        seen.append(d)
        for pers in ((int(d["tiling"].get("persistent", 0)),) if as_tabled else (0, 1)):
            e = json.loads(json.dumps(d))
            e["tiling"].pop("persistent", None)
            if pers:
                e["tiling"]["persistent"] = 1
            out[f"{'persistent' if pers else 'grid'}{i}"] = (dataclasses.replace(c, persistent=len(out) + 1),
                                                              KernelPlan.from_json(json.dumps(e)))
    return out


def _classes() -> list[Any]:
    from bench.torch_prefill.torch_prefill import shapes
    from ptsolve import serve
    return sorted({serve.attention_class("fp16", p["head_dim"], p["causal"], p["heads"], p["kv_heads"])
                   for p in shapes().values()}, key=lambda c: c.key)


def prepare(tables: list[dict[str, Any]]) -> dict[Any, dict[str, tuple[Any, Any]]]:
    """Every class's variants, their generic kernels registered (``ptsolve.serve.kernels._KERNELS``)."""
    from ptsolve import serve
    out = {}
    for c in _classes():
        out[c] = variants(c, tables, "--as-tabled" in sys.argv)
        for fake, plan in out[c].values():
            serve.kernels._KERNELS[fake] = serve.kernels.build(fake, plan)
    return out


def compile_all(tables: list[dict[str, Any]]) -> None:
    from codegen.runtime import compile_kernel
    from ptsolve import serve
    for c, vs in prepare(tables).items():
        for tag, (fake, plan) in vs.items():
            rep = compile_kernel(serve.kernels._KERNELS[fake].ks).report
            print(c.key, tag, plan.tiling, {k: rep.get(k) for k in ("registers", "spill_stores", "wgmma_serialized")},
                  flush=True)


def run(tables: list[dict[str, Any]], out: Path) -> None:
    import torch

    from bench.decode.decode_bench import refs, sdpa_fns, timing_sets
    from bench.torch_prefill.torch_prefill import shapes
    from codegen.harness import time_many
    from ptsolve import serve
    vs = prepare(tables)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
                           "tilings": {c.key: {t: p.tiling for t, (_, p) in v.items()} for c, v in vs.items()},
                           "shapes": {}}
    for name, p in shapes().items():
        c = serve.attention_class("fp16", p["head_dim"], p["causal"], p["heads"], p["kv_heads"])
        torch.manual_seed(0)
        sets, _ = timing_sets(p)
        hi, lo = refs(*sets[0][:3], p["causal"])
        base = float((lo.float() - hi).abs().max())
        scale = p["head_dim"] ** -0.5
        fns, bad = {}, []
        for tag, (fake, _) in vs[c].items():
            serve.attention.attention(*sets[0][:3], sets[0][3], fake, scale)
            torch.cuda.synchronize()
            if not float((sets[0][3].float() - hi).abs().max()) <= 2 * base + 1e-3:
                bad.append(tag)
            fns[tag] = lambda i, s=sets, f=fake, sc=scale: serve.attention.attention(*s[i][:3], s[i][3], f, sc)
        del hi, lo
        ctxs = {}
        for n, (fn, ctx) in sdpa_fns(p, sets).items():
            if fn is not None and n == "sdpa_cudnn":
                fns[n], ctxs[n] = fn, ctx
        ms = time_many(fns, len(sets), ctxs=ctxs, graphs=True, rounds=11, block_ms=1.0)
        res["shapes"][name] = {"params": p, "class": c.key, "bad": bad, "us": {k: v * 1e3 for k, v in ms.items()}}
        print(name, bad, {k: round(v * 1e3, 1) for k, v in ms.items()}, flush=True)
        out.write_text(json.dumps(res, indent=1))
        del sets
        torch.cuda.empty_cache()
    print(report(res))


def report(res: dict[str, Any]) -> str:
    """Per shape each binary's µs and cuDNN's; summaries of cuDNN / each binary and of the best per shape."""
    tags = sorted({t for r in res["shapes"].values() for t in r["us"] if not t.startswith("sdpa")})
    rows = ["| shape | " + " | ".join(f"{t} µs" for t in tags) + " | cuDNN µs |", "|---|" + "---|" * (len(tags) + 1)]
    ratios: dict[str, list[float]] = {t: [] for t in tags}
    for n, r in res["shapes"].items():
        u = r["us"]
        rows.append(f"| {n} | " + " | ".join(f"{u[t]:.1f}" if t in u else "–" for t in tags)
                    + f" | {u['sdpa_cudnn']:.1f} |" + (f" bad: {r['bad']}" if r["bad"] else ""))
        for t in tags:
            ratios[t].append(u["sdpa_cudnn"] / u.get(t, u.get(t.rstrip("01") + "0", math.nan)))
    lines = []
    for t, x in ratios.items():
        geo = math.exp(sum(map(math.log, x)) / len(x))
        lines.append(f"cuDNN / {t} over {len(x)} shapes (a class without a second plan: its first): geomean "
                     f"{geo:.3f}, min {min(x):.3f}, {sum(v >= 0.9 for v in x)} at >= 0.9")
    return "\n".join(rows + [""] + lines)


if __name__ == "__main__":
    tabs = [_table(s) for s in sys.argv[sys.argv.index("--tables") + 1:][:2]] if "--tables" in sys.argv else []
    if "--out" in sys.argv:
        tabs = [_table(s) for s in sys.argv[sys.argv.index("--tables") + 1:sys.argv.index("--out")]]
    if sys.argv[1] == "compile":
        compile_all(tabs)
    elif sys.argv[1] == "--report":
        print(report(json.loads(Path(sys.argv[2]).read_text())))
    else:
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.parent.mkdir(parents=True, exist_ok=True)
        run(tabs, o)
