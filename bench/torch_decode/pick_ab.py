"""Does the model's decode choice pay? For every decode shape whose binary or piece count the cost model now chooses
differently from the run it replaces (``device/torch_decode.json``: the one-CTA binaries, the pieces of the model
before co-resident CTAs shared DRAM among the busy SMs and before the merge CTAs' tail), both launches side by side in
one process (CUDA graphs, inputs rotating past the L2, outputs checked against float32 first), with SDPA-cuDNN; plus
GPT-2 at its own context length (b16, 1024 keys).

    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_decode pick_ab run --out $OUT/pick_ab.json   # GPU
    python -m bench torch_decode pick_ab --report results/torch_decode/device_pick/pick_ab.json

``wg`` instead of ``run``: the shapes of two-warpgroup classes (more than 64 packed rows: Falcon-7B's 71 heads per kv
head) on their binary at its pieces, and on the one-warpgroup binaries (the rows cut into 64-row query tiles) at the
pieces the model picks for each, with the model's predictions (``--out $OUT/wg_ab.json``).
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2] / "results/torch_decode"  # the study's data
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

EXTRA = {"dec_gpt2_b16_q1_k1024": {"batch": 16, "heads": 12, "kv_heads": 12, "seq_q": 1, "seq_kv": 1024,
                                   "head_dim": 64, "causal": False}}


def choices(before: str = "device") -> dict[str, tuple[dict[str, Any], Any, int, Any, int]]:
    """name -> (params, old binary, old pieces, new binary, new pieces) where they differ; the old ones those of the
    run in folder ``before`` (its torch_decode.json; a run without a ``binary`` per shape ran the class's own)."""
    from bench.torch_decode.torch_decode import shapes
    from ptsolve import serve
    ran = json.loads((HERE / before / "torch_decode.json").read_text())["shapes"]
    out = {}
    for name, p in (shapes() | EXTRA).items():
        p = p | {"dtype": "fp16"}
        c = serve.decode_class("fp16", p["head_dim"], p["causal"], p["heads"], p["kv_heads"], p["seq_q"])
        was = ran.get(name, {})
        old = was.get("splits", 1)  # GPT-2 b16 k1024: one piece (results/torch_decode)
        ob = next(v for v in serve.decode_variants(c) if v.key == was.get("binary", c.key))
        v, s = serve.decode_pick(c, p)
        if (v, s) != (ob, old):
            out[name] = (p, ob, old, v, s)
    return out


def wg_choices() -> dict[str, tuple[dict[str, Any], Any, dict[str, tuple[Any, int, float]]]]:
    """name -> (params, class, {tag: (binary, pieces, predicted µs)}) for the shapes of two-warpgroup classes: their
    own binary and the one-warpgroup ones (``ptsolve.serve.decode_variants`` of the class with ``groups`` 1)."""
    import dataclasses

    from bench.torch_decode.torch_decode import shapes
    from ptsolve import serve
    out = {}
    for name, p in shapes().items():
        p = p | {"dtype": "fp16"}
        c = serve.decode_class("fp16", p["head_dim"], p["causal"], p["heads"], p["kv_heads"], p["seq_q"])
        if c.groups != 2:
            continue
        cands = {}
        for v in [c, *serve.decode_variants(dataclasses.replace(c, groups=1))]:
            us, s = serve.decode._decode_best(v, p)
            cands[v.key.split("/", 2)[2]] = (v, s, us)
        out[name] = (p, c, cands)
    return out


def run(out: Path, wg: bool = False, before: str = "device") -> None:
    import torch

    from bench.decode.decode_bench import refs, sdpa_fns, timing_sets
    from codegen.harness import time_many
    from ptsolve import serve
    chosen = serve.decode_pick
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "torch": torch.__version__, "shapes": {}}
    todo = ({n: (p, c, {t: (v, s) for t, (v, s, _) in cs.items()}) for n, (p, c, cs) in wg_choices().items()} if wg
            else {n: (p, ob, {"old": (ob, old), "new": (v, s)}) for n, (p, ob, old, v, s) in choices(before).items()})
    for name, (p, c, cands) in todo.items():
        torch.manual_seed(0)
        sets, _ = timing_sets(p)
        hi, lo = refs(*sets[0][:3], p["causal"])
        base = float((lo.float() - hi).abs().max())
        scale = p["head_dim"] ** -0.5
        fns, bad = {}, []
        for tag, pick in cands.items():
            serve.decode_pick = lambda c_, p_, pick=pick: pick  # this binary and piece count, whatever the model says
            try:
                lns = [serve.decode._decode_prepare(*x[:3], c, scale, None)[0] for x in sets]
            finally:
                serve.decode_pick = chosen
            lns[0](serve.current_stream(0), sets[0][3].data_ptr())
            torch.cuda.synchronize()
            if not float((sets[0][3].float() - hi).abs().max()) <= 2 * base + 1e-3:
                bad.append(tag)
            fns[tag] = lambda i, lns=lns, s_=sets: lns[i](serve.current_stream(0), s_[i][3].data_ptr())
        ctxs = {}
        for n, (fn, ctx) in sdpa_fns(p, sets, nc=True).items():
            if fn is not None and n in ("sdpa_cudnn", "sdpa_cudnn_nc"):
                fns[n], ctxs[n] = fn, ctx
        ms = time_many(fns, len(sets), ctxs=ctxs, graphs=True, rounds=11, block_ms=1.0)
        res["shapes"][name] = {"params": p, "bad": bad, "us": {n: t * 1e3 for n, t in ms.items()},
                               **{tag: [v.key, s] for tag, (v, s) in cands.items()}}
        print(name, {tag: [v.key, s] for tag, (v, s) in cands.items()}, bad,
              {n: round(t * 1e3, 1) for n, t in ms.items()}, flush=True)
        out.write_text(json.dumps(res, indent=1, sort_keys=True))
        del sets, hi, lo
        torch.cuda.empty_cache()
    print(wg_report(res) if wg else report(res))


