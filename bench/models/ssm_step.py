"""Mamba2's decode step (one token of the SSM, the state updated in place): ptsolve's kernel next to mamba_ssm's.

Microseconds per call, all in one process:

    python -m bench models ssm_step --out $OUT/ssm_step_h200.json [--rows 1.3b_b8,...] [--graphs] [--nsets 3]

Per row (a Mamba2 width of shapes.md: head_dim 64, d_state 128, one group; batch 1, 8 and 64) on random inputs as a
bf16 model's decode step passes them (x, B, C and dt in bf16, A float32, D and dt_bias bf16, the state float32,
dt_softplus, no z: the model's gate is its norm's), three implementations of ``recurrent_step``'s signature:

- ``ptsolve``: ``ptsolve.mamba2_model.recurrent_step`` (CUDA: the ``mamba2_ssm_step`` class kernel, one launch);
- ``mamba_ssm``: its Triton ``selective_state_update`` (``baselines.mamba2_model``'s wrapper: dt, A, D and dt_bias
  as stride-0 expansions, as transformers and mamba_ssm's Mamba2.step pass them);
- ``torch``: ``step_torch``, ptsolve's PyTorch path (what decode ran before the kernel).

Each row: ``ptsolve_ms``, ``baseline_ms`` (mamba_ssm), ``torch_ms``, ``roofline_ms`` (the float32 state read and
written once at the HBM's bandwidth) and ``max_abs_err``: the largest difference between ptsolve's and mamba_ssm's y
(the states after the same step differ by as little). Timing: ``codegen.harness.time_many`` (each call a new token on
the same state, inputs rotated over ``--nsets`` sets); with ``--graphs`` each timed block is a CUDA graph replay (the
GPU's time; without, host time per call is in, as a model's eager decode waits for it).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench._study import gpu_stamp, picked_rows, rows_parser  # noqa: E402  (after the path insert)

MODELS = {"130m": 24, "370m": 32, "780m": 48, "1.3b": 64, "2.7b": 80}  # heads (d_model·2 / head_dim 64)
BATCHES = (1, 8, 64)
ROWS = {f"{m}_b{b}": (m, b) for m in MODELS for b in BATCHES}
P, N = 64, 128
HBM = 4.8e12  # bytes/s of an H200 (ptsolve.hw's h200 table)


def _inputs(b: int, h: int, seed: int) -> dict[str, Any]:
    """A bf16 model's decode-step arguments on the GPU (the state float32)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)

    def r(*s: int, dtype: Any = torch.bfloat16, scale: float = 1.0) -> Any:
        return (torch.randn(*s, device="cuda", generator=g) * scale).to(dtype)
    return {"state": r(b, h, P, N, dtype=torch.float32), "x": r(b, h, P), "dt": r(b, h, scale=0.5),
            "A": -(1 + 15 * torch.rand(h, device="cuda", generator=g)), "B": r(b, 1, N), "C": r(b, 1, N),
            "D": r(h), "dt_bias": r(h, scale=0.5), "dt_softplus": True, "dt_limit": (0.0, math.inf)}


def _row(name: str, nsets: int, graphs: bool) -> dict[str, Any]:
    import torch

    import ptsolve.mamba2_model as pm
    from baselines.mamba2_model import _step_with, load_state_update
    from codegen.harness import time_many

    m, b = ROWS[name]
    h = MODELS[m]
    theirs = _step_with(load_state_update())
    sets = [_inputs(b, h, seed=i) for i in range(nsets)]
    first = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in sets[0].items()}
    y_o = pm.recurrent_step(**first)
    y_m = theirs(**(sets[0] | {"state": sets[0]["state"].clone()}))
    err = (y_o.float() - y_m.float()).abs().max().item()
    fns = {"ptsolve": lambda i: pm.recurrent_step(**sets[i]), "mamba_ssm": lambda i: theirs(**sets[i]),
           "torch": lambda i: pm.step_torch(**sets[i])}
    t = time_many(fns, nsets, graphs=graphs)
    moved = b * h * P * N * 4 * 2
    return {"model": f"mamba2-{m}", "phase": "ssm_step", "name": name, "dtype": "bf16", "state_dtype": "fp32",
            "graphs": graphs, "shape": {"batch": b, "heads": h, "head_dim": P, "d_state": N, "groups": 1},
            "ptsolve_ms": round(t["ptsolve"], 5), "baseline_ms": round(t["mamba_ssm"], 5), "baseline": "mamba_ssm",
            "torch_ms": round(t["torch"], 5), "roofline_ms": round(moved / HBM * 1e3, 5), "max_abs_err": err}


def main() -> None:
    ap = rows_parser(__doc__, ROWS, 3)
    a = ap.parse_args()
    names = picked_rows(a.rows, ROWS)
    import torch

    res = gpu_stamp("python -m bench models ssm_step " + " ".join(sys.argv[1:]), a.commit)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        for n in names:
            r = _row(n, a.nsets, a.graphs)
            res["rows"].append(r)
            a.out.write_text(json.dumps(res, indent=1))
            print(f"{n:<10} ptsolve {r['ptsolve_ms'] * 1e3:8.2f} us  mamba_ssm {r['baseline_ms'] * 1e3:8.2f} us  "
                  f"torch {r['torch_ms'] * 1e3:8.2f} us  roofline {r['roofline_ms'] * 1e3:7.2f} us  "
                  f"x{r['baseline_ms'] / r['ptsolve_ms']:.3f}  err {r['max_abs_err']:.3g}", flush=True)


if __name__ == "__main__":
    main()
