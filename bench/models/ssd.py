"""Mamba2's SSD forward (mamba_chunk_scan_combined) and its ChunkScan / ChunkState steps: ptsolve next to mamba_ssm.

Milliseconds per call, both in one process:

    python -m bench models ssd --out $OUT/ssd_h200.json [--rows 1.3b_b4_s8192,...] [--z] [--graphs] [--nsets 2]

Per row (a Mamba2 width of shapes.md: head_dim 64, d_state 128, chunk 256, one group; batch and seq, ragged ones
included) on fresh random inputs as Mamba2 initialises them (A = −uniform(1, 16), dt_bias = softplus⁻¹ of a
log-uniform dt in [1e-3, 1e-1], dt_softplus, D per head; z only with ``--z``), bf16, three phases:

- ``ssd_combined``: ``ptsolve.ssd.mamba_chunk_scan_combined`` vs mamba_ssm's ``mamba_chunk_scan_combined`` (every
  step of each, host work included: what a caller waits for);
- ``chunk_scan``: ptsolve's ChunkScan kernel on its own inputs (CB in bf16, the entering states in bf16) vs
  ``_chunk_scan_fwd`` on mamba_ssm's (CB float32), no D, no z (the paper's kernel);
- ``chunk_state``: ptsolve's ChunkState kernel vs ``_chunk_state_fwd`` (states in float32);
- ``state_passing``: ptsolve's state-passing kernel (one launch over the chunks; ``ptsolve.ssd``'s CUDA path) vs
  ``_state_passing_fwd``, both from the float32 chunk states to the entering states in bf16 and the final state.

Timing: ``codegen.harness.time_many`` (interleaved rounds, rotated input sets, median; with ``--graphs`` each timed
block is a CUDA graph replay, so host time per call is left out, otherwise it is in), after a warm-up that compiles,
loads and autotunes (mamba_ssm's autotuners are reset per row, so each shape is tuned for itself). ``max_abs_err``:
the largest difference between ptsolve's and mamba_ssm's outputs of the phase (for chunk_scan, the same inputs' CB
and states in each side's own dtypes). Rows whose x has 2^31 elements or more are skipped: mamba_ssm's Triton
kernels index it in 32 bits.
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

MODELS = {"130m": 24, "370m": 32, "780m": 48, "1.3b": 64}  # heads (d_model·2 / head_dim 64)
SHAPES = [("130m", 4, 2048), ("130m", 16, 4097), ("370m", 1, 8192), ("370m", 8, 2047), ("780m", 4, 4096),
          ("780m", 2, 16384), ("1.3b", 1, 2048), ("1.3b", 4, 8192), ("1.3b", 16, 8000), ("1.3b", 32, 8192)]
ROWS = {f"{m}_b{b}_s{s}": (m, b, s) for m, b, s in SHAPES}
P, N, Q = 64, 128, 256


def _inputs(b: int, L: int, h: int, seed: int, z: bool) -> dict[str, Any]:
    """mamba_chunk_scan_combined's arguments (bf16 activations, float32 dt, A, dt_bias, D) on the GPU."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)

    def r(*s: int, dtype: Any = torch.bfloat16) -> Any:
        return torch.randn(*s, device="cuda", generator=g).to(dtype)

    dt0 = torch.exp(torch.rand(h, device="cuda", generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    a = {"x": r(b, L, h, P), "dt": r(b, L, h, dtype=torch.float32),
         "A": -(1 + 15 * torch.rand(h, device="cuda", generator=g)), "B": r(b, L, 1, N), "C": r(b, L, 1, N),
         "D": r(h, dtype=torch.float32), "dt_bias": dt0 + torch.log(-torch.expm1(-dt0))}
    if z:
        a["z"] = r(b, L, h, P)
    return a


def _reset_mamba_autotune() -> None:
    """Forget every mamba_ssm SSD autotuner's choices (keyed on sizes that leave out batch and seq)."""
    from mamba_ssm.ops.triton import ssd_bmm, ssd_chunk_scan, ssd_chunk_state, ssd_combined, ssd_state_passing

    from baselines.mamba2 import reset_autotune
    for mod in (ssd_bmm, ssd_chunk_scan, ssd_chunk_state, ssd_combined, ssd_state_passing):
        for v in vars(mod).values():
            if hasattr(v, "configs") and isinstance(getattr(v, "cache", None), dict):
                reset_autotune(v)


def _combined(sets: list[dict[str, Any]], mamba: Any) -> tuple[dict[str, Any], float]:
    """The ssd_combined phase's callables and ptsolve's max difference from mamba_ssm."""
    from ptsolve import ssd

    def call(fn: Any, s: dict[str, Any]) -> Any:
        return fn(s["x"], s["dt"], s["A"], s["B"], s["C"], Q, D=s["D"], z=s.get("z"), dt_bias=s["dt_bias"],
                  dt_softplus=True)
    err = (call(ssd.mamba_chunk_scan_combined, sets[0]).float() - call(mamba, sets[0]).float()).abs().max().item()
    return {"ptsolve": lambda i: call(ssd.mamba_chunk_scan_combined, sets[i]),
            "mamba_ssm": lambda i: call(mamba, sets[i])}, err


def _steps(sets: list[dict[str, Any]], k: Any) -> tuple[dict[str, Any], dict[str, Any], float, float]:
    """The chunk_scan and chunk_state phases' callables (each side on its own inputs) and their max differences."""
    import torch

    from ptsolve import ssd

    prep = []
    # mamba_ssm's own preprocessing: dt, dA_cumsum, states, CB (float32), entering states; ptsolve's chunk scan gets
    # CB in the dtype its forward gives it (ssd.cb_dtype: float32 for bf16, fp16 for fp16)
    for s in sets:
        dA, dt = k.chunk_cumsum_fwd(s["dt"], s["A"], Q, dt_bias=s["dt_bias"], dt_softplus=True)
        st = k.chunk_state_fwd(s["B"], s["x"], dt, dA, states_in_fp32=True)
        ent, _ = k.state_passing_fwd(st.flatten(-2), dA[:, :, :, -1], chunk_size=Q, out_dtype=s["C"].dtype)
        cb = k.bmm_chunk_fwd(s["C"], s["B"], Q, output_dtype=torch.float32)
        prep.append({**s, "dtc": dt, "dA": dA, "ent": ent.view(st.shape), "cb32": cb,
                     "cb": cb.to(ssd.cb_dtype(s["x"].dtype)), "st_out": torch.empty_like(st)})
        del st
    scan = {"ptsolve": lambda i: ssd._chunk_scan_cuda(prep[i]["cb"], prep[i]["x"], prep[i]["dtc"], prep[i]["dA"],
                                                       prep[i]["C"], prep[i]["ent"]),
            "mamba_ssm": lambda i: k.chunk_scan_fwd(prep[i]["cb32"], prep[i]["x"], prep[i]["dtc"], prep[i]["dA"],
                                                    prep[i]["C"], prep[i]["ent"])[0]}
    state = {"ptsolve": lambda i: ssd._chunk_state_cuda(prep[i]["B"], prep[i]["x"], prep[i]["dtc"], prep[i]["dA"]),
             "mamba_ssm": lambda i: k.chunk_state_fwd(prep[i]["B"], prep[i]["x"], prep[i]["dtc"], prep[i]["dA"],
                                                      states=prep[i]["st_out"], states_in_fp32=True)}
    e_scan = (scan["ptsolve"](0).float() - scan["mamba_ssm"](0).float()).abs().max().item()
    e_state = (state["ptsolve"](0) - state["mamba_ssm"](0)).abs().max().item()
    return scan, state, e_scan, e_state


def _passing(sets: list[dict[str, Any]], k: Any) -> tuple[dict[str, Any], float]:
    """The state_passing phase's callables (the same float32 chunk states and dA_cumsum for both) and the max
    difference of their entering states."""
    import torch

    from ptsolve import ssd

    prep = []
    for s in sets:
        dA, dt = k.chunk_cumsum_fwd(s["dt"], s["A"], Q, dt_bias=s["dt_bias"], dt_softplus=True)
        prep.append({"dA": dA, "st": k.chunk_state_fwd(s["B"], s["x"], dt, dA, states_in_fp32=True)})
    passing = {"ptsolve": lambda i: ssd._state_passing_cuda(prep[i]["st"], prep[i]["dA"], None, None, torch.bfloat16),
               "mamba_ssm": lambda i: k.state_passing_fwd(prep[i]["st"].flatten(-2), prep[i]["dA"][:, :, :, -1],
                                                          chunk_size=Q, out_dtype=torch.bfloat16)}
    ours, theirs = passing["ptsolve"](0)[0], passing["mamba_ssm"](0)[0].view(prep[0]["st"].shape)
    return passing, (ours.float() - theirs.float()).abs().max().item()


def _row(name: str, nsets: int, z: bool, graphs: bool) -> list[dict[str, Any]]:
    """One row's four phases."""
    import torch

    from baselines.mamba2 import load_combined, load_kernels
    from codegen.harness import time_many

    m, b, L = ROWS[name]
    h = MODELS[m]
    shape = {"batch": b, "seq": L, "heads": h, "head_dim": P, "d_state": N, "chunk": Q}
    base = {"model": f"mamba2-{m}", "name": name, "shape": shape, "baseline": "mamba_ssm", "dtype": "bf16",
            "z": z, "graphs": graphs}
    if b * L * h * P >= 1 << 31:
        return [{**base, "phase": "ssd_combined", "skipped": "x has 2^31 elements or more: past mamba_ssm's int32 "
                 "indexing"}]
    k, mamba = load_kernels(), load_combined()
    sets = [_inputs(b, L, h, seed=i, z=z) for i in range(nsets)]
    _reset_mamba_autotune()
    rows = []
    comb, err = _combined(sets, mamba)
    rows.append({**base, "phase": "ssd_combined", "max_abs_err": err, **_ms(time_many(comb, nsets, graphs=graphs))})
    del comb
    scan, state, e_scan, e_state = _steps(sets, k)
    rows.append({**base, "phase": "chunk_scan", "max_abs_err": e_scan, **_ms(time_many(scan, nsets, graphs=graphs))})
    rows.append({**base, "phase": "chunk_state", "max_abs_err": e_state, **_ms(time_many(state, nsets, graphs=graphs))})
    del scan, state
    passing, e_pass = _passing(sets, k)
    rows.append({**base, "phase": "state_passing", "max_abs_err": e_pass,
                 **_ms(time_many(passing, nsets, graphs=graphs))})
    del passing, sets
    torch.cuda.empty_cache()
    return rows


def _ms(t: dict[str, float]) -> dict[str, float]:
    return {"ptsolve_ms": round(t["ptsolve"], 4), "baseline_ms": round(t["mamba_ssm"], 4)}


def main() -> None:
    ap = rows_parser(__doc__, ROWS, 2)
    ap.add_argument("--z", action="store_true", help="pass z (the gate fused in ChunkScan's store) to both")
    a = ap.parse_args()
    names = picked_rows(a.rows, ROWS)

    res = gpu_stamp("python -m bench models ssd " + " ".join(sys.argv[1:]), a.commit)
    for n in names:
        res["rows"] += _row(n, a.nsets, a.z, a.graphs)
        a.out.write_text(json.dumps(res, indent=1))
    for r in res["rows"]:
        if "skipped" in r:
            print(f"{r['name']:<18} skipped: {r['skipped']}")
        else:
            print(f"{r['name']:<18} {r['phase']:<13} ptsolve {r['ptsolve_ms']:8.3f} ms  mamba_ssm "
                  f"{r['baseline_ms']:8.3f} ms  x{r['baseline_ms'] / r['ptsolve_ms']:.3f}  err {r['max_abs_err']:.3g}")


if __name__ == "__main__":
    main()
