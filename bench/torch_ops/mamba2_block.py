"""A Mamba2 block (mamba_ssm's Python layer, its CUDA extensions absent) with its chunk kernels routed to ptsolve's.

    python -m bench torch_ops mamba2_block --out DIR     # on an H100/H200 with the mamba_ssm wheel on the path

mamba_ssm's ``Mamba2`` layer is built with random weights (Mamba2-130m's width: d_model 768, head_dim 64, d_state
128, chunk 256) and ``use_mem_eff_path=False``, so it runs without ``causal_conv1d`` / ``selective_scan`` CUDA
extensions (a plain ``nn.Conv1d`` and the Triton SSD path). Then ``_chunk_state_fwd`` and ``_chunk_scan_fwd`` inside
``mamba_ssm.ops.triton.ssd_combined`` are replaced by ``ptsolve.torch.mamba_chunk_state`` / ``mamba_chunk_scan``
(the D skip term added in PyTorch; z and seq_idx are not supported and refused), the layer runs again on the same
input, and both forwards are compared (relative Frobenius error) and timed (median of interleaved rounds, CUDA
events). Writes ``mamba2_block.json`` under --out and prints a table."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="1x2048,4x2048,8x4096", help="batch x seq, comma-separated")
    a = ap.parse_args(argv)
    import torch

    import ptsolve.torch as pt
    from baselines.mamba2 import load_kernels
    from codegen.harness import rel_err, time_many

    load_kernels()  # registers mamba_ssm without running its __init__ (no CUDA extensions needed)
    from mamba_ssm.modules.mamba2 import Mamba2
    from mamba_ssm.ops.triton import ssd_combined

    triton_scan, triton_state = ssd_combined._chunk_scan_fwd, ssd_combined._chunk_state_fwd

    def scan(cb, x, dt, dA_cumsum, C, states, D=None, z=None, seq_idx=None):
        if z is not None or seq_idx is not None:
            raise NotImplementedError("ptsolve's ChunkScan takes no z gate or seq_idx")
        out = pt.mamba_chunk_scan(cb, x, dt, dA_cumsum, C, states)
        if D is not None:  # the skip term: out += D[h] x (D of shape (h,) or (h, p))
            out = (out.float() + x.float() * (D[:, None] if D.dim() == 1 else D)).to(out.dtype)
        return out, None

    def state(B, x, dt, dA_cumsum, seq_idx=None, states=None, states_in_fp32=True):
        if seq_idx is not None or states is not None or not states_in_fp32:
            raise NotImplementedError("ptsolve's ChunkState takes no seq_idx and writes fresh fp32 states")
        return pt.mamba_chunk_state(B, x, dt, dA_cumsum)

    torch.manual_seed(0)
    layer = Mamba2(d_model=768, d_state=128, d_conv=4, expand=2, headdim=64, ngroups=1, chunk_size=256,
                   use_mem_eff_path=False, device="cuda", dtype=torch.float16)
    rows = []
    for shp in a.shapes.split(","):
        b, L = (int(v) for v in shp.split("x"))
        u = torch.randn(b, L, 768, device="cuda", dtype=torch.float16)
        with torch.no_grad():
            ssd_combined._chunk_scan_fwd, ssd_combined._chunk_state_fwd = triton_scan, triton_state
            ref = layer(u).float()
            ssd_combined._chunk_scan_fwd, ssd_combined._chunk_state_fwd = scan, state
            t0 = time.perf_counter()
            ours = layer(u).float()  # the first call of a shape compiles its two kernels (then cached on disk)
            first_s = time.perf_counter() - t0
            err = rel_err(ours, ref)

            def run(kind: str, u: torch.Tensor = u):
                def f(i: int) -> None:
                    ssd_combined._chunk_scan_fwd, ssd_combined._chunk_state_fwd = (
                        (triton_scan, triton_state) if kind == "triton" else (scan, state))
                    layer(u)
                return f
            ms = time_many({"triton": run("triton"), "ptsolve": run("ptsolve")}, 1, rounds=15)
        rows.append({"batch": b, "seq": L, "rel_err_vs_triton_layer": err, "first_call_s": first_s,
                     "triton_ms": ms["triton"], "ptsolve_ms": ms["ptsolve"]})
        print(json.dumps(rows[-1]), flush=True)
    ssd_combined._chunk_scan_fwd, ssd_combined._chunk_state_fwd = triton_scan, triton_state
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mamba2_block.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch":
                                                       torch.__version__, "rows": rows}, indent=1))
    print("| batch x seq | rel err vs the Triton layer | Triton layer ms | ptsolve-routed layer ms | first call s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']}x{r['seq']} | {r['rel_err_vs_triton_layer']:.2e} | {r['triton_ms']:.3f} | "
              f"{r['ptsolve_ms']:.3f} | {r['first_call_s']:.1f} |")
    return 0 if all(r["rel_err_vs_triton_layer"] <= 1e-2 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
