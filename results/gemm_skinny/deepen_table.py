"""The table of README §5: the 45 shapes' first choices without (``flat``) and with the ring deepening (``deepen``),
timed in one gemm_space run (device/deepen), next to cuBLAS. ``python3 results/gemm_skinny/deepen_table.py``."""
from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    run = json.loads((HERE / "device/deepen/gemm_space.json").read_text())["shapes"]
    cands = {t: json.loads((HERE / f"cands_{t}.json").read_text())["shapes"] for t in ("flat", "deepen")}
    print("| shape | first choice (depth flat → deepened) | flat µs | deepened µs | deepened / flat "
          "| cuBLAS / deepened |")
    print("|---|---|---|---|---|---|")
    g = {k: [] for k in ("flat", "deepen")}
    sets: dict[str, list[str]] = {}
    for name, x in run.items():
        us, cb = x["us"], x["us"]["cublas"]
        tf, td = cands["flat"][name]["cands"]["flat"]["tiling"], cands["deepen"][name]["cands"]["deepen"]["tiling"]
        t = (f"{tf['BM']}x{tf['BN']} g{tf['groups']}" + (f" s{tf['splits']}" if tf.get("splits", 1) > 1 else "")
             + (" pp" if tf.get("pingpong") else "") + f" d{tf['depth']}" + (f" → d{td['depth']}" if td != tf else ""))
        print(f"| {name} | {t} | {us['flat']:.2f} | {us['deepen']:.2f} | {us['deepen'] / us['flat']:.3f} | "
              f"{cb / us['deepen']:.3f} |")
        for k in g:
            g[k].append((name, cb / us[k]))
        sets.setdefault("all 45", []).append(name)
        if name.startswith(("M1_", "M16_", "M128_")):
            sets.setdefault("skinny M (1, 16, 128)", []).append(name)
        if name.startswith("GEMM"):
            sets.setdefault("paper", []).append(name)
        if name != "odd4095x4097x1024":
            sets.setdefault("all but odd4095x4097x1024", []).append(name)
    gm = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
    print("\n| geomean of cuBLAS / ours | shapes | flat | deepened |\n|---|---|---|---|")
    for s, names in sets.items():
        print(f"| {s} | {len(names)} | " + " | ".join(f"{gm([r for n, r in g[k] if n in names]):.3f}" for k in g)
              + " |")
    print(f"\n8192³: flat {dict(g['flat'])['sq8192']:.3f}, deepened {dict(g['deepen'])['sq8192']:.3f}")


if __name__ == "__main__":
    main()
