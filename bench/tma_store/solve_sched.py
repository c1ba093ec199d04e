"""The schedules results/tma_store/sched holds (what ``python -m bench tma_store device`` profiles): CP-SAT on the
h200 table, four GEMM tilings (cooperative and ping-pong, on a square and a short-N shape), each with the register
store and the TMA-store epilogue. ``python -m bench tma_store solve_sched``."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ptsolve  # noqa: E402

CASES = {
    "sq4096_coop": (4096, 4096, 4096, {"BM": 128, "BN": 256, "depth": 4, "groups": 2, "pingpong": 0}),
    "sq4096_ping": (4096, 4096, 4096, {"BM": 128, "BN": 192, "depth": 4, "groups": 1, "pingpong": 1}),
    "M4096_1024x4096_coop": (4096, 1024, 4096, {"BM": 128, "BN": 256, "depth": 4, "groups": 2, "pingpong": 0}),
    "M4096_1024x4096_ping": (4096, 1024, 4096, {"BM": 128, "BN": 128, "depth": 4, "groups": 1, "pingpong": 1}),
}

if __name__ == "__main__":
    out = Path(__file__).parent / "sched"
    out.mkdir(exist_ok=True)
    for name, (M, N, K, t) in CASES.items():
        for ts in (0, 1):
            fix = t | {"BK": 64, "splits": 1, "cluster": 1, "tma_store": ts}
            r = ptsolve.optimize(ptsolve.ops.gemm(M=M, N=N, K=K), hw="h200", solver="cpsat", cache=False,
                                 compile_check=False, fix=fix, time_limit=20)
            n = f"{name}_{'tma' if ts else 'reg'}"
            (out / f"{n}.json").write_text(r.to_json())
            print(n, r.status, r.program.graph.tiling, f"{r.predicted_us:.1f} µs", flush=True)
