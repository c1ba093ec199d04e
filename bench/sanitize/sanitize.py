"""Small launches of the generated kernels, for compute-sanitizer (memcheck, racecheck, synccheck).

On the GPU machine (after ``python -m bench sanitize precompile`` on any machine with nvcc, with the same
``$PTSOLVE_CACHE_DIR``, so that no nvcc runs under the sanitizer)::

    compute-sanitizer --tool memcheck  --error-exitcode 9 python -m bench sanitize
    compute-sanitizer --tool racecheck --error-exitcode 9 python -m bench sanitize

Each kernel runs once on a small, ragged shape (GEMM 200×136×200; attention causal with seq 200, GQA, both
the hand FA3-order plan with ping-pong turns and the CP-SAT schedule of FA3 from results/schedules_h200 with
its full turn order; split-KV attention (flash_decode) with its merge CTAs; Mamba2 ChunkScan and ChunkState,
batch 1, 2 heads, seq 300, with the CP-SAT schedules of CS3 / ST3, with co-resident CTAs and with one CTA per SM;
and the CP-SAT first choices of FA3c, GEMM1, CS3 and ST3 in results/study_h200, the release-point model's; a
split-K GEMM; ping-pong GEMMs with two to three tiles per CTA, so both warpgroups and their per-tile turns run; a
2-CTA cluster GEMM that multicasts B;
ptsolve.torch's shape-generic attention, GEMM and Mamba2 chunk kernels) and is checked against a float32 / float64
reference, so a clean sanitizer run is also a correct one.
``python -m bench sanitize <word>`` runs only the cases whose label contains ``<word>`` (e.g. ``ping-pong``).
"""
from __future__ import annotations

import sys
from typing import Any

FA_SMALL = {"batch": 1, "heads": 8, "kv_heads": 2, "seq_q": 200, "seq_kv": 200, "head_dim": 128, "causal": True,
            "dtype": "fp16"}
GEMM_SMALL = {"M": 200, "N": 136, "K": 200, "dtype": "fp16"}
MAMBA_SMALL = {"batch": 1, "heads": 2, "seq": 300}


def cases() -> list[tuple[str, Any]]:
    """(label, KernelPlan at its small shape) of every kernel ``main`` checks besides ptsolve.torch's."""
    import dataclasses
    import json
    from pathlib import Path

    from codegen.plan import default_plan, fa3_order_plan, plan_from_program
    from ptsolve.program import SProgram
    from ptsolve.result import Result

    res = Path(__file__).resolve().parents[2] / "results"
    tg = {"BM": 128, "BN": 128, "BK": 64, "depth": 3, "groups": 2}
    ts = {"BM": 64, "BN": 128, "BK": 64, "depth": 3, "groups": 1, "splits": 4}  # partials met in the workspace
    out = [("default", default_plan("gemm", GEMM_SMALL, tg)),
           (f"split-K {ts}", default_plan("gemm", GEMM_SMALL | {"M": 100, "K": 1000}, ts)),
           ("fa3_hand", fa3_order_plan(FA_SMALL, {"BM": 128, "BN": 128, "depth": 2, "groups": 2}))]
    # ping-pong: 272 / 288 tiles over at most 132 CTAs (2-3 tiles each: both warpgroups, odd and even counts), ragged
    for tp in ({"BM": 64, "BN": 64, "BK": 64, "depth": 3, "groups": 1, "pingpong": 1},
               {"BM": 128, "BN": 128, "BK": 64, "depth": 4, "groups": 1, "pingpong": 1}):
        sh = GEMM_SMALL | ({"M": 1000, "N": 1064} if tp["BM"] == 64 else {"M": 2000, "N": 2250, "K": 136})
        out.append((f"ping-pong {tp['BM']}x{tp['BN']}", default_plan("gemm", sh, tp)))
    # a 2-CTA cluster multicasting B: 5 M tiles (an empty partner), ping-pong over 2-3 tiles per CTA
    tc = {"BM": 64, "BN": 64, "BK": 64, "depth": 3, "groups": 1, "pingpong": 1, "cluster": 2}
    out.append(("cluster 64x64", default_plan("gemm", GEMM_SMALL | {"M": 300, "N": 4000}, tc)))

    # split-KV attention: pieces counted done, merge CTAs that wait for them (MQA over two warpgroups; causal GQA
    # with tiles of different piece counts)
    from ptsolve.ops import flash_decode
    for p, t in ((dict(batch=1, heads=71, kv_heads=1, seq_q=1, seq_kv=700, head_dim=64),
                  {"BM": 128, "BN": 64, "depth": 2, "groups": 2, "splits": 4}),
                 (dict(batch=2, heads=14, kv_heads=2, seq_q=12, seq_kv=500, head_dim=64, causal=True),
                  {"BM": 64, "BN": 64, "depth": 2, "groups": 1, "splits": 8})):
        out.append((f"decode {t}", default_plan("flash_decode", flash_decode(**p).params, t)))

    def small(pl: Any) -> Any:
        return dataclasses.replace(pl, params=FA_SMALL if pl.op == "flash_attention" else GEMM_SMALL
                                   if pl.op == "gemm" else pl.params | MAMBA_SMALL)
    # the exact schedule ptsolve found for FA3 (no solver on the GPU machine: it travels as JSON); Mamba2's with
    # co-resident CTAs and with one CTA per SM
    for name in ("FA3_cpsat", "CS3_cpsat", "CS3_cpsat@1cta", "ST3_cpsat", "ST3_cpsat@1cta"):
        r = Result.from_json((res / f"schedules_h200/{name}.json").read_text())
        out.append((name, small(plan_from_program(r.program, "h200"))))
    # the measured-selection study's CP-SAT first choices (the release-point model, compile-checked; the excerpt of
    # its candidates.json that results/ keeps)
    study = json.loads((res / "study_h200/first_choices.json").read_text())
    for name in ("FA3c", "GEMM1", "CS3", "ST3"):
        c = study["configs"][name]["candidates"][0]
        out.append((f"study {name}", small(plan_from_program(SProgram.from_json(c["program"]), "h200"))))
    return out


