"""A Hugging Face Llama prefill under torch.profiler, ptsolve next to SDPA FLASH (issue 37): where the time of one
prefill goes (the model of ``bench models llama``: Llama-3-8B's layer shapes, ``--layers`` layers, random weights,
bf16, a fresh dynamic cache per prefill).

    python -m bench models prefill_profile --out DIR [--batch 1] [--context 1024] [--layers 4]

Prints per implementation the wall ms of each prefill and the profiler's top operators by device time and by host
time; writes DIR/prefill_profile_<impl>.txt.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    import ptsolve.torch as pt
    from bench.models.llama import _ctx, _model

    a.out.mkdir(parents=True, exist_ok=True)
    model, name = _model(a.layers), pt.register_transformers()
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.context), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0))
    for impl in ("sdpa_flash", "ptsolve", "sdpa_flash", "ptsolve"):
        model.set_attn_implementation(name if impl == "ptsolve" else "sdpa")
        with torch.no_grad(), _ctx(impl):
            def run() -> None:
                model(ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
            run()
            ms = []
            for _ in range(3):
                torch.cuda.synchronize()
                t = time.perf_counter()
                run()
                torch.cuda.synchronize()
                ms.append((time.perf_counter() - t) * 1e3)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run()
                torch.cuda.synchronize()
        ka = prof.key_averages()
        text = (f"{impl}: prefill ms {', '.join(f'{x:.3f}' for x in ms)}\n"
                + ka.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=70)
                + ka.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=70))
        (a.out / f"prefill_profile_{impl}.txt").write_text(text)
        print(text, flush=True)


if __name__ == "__main__":
    main()
