"""The tables of README §5 and §6: the 45 shapes' first choices of two candidate files timed in one gemm_space run,
next to cuBLAS. ``python -m bench gemm_skinny deepen_table`` (§5: ``flat`` against ``deepen``, device/deepen);
``python -m bench gemm_skinny deepen_table arows deepen arows`` (§6: device/arows)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/gemm_skinny"  # the study's data


def main(run_dir: str = "deepen", a: str = "flat", b: str = "deepen") -> None:
    run = json.loads((HERE / "device" / run_dir / "gemm_space.json").read_text())["shapes"]
    cands = {t: json.loads((HERE / f"cands_{t}.json").read_text())["shapes"] for t in (a, b)}
    print(f"| shape | first choice ({a} → {b}) | {a} µs | {b} µs | {b} / {a} | cuBLAS / {b} |")
    print("|---|---|---|---|---|---|")
    g: dict[str, list] = {k: [] for k in (a, b)}
    sets: dict[str, list[str]] = {}
    for name, x in run.items():
        us, cb = x["us"], x["us"]["cublas"]
        ta, tb = cands[a][name]["cands"][a]["tiling"], cands[b][name]["cands"][b]["tiling"]
        t = _name(ta) + ("" if tb == ta else f" → {_name(tb)}")
        ub = us.get(b, us[a])  # a plan found in both files is timed once, under the first label
        print(f"| {name} | {t} | {us[a]:.2f} | {ub:.2f} | {ub / us[a]:.3f} | {cb / ub:.3f} |")
        for k in g:
            g[k].append((name, cb / us.get(k, us[a])))
        sets.setdefault("all 45", []).append(name)
        if name.startswith(("M1_", "M16_", "M128_")):
            sets.setdefault("skinny M (1, 16, 128)", []).append(name)
        if name.startswith("GEMM"):
            sets.setdefault("paper", []).append(name)
        if name != "odd4095x4097x1024":
            sets.setdefault("all but odd4095x4097x1024", []).append(name)
    gm = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
    print(f"\n| geomean of cuBLAS / ours | shapes | {a} | {b} |\n|---|---|---|---|")
    for s, names in sets.items():
        print(f"| {s} | {len(names)} | " + " | ".join(f"{gm([r for n, r in g[k] if n in names]):.3f}" for k in g)
              + " |")
    print(f"\n8192³: {a} {dict(g[a])['sq8192']:.3f}, {b} {dict(g[b])['sq8192']:.3f}")


def _name(t: dict[str, int]) -> str:
    return (f"{t['BM']}x{t['BN']} g{t['groups']}" + (f" s{t['splits']}" if t.get("splits", 1) > 1 else "")
            + (" pp" if t.get("pingpong") else "") + f" d{t['depth']}")


if __name__ == "__main__":
    main(*sys.argv[1:])
