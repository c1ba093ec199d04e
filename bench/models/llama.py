"""Hugging Face Llama (Llama-3-8B's layer shapes) through ``attn_implementation="ptsolve"`` next to SDPA: prefill
and decode with the dynamic cache, ms per call, logits compared step by step.

    python -m bench models llama --out $OUT/h200.json [--rows b1_k1024,...] [--layers 4] [--steps 16]

The model: Llama-3-8B's config (hidden 4096, MLP 14336, 32 heads, 8 kv heads, head_dim 128, vocabulary 128256) with
``--layers`` layers, random weights (seed 0), bf16, eager. Per row (batch, context) and implementation: a prefill of
``context`` random tokens into a fresh ``DynamicCache`` (the median of three after one warm-up; logits of the last
position only), then three warm-up decode steps and ``--rounds`` timed segments of ``--steps`` decode steps on that
implementation's own cache, the implementations taking turns segment by segment (none meets a key count twice, as in
a real decode loop), all fed SDPA FLASH's greedy tokens; a row's decode time is the median segment's ms per step.
Implementations: SDPA with its FLASH backend, with its cuDNN backend, with torch's own choice (``sdpa_default``: what
a user gets), and ptsolve. The baseline of a row is the faster of SDPA FLASH and cuDNN (issue 37); ``max_abs_err`` is
the largest difference of ptsolve's logits from SDPA FLASH's over the prefill and every decode step, next to SDPA
cuDNN's own difference from FLASH (``sdpa_noise``: the bf16 noise floor).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench._study import picked_rows, synced_ms  # noqa: E402  (after the path insert)

ROWS = {"b1_k1024": (1, 1024), "b1_k8192": (1, 8192), "b1_k32768": (1, 32768), "b4_k2048": (4, 2048),
        "b4_k8192": (4, 8192), "b16_k1024": (16, 1024), "b16_k4096": (16, 4096)}
IMPLS = ("sdpa_flash", "sdpa_cudnn", "sdpa_default", "ptsolve")
WARM = 3


def _ctx(impl: str) -> Any:
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}.get(impl)
    return sdpa_kernel([be]) if be is not None else contextlib.nullcontext()



class _Run:
    """One implementation's run on one row: its prefill and its own growing cache, decoded in segments."""

    def __init__(self, model: Any, ids: Any):
        from transformers import DynamicCache

        def prefill() -> Any:
            cache = DynamicCache()
            return model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1), cache
        prefill()
        self.prefill_ms = []
        for _ in range(3):
            ms, (self.out, self.cache) = synced_ms(prefill)
            self.prefill_ms.append(ms)
        self.model, self.logits, self.toks, self.decode_ms = model, [self.out.logits[:, -1].float()], [], []

    def decode(self, steps: int, forced: list[Any] | None, timed: bool = True) -> None:
        """``steps`` decode steps fed ``forced``'s tokens from this run's position on (its own greedy ones where
        None), timed as one synchronised span."""
        def step() -> None:
            i = len(self.toks)
            tok = self.out.logits[:, -1:].argmax(-1) if forced is None else forced[i]
            self.toks.append(tok)
            self.out = self.model(tok, past_key_values=self.cache, use_cache=True)
            self.logits.append(self.out.logits[:, -1].float())
        ms, _ = synced_ms(lambda: [step() for _ in range(steps)])
        if timed:
            self.decode_ms.append(ms / steps)


def _model(layers: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=65536,
                      rope_theta=500000.0)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model


