"""Hugging Face Mamba2ForCausalLM with its SSD on ptsolve (``ptsolve.mamba2_model``) next to the same model on
mamba_ssm's Triton kernels (``baselines.mamba2_model``): prefill and decode, ms per call, in one process.

    python -m bench models mamba2 --out $OUT/mamba2_h200.json [--rows 130m_p_b1_s512,...] [--layers N]

The models: Mamba2 130m / 370m / 780m / 1.3b (d_model 768 / 1024 / 1536 / 2048; 24 / 48 / 48 / 48 layers; d_state
128, head_dim 64, expand 2, one group, chunk 256, vocabulary 50288), random weights (seed 0), bf16, eager, one model
per size whose mixers are switched between the two backends (``ptsolve.mamba2_model.patch``: the same glue, only
the SSD differs). ``--layers N`` keeps the first N layers of each (the rows say how many ran, next to the model's
own count). Rows, per model:

- ``prefill``: ``batch`` × ``seq`` prompt tokens into a fresh cache (logits of the last position), batch 1–8 ×
  512–4096 (4097: a ragged length); the two implementations take turns, ``--reps`` timed calls each after two
  warm-ups (mamba_ssm's autotuners are reset per row, so each shape is tuned for itself), median ms per call;
- ``decode``: after a 512-token prefill, ``--rounds`` segments of ``--steps`` one-token steps per implementation,
  taking turns segment by segment on their own caches, both fed mamba_ssm's greedy tokens; median ms per step.

Each row: ``ptsolve_ms``, ``baseline_ms`` (``baseline``: mamba_ssm), tokens per second (batch·seq / ms for prefill,
batch / ms for decode) and ``max_abs_err``: the largest difference between the two implementations' logits (prefill:
the last position; decode: every step). Host time is included (eager: what a caller waits for). With ``--graphs``
the decode rows also give ``ptsolve_graph_ms`` / ``baseline_graph_ms``: one greedy step (the argmax feeding the next
token on the device) captured in a CUDA graph per implementation and replayed, host time left out (``graph_error``
says why where a capture fails). ptsolve's decode runs the decode-step kernel (``recurrent_step`` on CUDA: one launch a
layer and token); ``--torch-step`` adds ``ptsolve_torch_step_ms`` (and its graph time with ``--graphs``): the same
path with the PyTorch step (``step_torch``) in its place, what decode ran before the kernel.
"""
from __future__ import annotations

import argparse
import functools
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

MODELS = {"130m": (768, 24), "370m": (1024, 48), "780m": (1536, 48), "1.3b": (2048, 48)}  # d_model, layers
PREFILL = [(1, 512), (4, 2048), (8, 4097)]
DECODE = [1, 8]
CONTEXT = 512  # the prompt before the decode rows' steps
TORCH_STEP = "ptsolve_torch_step"  # --torch-step's backend: ptsolve's SSD with recurrent_step's PyTorch path
ROWS = {**{f"{m}_p_b{b}_s{s}": (m, "prefill", b, s) for m in MODELS for b, s in PREFILL},
        **{f"{m}_d_b{b}": (m, "decode", b, CONTEXT) for m in MODELS for b in DECODE}}