def wg_report(res: dict[str, Any]) -> str:
    """Measured µs of each binary at its pieces, per two-warpgroup shape, and cuDNN."""
    cols = {"wg2": "two warpgroups", "wg1": "one warpgroup", "wg1/ctas2": "one warpgroup, 2 CTAs/SM"}
    rows = ["| shape | " + " | ".join(f"{c} µs (pieces)" for c in cols.values()) + " | cuDNN µs |",
            "|---|" + "---|" * (len(cols) + 1)]
    for name, x in sorted(res["shapes"].items()):
        u = x["us"]
        cu = u.get("sdpa_cudnn", u.get("sdpa_cudnn_nc", math.nan))
        tag = {t.split("/", 2)[2]: t for t in u if not t.startswith("sdpa")}  # "d64/full/wg1" -> "wg1"
        rows.append(f"| {name} | " + " | ".join(f"{u[tag[c]]:.1f} ({x[tag[c]][1]})" for c in cols) + f" | {cu:.1f} |"
                    + (f" bad: {x['bad']}" if x["bad"] else ""))
    return "\n".join(rows)


def report(res: dict[str, Any]) -> str:
    from bench.torch_decode.torch_decode import binary_note
    rows = ["| shape | before: pieces | µs | now: pieces | µs | before / now | cuDNN µs | cuDNN / now |",
            "|---|---|---|---|---|---|---|---|"]
    r = []
    for name, x in sorted(res["shapes"].items()):
        u = x["us"]
        cu = u.get("sdpa_cudnn", u.get("sdpa_cudnn_nc", math.nan))
        r.append(u["old"] / u["new"])
        tag = [f"{k[1]}{binary_note(k[0])}" for k in (x["old"], x["new"])]
        rows.append(f"| {name} | {tag[0]} | {u['old']:.1f} | {tag[1]} | {u['new']:.1f} | {u['old'] / u['new']:.3f} | "
                    f"{cu:.1f} | {cu / u['new']:.3f} |" + (f" bad: {x['bad']}" if x["bad"] else ""))
    geo = math.exp(sum(map(math.log, r)) / len(r))
    return "\n".join(rows) + (f"\n\nbefore / now over {len(r)} shapes: geomean {geo:.3f}, min {min(r):.3f}, "
                              f"{sum(x >= 1 for x in r)} faster now")


if __name__ == "__main__":
    if "--report" in sys.argv:
        r = json.loads(Path(sys.argv[sys.argv.index("--report") + 1]).read_text())
        print(wg_report(r) if "wg" in sys.argv[1:] else report(r))
    elif sys.argv[1] == "wg-list":
        for n, (_, _c, cs) in wg_choices().items():
            print(n, {t: (s, round(us, 1)) for t, (_, s, us) in cs.items()})
    elif sys.argv[1] == "list":
        for n, (_, c, old, v, s) in choices(*sys.argv[2:3]).items():
            print(n, c.key, old, "->", v.key, s)
    else:
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.parent.mkdir(parents=True, exist_ok=True)
        run(o, wg=sys.argv[1] == "wg",
            before=sys.argv[sys.argv.index("--before") + 1] if "--before" in sys.argv else "device")
