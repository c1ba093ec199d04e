"""The held-out GEMM table: per shape cuBLAS, the model's first choice (c0: optimize's answer) and the measured best
of its 3 best (tune), as cuBLAS time / ours; the geomeans.

    python -m bench gemm_heldout report results/gemm_heldout/device/gemm_space.json results/gemm_heldout/cands.json
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gemm_space.gemm_space import HELDOUT, _tiling  # noqa: E402


def main(run: Path, cands: Path) -> None:
    res, cd = json.loads(run.read_text())["shapes"], json.loads(cands.read_text())["shapes"]
    print("| shape | MxNxK | cuBLAS µs | first choice µs (cuBLAS / it) | its tiling | predicted µs | "
          "best of 3 µs (cuBLAS / it) |")
    print("|---|---|---|---|---|---|---|")
    first, best = [], []
    for name, M, N, K, _ in HELDOUT:
        if name not in res:
            continue
        us, c = res[name]["us"], cd[name]["cands"]
        cub = us["cublas"]
        b = min((k for k in us if k != "cublas"), key=us.get)
        first.append(cub / us["heldout_c0"])
        best.append(cub / us[b])
        print(f"| {name} | {M}x{N}x{K} | {cub:.1f} | {us['heldout_c0']:.1f} ({first[-1]:.3f}) | "
              f"{_tiling(c['heldout_c0']['tiling'])} | {c['heldout_c0']['predicted_us']:.1f} | "
              f"{us[b]:.1f} ({best[-1]:.3f}) |")
    geo = [math.exp(sum(map(math.log, x)) / len(x)) for x in (first, best)]
    print(f"\nGeomean cuBLAS / ours over {len(first)} shapes: first choice {geo[0]:.3f}, best of 3 {geo[1]:.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