def _row(model: Any, name: str, batch: int, ctx: int, steps: int, rounds: int, pt_name: str
         ) -> list[dict[str, Any]]:
    """The row's prefill and decode rows. Each implementation decodes its own cache in ``rounds`` segments of
    ``steps`` steps, the implementations taking turns (so no implementation meets one key count twice, as a real
    decode loop never does: cuDNN builds a plan per new count), every one fed SDPA FLASH's greedy tokens; the
    decode time is the median of the segments'."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(batch * 100003 + ctx)
    ids = torch.randint(0, model.config.vocab_size, (batch, ctx), device="cuda", generator=g)
    runs: dict[str, _Run] = {}

    def use(impl: str) -> Any:
        model.set_attn_implementation(pt_name if impl == "ptsolve" else "sdpa")
        return _ctx(impl)
    for impl in IMPLS:
        try:
            with torch.no_grad(), use(impl):
                runs[impl] = _Run(model, ids)
                runs[impl].decode(WARM, runs["sdpa_flash"].toks if impl != "sdpa_flash" else None, timed=False)
        except RuntimeError as e:  # a backend that refuses the shape is absent, not zero
            print(f"{name} {impl}: {str(e).splitlines()[0][:160]}", flush=True)
            runs.pop(impl, None)
    for _ in range(rounds):
        for impl, r in runs.items():
            with torch.no_grad(), use(impl):
                r.decode(steps, runs["sdpa_flash"].toks if impl != "sdpa_flash" else None)
    got = {i: {"prefill_ms": statistics.median(r.prefill_ms), "decode_ms": statistics.median(r.decode_ms),
               "logits": torch.stack(r.logits)} for i, r in runs.items()}
    for i, r in got.items():
        print(f"{name} {i}: prefill {r['prefill_ms']:.2f} ms, decode {r['decode_ms']:.3f} ms/step "
              f"({', '.join(f'{x:.3f}' for x in runs[i].decode_ms)})", flush=True)
    ref = got["sdpa_flash"]["logits"]
    err = float((got["ptsolve"]["logits"] - ref).abs().max())
    floor = float((got["sdpa_cudnn"]["logits"] - ref).abs().max()) if "sdpa_cudnn" in got else None
    shape = {"batch": batch, "context": ctx, "heads": 32, "kv_heads": 8, "head_dim": 128,
             "layers": model.config.num_hidden_layers, "decode_steps": steps * rounds}
    rows = []
    for phase, key in (("prefill", "prefill_ms"), ("decode", "decode_ms")):
        peers = {i: round(got[i][key], 4) for i in IMPLS if i != "ptsolve" and i in got}
        best = min((i for i in ("sdpa_flash", "sdpa_cudnn") if i in peers), key=lambda i: peers[i])
        rows.append({"model": "llama3-8b", "phase": phase, "name": name, "shape": shape,
                     "ptsolve_ms": round(got["ptsolve"][key], 4), "baseline_ms": peers[best], "baseline": best,
                     "peers_ms": peers, "max_abs_err": err, "sdpa_noise": floor})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all of ROWS)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=16, help="decode steps per segment")
    ap.add_argument("--rounds", type=int, default=3, help="decode segments per implementation")
    ap.add_argument("--commit", default="")
    a = ap.parse_args()
    import torch
    import transformers

    import ptsolve.torch as pt
    names = picked_rows(a.rows, ROWS)
    pt_name = pt.register_transformers()
    model = _model(a.layers)
    commit = a.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True).stdout.strip()
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "commit": commit,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "command": "python -m bench models llama " + " ".join(sys.argv[1:]), "rows": []}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for n in names:
        res["rows"] += _row(model, n, *ROWS[n], a.steps, a.rounds, pt_name)
        a.out.write_text(json.dumps(res, indent=1))
        torch.cuda.empty_cache()
    print(f"{'row':12s} {'phase':8s} {'ptsolve ms':>10s} {'baseline':>10s} {'ratio':>6s} {'err':>7s} {'noise':>7s}")
    for r in res["rows"]:
        print(f"{r['name']:12s} {r['phase']:8s} {r['ptsolve_ms']:10.3f} {r['baseline_ms']:10.3f} "
              f"{r['baseline_ms'] / r['ptsolve_ms']:6.3f} {r['max_abs_err']:7.3f} {r['sdpa_noise'] or 0:7.3f}")


if __name__ == "__main__":
    main()