def main() -> int:
    import torch

    from codegen.harness import TOL, check_fa, check_gemm
    from codegen.harness import check_mamba as check

    results = []
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    for label, pl in cases():
        if only not in label:
            continue
        if pl.op == "gemm":
            p = pl.params
            results.append(check_gemm(p["M"], p["N"], p["K"], p["dtype"], pl.tiling, pl, trials=1) | {"order": label})
        elif pl.op in ("flash_attention", "flash_decode"):
            results.append(check_fa(pl.params, pl.tiling, pl, trials=1, label=label))
        else:
            err = check(pl, trials=1, poison_tail=pl.op == "mamba2_chunk_state")
            results.append({"op": pl.op, "order": f"{label} {pl.tiling}", "rel_err": err, "ok": err <= TOL})
    if not only:
        results += _front_door()
    torch.cuda.synchronize()
    for r in results:
        print(f"{r['op']} {r.get('order', '')}: rel err {r['rel_err']:.2e} {'PASS' if r['ok'] else 'FAIL'}", flush=True)
    return 0 if all(r["ok"] for r in results) else 1


def precompile() -> None:
    """Compile (on a CPU machine, cached in $PTSOLVE_CACHE_DIR) every kernel ``main`` launches."""
    from codegen.harness import precompile as compile_plans
    from ptsolve import serve
    compile_plans([pl for _, pl in cases()])
    for c in (serve.attention_class("fp16", 64, True, 8, 2), serve.gemm_class("fp16"),  # _front_door's
              *(serve.mamba_class(op, "fp16", 64, 128, 256) for op in serve.MAMBA_OPS)):
        serve.compile_class(c)


def _front_door() -> list[dict]:
    """ptsolve.torch's attention (causal, GQA, ragged, seq_q < seq_kv), GEMM (odd sizes) and Mamba2 chunk kernels
    (ragged last chunk, grouped B/C) on the generic kernels, against float32 / float64 references."""
    import torch

    import ptsolve.torch as pt
    from codegen.harness import TOL, attention_ref, rel_err
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=g).half()
    q, k, v = rnd(2, 150, 8, 64), rnd(2, 333, 2, 64), rnd(2, 333, 2, 64)
    e1 = rel_err(pt.flash_attention(q, k, v, causal=True), attention_ref(q, k, v, True))
    a, b = rnd(100, 200), rnd(136, 200)
    e2 = rel_err(pt.gemm(a, b), a.float() @ b.float().T)
    from codegen.harness import chunk_scan_reference, chunk_state_reference, scan_inputs, state_inputs
    p = {"batch": 2, "seq": 300, "heads": 4, "head_dim": 64, "d_state": 128, "chunk": 256, "groups": 2, "dtype": "fp16"}
    sc = scan_inputs(p, seed=1)
    e3 = rel_err(pt.mamba_chunk_scan(sc["cb"], sc["x"], sc["dt"], sc["dA_cumsum"], sc["C"], sc["states"]),
                 chunk_scan_reference(**sc))
    st = state_inputs(p, seed=2)
    st["dt"][:, :, -1, 44:] = 0  # mamba_ssm's dt past the sequence (300 = 256 + 44), dA_cumsum flat there
    st["dA_cumsum"][:, :, -1, 44:] = st["dA_cumsum"][:, :, -1, 43:44]
    e4 = rel_err(pt.mamba_chunk_state(st["B"], st["x"], st["dt"], st["dA_cumsum"]),
                 chunk_state_reference(st["x"], st["B"], st["dt"], st["dA_cumsum"]))
    return [{"op": "ptsolve.torch.flash_attention", "order": "generic, causal, 150x333, GQA 4", "rel_err": e1,
             "ok": e1 <= TOL},
            {"op": "ptsolve.torch.gemm", "order": "generic, 100x136x200", "rel_err": e2, "ok": e2 <= TOL},
            *({"op": f"ptsolve.torch.{n}", "order": "generic, 2x300, 4 heads, 2 groups", "rel_err": e, "ok": e <= TOL}
              for n, e in (("mamba_chunk_scan", e3), ("mamba_chunk_state", e4)))]


if __name__ == "__main__":
    if sys.argv[1:] == ["precompile"]:
        precompile()
        sys.exit(0)
    sys.exit(main())
