"""What a PyTorch user gets for prefill attention: ``ptsolve.torch.flash_attention`` (seq_q > 16: the shape-generic
attention kernel of the shape's class, ``ptsolve.serve``) next to SDPA in one process (CUDA graphs, inputs rotating
past the L2, every output checked against float32 first: FlashAttention's rule), on the attention shapes of
``../shared/shapes.md`` that no schedule was solved or tuned on: six model families' heads, sequences 128-8192
(ragged ones), batch 1-16, causal and not, prefill against a longer cache (bottom-right causal) and a 17-position
verification step. The measurement loop is ``results/torch_decode/torch_decode.main``.

    python -m bench torch_prefill torch_prefill --out $OUT/torch_prefill.json [--only <text>]   # GPU
    python -m bench torch_prefill torch_prefill --report results/torch_prefill/device/torch_prefill.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2] / "results/torch_prefill"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

MODELS = {"llama3-8b": (32, 8, 128), "llama3-70b": (64, 8, 128), "qwen2.5-7b": (28, 4, 128),
          "qwen2.5-0.5b": (14, 2, 64), "gpt2": (12, 12, 64), "falcon-7b": (71, 1, 64)}
SEQS = (128, 511, 1000, 2047, 4097, 8192)


def _batch(seq: int) -> int:
    """A batch that keeps a shape's float32 reference and its timing sets small: 16 up to 1000 tokens, 4 to 4097,
    1 beyond."""
    return 16 if seq <= 1000 else 4 if seq <= 4097 else 1


def shapes() -> dict[str, dict[str, Any]]:
    """name -> parameters (fp16): every model x sequence x causal at ``_batch``; batch 1 causal for Llama-3-8B and
    -70B (few CTAs: the low-occupancy case); prefill against a cache and a verification step."""
    out = {}

    def add(model: str, b: int, sq: int, skv: int, causal: bool) -> None:
        h, kv, d = MODELS[model]
        out[f"pf_{model}_b{b}_q{sq}_k{skv}{'_causal' if causal else ''}"] = {
            "batch": b, "heads": h, "kv_heads": kv, "seq_q": sq, "seq_kv": skv, "head_dim": d, "causal": causal}
    for m in MODELS:
        for s in SEQS:
            for c in (False, True):
                add(m, _batch(s), s, s, c)
    for m in ("llama3-8b", "llama3-70b"):
        for s in SEQS:
            if _batch(s) != 1:
                add(m, 1, s, s, True)
    add("llama3-8b", 4, 511, 4097, True)     # a prompt chunk against its cache
    add("qwen2.5-0.5b", 16, 17, 1000, True)  # 17 positions: just past the decode kernel's 16
    add("gpt2", 16, 128, 2047, True)
    return out


def report(res: dict[str, Any]) -> str:
    """The markdown table (shape, ptsolve µs, cuDNN µs and ratio, the fastest SDPA call and ratio) and summaries."""
    from bench.torch_decode.torch_decode import _summary, best, target
    rows, rc, rb = [], [], []
    for name, r in sorted(res["shapes"].items()):
        tn, tu = target(r["us"])
        bn, bu = best(r["us"])
        us = r["us"]["pt.flash_attention"]
        rc.append(tu / us)
        rb.append(bu / us)
        rows.append(f"| {name} | {us:.1f} | {tu:.1f}{' (no mask)' if tn.endswith('_nc') else ''} | {tu / us:.3f} | "
                    f"{bu:.1f} ({bn}) | {bu / us:.3f} | {'yes' if r['ok'] else 'NO'} |")
    causal = [x for x, r in zip(rc, sorted(res["shapes"].items())) if r[1]["params"]["causal"]]
    return "\n".join([
        "| shape | `pt.flash_attention` µs | SDPA-cuDNN µs | cuDNN / ptsolve | fastest SDPA µs | fastest / ptsolve "
        "| output ok |", "|---|---|---|---|---|---|---|", *rows, "",
        _summary("cuDNN", rc) + "  ", _summary("the fastest SDPA call", rb) + "  ",
        _summary("causal only: cuDNN", causal) + "  ",
        f"outputs within FlashAttention's rule: {sum(r['ok'] for r in res['shapes'].values())}/{len(rc)}"])


if __name__ == "__main__":
    if "--report" in sys.argv:
        print(report(json.loads(Path(sys.argv[sys.argv.index("--report") + 1]).read_text())))
    else:
        from bench.torch_decode.torch_decode import main
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.parent.mkdir(parents=True, exist_ok=True)
        r = main(o, sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else "", shapes())
        print(report(r))