def _model(name: str, layers: int | None) -> Any:
    """Mamba2ForCausalLM of size ``name`` (its first ``layers`` layers), random weights, bf16 on the GPU."""
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    d, n = MODELS[name]
    cfg = Mamba2Config(vocab_size=50288, hidden_size=d, num_hidden_layers=min(n, layers or n), state_size=128,
                       head_dim=64, expand=2, n_groups=1, chunk_size=256, num_heads=2 * d // 64)
    torch.manual_seed(0)
    with torch.device("cuda"):
        return Mamba2ForCausalLM(cfg).to(torch.bfloat16).eval()



def _prefill(model: Any, backends: dict[str, Any], ids: Any, reps: int) -> tuple[dict[str, float], float]:
    """Median ms per prefill of ``ids`` per backend (turns taken call by call) and the largest logit difference."""
    from transformers import DynamicCache

    import ptsolve.mamba2_model as pm

    def call() -> Any:
        return model(ids, cache_params=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1).logits
    ms: dict[str, list[float]] = {k: [] for k in backends}
    last: dict[str, Any] = {}
    for i in range(reps + 2):
        for k, be in backends.items():
            pm.patch(model, be)
            t, last[k] = synced_ms(call)
            if i >= 2:  # two warm-ups: kernels loaded, autotuned
                ms[k].append(t)
    err = (last["ptsolve"] - last["mamba_ssm"]).abs().max().item()
    return {k: statistics.median(v) for k, v in ms.items()}, err


def _segment(model: Any, st: dict[str, Any], toks: list[Any], steps: int, lead: bool) -> None:
    """``steps`` decode steps on ``st``'s cache, each fed ``toks``' token for its position; the ``lead`` run appends
    its own greedy token first (the others follow it)."""
    for _ in range(steps):
        i = len(st["logits"]) - 1
        if lead:
            toks.append(st["logits"][-1].argmax(-1)[:, None])
        out = model(toks[i], cache_params=st["cache"], use_cache=True)
        st["logits"].append(out.logits[:, -1].float())


def _decode(model: Any, backends: dict[str, Any], ids: Any, steps: int, rounds: int) -> tuple[dict[str, float], float]:
    """Median ms per decode step per backend (segments of ``steps``, turns taken segment by segment, every backend
    on its own cache fed mamba_ssm's greedy tokens) and the largest logit difference over the steps."""
    import torch
    from transformers import DynamicCache

    import ptsolve.mamba2_model as pm

    run: dict[str, dict[str, Any]] = {}
    for k, be in backends.items():
        pm.patch(model, be)
        cache = DynamicCache(config=model.config)
        out = model(ids, cache_params=cache, use_cache=True, logits_to_keep=1)
        run[k] = {"cache": cache, "logits": [out.logits[:, -1].float()], "ms": []}
    toks: list[Any] = []
    for r in range(rounds + 1):  # round 0 warms up
        for k in ("mamba_ssm", "ptsolve", *(k for k in backends if k not in ("mamba_ssm", "ptsolve"))):
            pm.patch(model, backends[k])
            st = run[k]
            t, _ = synced_ms(functools.partial(_segment, model, st, toks, steps, lead=k == "mamba_ssm"))
            if r:
                st["ms"].append(t / steps)
    err = (torch.stack(run["ptsolve"]["logits"]) - torch.stack(run["mamba_ssm"]["logits"])).abs().max().item()
    return {k: statistics.median(v["ms"]) for k, v in run.items()}, err


def _graph_step(model: Any, be: Any, ids: Any) -> Any:
    """A CUDA graph of one greedy decode step of ``model`` on backend ``be`` after a prefill of ``ids`` (its own
    cache; the step's argmax feeds the next replay's token, so replays decode on the device alone)."""
    import torch
    from transformers import DynamicCache

    import ptsolve.mamba2_model as pm

    pm.patch(model, be)
    cache = DynamicCache(config=model.config)
    tok = model(ids, cache_params=cache, use_cache=True, logits_to_keep=1).logits[:, -1:].argmax(-1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream (allocator pools, Triton's first launch)
        for _ in range(2):
            tok.copy_(model(tok, cache_params=cache, use_cache=True).logits[:, -1:].argmax(-1))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tok.copy_(model(tok, cache_params=cache, use_cache=True).logits[:, -1:].argmax(-1))
    return graph


def _graphs(model: Any, backends: dict[str, Any], ids: Any, steps: int, rounds: int) -> dict[str, Any]:
    """Median ms per decode step replayed from CUDA graphs (host time left out: the GPU's time per step), turns
    taken segment by segment; {"graph_error": why} where a capture fails."""
    try:
        graphs = {k: _graph_step(model, be, ids) for k, be in backends.items()}
    except Exception as e:  # noqa: BLE001 - the eager rows stand without it; say why it is missing
        return {"graph_error": f"{type(e).__name__}: {str(e)[:300]}"}
    ms: dict[str, list[float]] = {k: [] for k in graphs}
    for r in range(rounds + 1):
        for k, g in graphs.items():
            t, _ = synced_ms(lambda g=g: [g.replay() for _ in range(steps)])
            if r:
                ms[k].append(t / steps)
    return {("baseline" if k == "mamba_ssm" else k) + "_graph_ms": round(statistics.median(v), 4)
            for k, v in ms.items()}


def _row(model: Any, name: str, backends: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    """One row (the issue's format, tokens per second added)."""
    import torch

    from bench.models.ssd import _reset_mamba_autotune

    m, phase, b, s = ROWS[name]
    g = torch.Generator(device="cuda").manual_seed(b * 100003 + s)
    ids = torch.randint(0, model.config.vocab_size, (b, s), device="cuda", generator=g)
    _reset_mamba_autotune()
    extra: dict[str, Any] = {}
    if phase == "prefill":  # the PyTorch-step backend differs from ptsolve's in decode only
        ms, err = _prefill(model, {k: backends[k] for k in ("ptsolve", "mamba_ssm")}, ids, a.reps)
        toks = b * s
    else:
        ms, err = _decode(model, backends, ids, a.steps, a.rounds)
        toks = b
        extra = _graphs(model, backends, ids, a.steps, a.rounds) if a.graphs else {}
        if TORCH_STEP in ms:  # --torch-step: ptsolve's decode with the PyTorch step instead of the kernel
            extra[f"{TORCH_STEP}_ms"] = round(ms[TORCH_STEP], 4)
    d, layers = MODELS[m]
    shape = {"batch": b, "seq": s, "d_model": d, "heads": 2 * d // 64, "head_dim": 64, "d_state": 128, "chunk": 256,
             "groups": 1, "layers": model.config.num_hidden_layers, "model_layers": layers}
    if phase == "decode":
        shape["decode_steps"] = a.steps * a.rounds
    return {"model": f"mamba2-{m}", "phase": phase, "name": name, "shape": shape, "dtype": "bf16",
            "ptsolve_ms": round(ms["ptsolve"], 4), "baseline_ms": round(ms["mamba_ssm"], 4), "baseline": "mamba_ssm",
            "ptsolve_tok_s": round(toks / ms["ptsolve"] * 1e3, 1),
            "baseline_tok_s": round(toks / ms["mamba_ssm"] * 1e3, 1), "max_abs_err": err, **extra}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="", help=f"comma-separated row names (default: all: {', '.join(ROWS)})")
    ap.add_argument("--layers", type=int, default=0, help="keep the first N layers of each model (0: all)")
    ap.add_argument("--reps", type=int, default=5, help="timed prefill calls per implementation")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per segment")
    ap.add_argument("--rounds", type=int, default=3, help="decode segments per implementation")
    ap.add_argument("--graphs", action="store_true", help="decode rows also replayed from CUDA graphs (GPU time)")
    ap.add_argument("--torch-step", action="store_true", help="decode rows also time ptsolve's path with the "
                    "PyTorch recurrent step (step_torch, ~13 kernels a layer) in place of the decode-step kernel: "
                    f"{TORCH_STEP}_ms")
    ap.add_argument("--commit", default="")
    a = ap.parse_args()
    names = picked_rows(a.rows, ROWS)
    import torch
    import transformers

    import ptsolve.mamba2_model as pm
    from baselines.mamba2_model import backend

    backends = {"ptsolve": pm.PTSOLVE, "mamba_ssm": backend()}
    if a.torch_step:
        backends[TORCH_STEP] = pm.PTSOLVE._replace(name=TORCH_STEP, step=pm.step_torch)
    commit = a.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=ROOT).stdout.strip()
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "commit": commit,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "command": "python -m bench models mamba2 " + " ".join(sys.argv[1:]), "rows": []}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for m in MODELS:
        mine = [n for n in names if ROWS[n][0] == m]
        if not mine:
            continue
        model = _model(m, a.layers or None)
        with torch.no_grad():
            for n in mine:
                res["rows"].append(_row(model, n, backends, a))
                r = res["rows"][-1]
                print(f"{n:<18} ptsolve {r['ptsolve_ms']:9.3f} ms  mamba_ssm {r['baseline_ms']:9.3f} ms  "
                      f"x{r['baseline_ms'] / r['ptsolve_ms']:.3f}  err {r['max_abs_err']:.3g}", flush=True)
                a.out.write_text(json.dumps(res, indent=1))
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
