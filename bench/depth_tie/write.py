"""Record the measured ring-depth tie preference (Hardware.deep_ring_ties) of the operators results/depth_tie timed
in the H200 overlay (ptsolve.calibrate.write_op: the operator's other fitted entries are kept).

    python -m bench depth_tie write
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MEASURED = {  # op -> what the A/B of results/depth_tie/README.md measured where the model tied the depths
    "gemm": "deeper ring faster on 12 of the 13 memory-bound GEMM shapes where it tied (time geomean 0.977x)",
    "mamba2_chunk_state": "deeper ring faster on ST3/ST5/ST8/ST9 (0.964-0.977x), ST0 equal",
}


def main() -> None:
    from ptsolve.calibrate import write_op
    from ptsolve.hw import load

    base = load("h200")
    for op, what in sorted(MEASURED.items()):
        p = write_op(replace(base, deep_ring_ties=1), replace(base, op_constants={}), op,
                     f"deep_ring_ties measured on an NVIDIA H200, 2026-12-01 21:26Z, commit 56b2966 "
                     f"(results/depth_tie): {what}", ["deep_ring_ties"])
    print("wrote", p)


if __name__ == "__main__":
    main()
