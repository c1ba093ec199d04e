"""A Hugging Face decode loop through ``attn_implementation="ptsolve"``: ms per decode step (eager, the whole model)
with a dynamic cache (transformers concatenates: new K/V tensors every step, so every layer prepares a launch) and a
static cache (fixed K/V: ``flash_attention_kvcache``, the launch kept), next to SDPA with each cache.

    python -m bench torch_decode hf_steps --out $OUT/hf_steps.json      # GPU (generic cubins carried: .cubin_td)

Model: Llama-3-8B's attention shapes (32 heads, 8 kv heads, head_dim 128, hidden 4096) with 4 layers and a small MLP
and vocabulary (random weights, bf16), batch 1, a 2000-token prompt, 64 greedy decode steps timed after 8 warm-up
steps; every run is fed the first run's greedy tokens, and its logits at every step are compared with SDPA's on the
same cache kind (and SDPA's two caches with each other: the bf16 noise floor).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROMPT, WARM, STEPS = 2000, 8, 64


def _steps(model: Any, cfg: Any, ids: Any, static: bool, forced: Any = None) -> tuple[float, Any, Any]:
    """(ms per decode step, every step's logits, the tokens fed): greedy, or the tokens ``forced`` (so two runs'
    logits compare step by step)."""
    import torch
    from transformers import DynamicCache, StaticCache
    cache = StaticCache(config=cfg, max_cache_len=PROMPT + WARM + STEPS + 8) if static else DynamicCache()
    out = model(ids, past_key_values=cache, use_cache=True)
    toks, logits = [], []

    def step(i: int, out: Any) -> Any:
        tok = out.logits[:, -1:].argmax(-1) if forced is None else forced[i]
        toks.append(tok)
        logits.append(out.logits[:, -1].float())
        return model(tok, past_key_values=cache, use_cache=True)
    for i in range(WARM):
        out = step(i, out)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(WARM, WARM + STEPS):
        out = step(i, out)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / STEPS * 1e3, torch.stack(logits), toks


def main(out: Path) -> None:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    import ptsolve.torch as pt
    name = pt.register_transformers()
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=2048, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT), device="cuda")
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "transformers": transformers.__version__,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ms_per_step": {}}
    logits, toks = {}, None
    with torch.no_grad():
        for static in (False, True):
            for impl in ("sdpa", name):  # every run fed the first run's greedy tokens
                model.set_attn_implementation(impl)
                key = f"{impl}/{'static' if static else 'dynamic'}"
                res["ms_per_step"][key], logits[key], got = _steps(model, cfg, ids, static, toks)
                toks = toks or got
                print(key, round(res["ms_per_step"][key], 3), flush=True)
    for kind in ("dynamic", "static"):
        res[f"max_logit_diff_{kind}"] = float((logits[f"{name}/{kind}"] - logits[f"sdpa/{kind}"]).abs().max())
    res["max_logit_diff_sdpa_static_vs_dynamic"] = float((logits["sdpa/static"] - logits["sdpa/dynamic"]).abs().max())
    out.write_text(json.dumps(res, indent=1, sort_keys=True))
    print(json.dumps(res, indent=1, sort_keys=True))


if __name__ == "__main__":
    o = Path(sys.argv[sys.argv.index("--out") + 1])
    o.parent.mkdir(parents=True, exist_ok=True)
    main(o)
