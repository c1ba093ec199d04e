"""The 45-shape GEMM table of results/gemm_reduce/README.md: the model's first choice and tune's pick
(results/depth_tie/cands_tie.json / cands_pick.json, unchanged plans) timed with the reduce CTAs (``space/``) next to
the same plans' run before them (results/depth_tie/device_tune/confirm), cuBLAS / ours per run.

    python -m bench gemm_reduce space_table
"""
from __future__ import annotations

import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOW = ROOT / "results/gemm_reduce/space/gemm_space.json"
BEFORE = ROOT / "results/depth_tie/device_tune/confirm/gemm_space.json"


def main() -> None:
    now, before = (json.loads(p.read_text())["shapes"] for p in (NOW, BEFORE))
    tie = json.loads((ROOT / "results/depth_tie/cands_tie.json").read_text())["shapes"]
    r = {k: {n: s["us"]["cublas"] / s["us"][k] for n, s in now.items()} for k in ("tie", "pick")}
    b = {k: {n: s["us"]["cublas"] / s["us"][k] for n, s in before.items() if k in s["us"]} for k in ("tie", "pick")}
    print("| shape | first choice (tiling) | before: first choice × | now: first choice × | now: tune's pick × |")
    print("|---|---|---|---|---|")
    for n in now:
        t = tie[n]["cands"]["tie"]["tiling"]
        desc = f"{t['BM']}x{t['BN']} d{t['depth']}" + (f" split{t['splits']}" if t.get("splits", 1) > 1 else "") + \
            (" pp" if t.get("pingpong") else "")
        print(f"| {n} | {desc} | {b['tie'].get(n, math.nan):.3f} | {r['tie'][n]:.3f} | {r['pick'][n]:.3f} |")

    def g(d: dict[str, float], keep) -> str:
        v = [x for n, x in d.items() if keep(n)]
        return f"{math.exp(sum(map(math.log, v)) / len(v)):.3f} ({len(v)})"
    print("\n| geomean of cuBLAS / ours | before: first choice | before: pick | now: first choice | now: pick |")
    print("|---|---|---|---|---|")
    for label, keep in (("all 45", lambda n: True), ("skinny M (1, 16, 128)", lambda n: now[n]["M"] <= 128),
                        ("paper", lambda n: now[n]["set"] == "paper"),
                        ("all but odd4095x4097x1024 (cuBLAS 3.7x off its own trend)",
                         lambda n: n != "odd4095x4097x1024")):
        print(f"| {label} | {g(b['tie'], keep)} | {g(b['pick'], keep)} | {g(r['tie'], keep)} | {g(r['pick'], keep)} |")
    print(f"\n8192³ (sq8192): first choice {r['tie']['sq8192']:.3f}×, pick {r['pick']['sq8192']:.3f}× cuBLAS")


if __name__ == "__main__":
    main()
