"""Paged KV decode (FlashAttention-3's ``page_table``, vLLM's cache) next to the same cache unpaged, through
``ptsolve.torch.flash_attention_kvcache`` as a user calls it (issue 36's bar: paged ≥ 0.9× unpaged).

    python -m bench torch_decode paged --out $OUT/paged.json     # GPU (class cubins carried)
    python -m bench torch_decode paged --report results/torch_decode/device/paged.json

Each row: a cache of ``n`` keys per sequence, laid out densely [B, n, Hkv, D] and, with the same keys, in pages of
``page`` keys scattered through a pool twice the size (a random permutation, so no two pages of a sequence are
neighbours); every sequence filled to n. Both calls see the same capacity (n is a whole number of pages), so they
split the keys alike. Kernel times under CUDA graphs, inputs rotating past the 50 MB L2, outputs compared first.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# (model, heads, kv heads, head_dim, batch, keys, page)
ROWS = [("llama3-8b", 32, 8, 128, 1, 32768, 16), ("llama3-8b", 32, 8, 128, 1, 32768, 256),
        ("llama3-8b", 32, 8, 128, 16, 4096, 16), ("llama3-8b", 32, 8, 128, 16, 4096, 64),
        ("llama3-8b", 32, 8, 128, 64, 2048, 128), ("qwen2-7b", 28, 4, 128, 8, 16384, 32),
        ("gpt2", 12, 12, 64, 16, 8192, 16), ("mistral-7b", 32, 8, 128, 4, 65536, 256)]


def _one(H: int, Hkv: int, D: int, B: int, n: int, page: int) -> dict[str, Any]:
    """Times (µs) of the unpaged and paged calls on one row, their outputs' largest difference."""
    import torch

    import ptsolve.torch as pt
    from codegen.harness import time_many
    g = torch.Generator(device="cuda").manual_seed(n + page)
    maxp = n // page
    nsets = max(1, min(4, math.ceil(200e6 / (4 * B * n * Hkv * D))))
    lens = torch.full((B,), n, dtype=torch.int32, device="cuda")
    sets = []
    for _ in range(nsets):
        q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, n, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        perm = torch.randperm(2 * B * maxp, device="cuda", generator=g)
        table = perm[:B * maxp].view(B, maxp).int()
        kp, vp = (torch.zeros(2 * B * maxp, page, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        kp[table.long().flatten()] = k.reshape(B * maxp, page, Hkv, D)
        vp[table.long().flatten()] = v.reshape(B * maxp, page, Hkv, D)
        sets.append((q, k, v, kp, vp, table))
    a = pt.flash_attention_kvcache(*sets[0][:3], lens)
    b = pt.flash_attention_kvcache(sets[0][0], *sets[0][3:5], lens, page_table=sets[0][5])
    diff = float((a.float() - b.float()).abs().max())
    fns = {"unpaged": lambda i: pt.flash_attention_kvcache(*sets[i][:3], lens),
           "paged": lambda i: pt.flash_attention_kvcache(sets[i][0], *sets[i][3:5], lens, page_table=sets[i][5])}
    ms = time_many(fns, nsets, graphs=True, rounds=11, block_ms=1.0)
    return {"us": {k: v * 1e3 for k, v in ms.items()}, "max_diff": diff}


def report(res: dict[str, Any]) -> str:
    rows = [f"{res['device']}, {res['date']}, commit {res.get('commit', '?')}, torch {res['torch']}", "",
            "| row | unpaged µs | paged µs | unpaged / paged | max output diff |", "|---|---|---|---|---|"]
    ratios = []
    for name, r in res["rows"].items():
        u = r["us"]
        ratios.append(u["unpaged"] / u["paged"])
        rows.append(f"| {name} | {u['unpaged']:.1f} | {u['paged']:.1f} | {ratios[-1]:.3f} | {r['max_diff']:.2g} |")
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        rows += ["", f"paged ≥ 0.9× unpaged on every row: {'met' if min(ratios) >= 0.9 else 'not met'} "
                 f"(min {min(ratios):.3f}, geomean {geo:.3f})"]
    return "\n".join(rows)


def main(out: Path, commit: str) -> None:
    import torch
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "torch": torch.__version__, "commit": commit, "command": "python -m bench torch_decode paged",
           "rows": {}}
    for model, H, Hkv, D, B, n, page in ROWS:
        name = f"{model}_b{B}_n{n}_p{page}"
        r = res["rows"][name] = _one(H, Hkv, D, B, n, page)
        print(name, {k: round(v, 1) for k, v in r["us"].items()}, f"diff {r['max_diff']:.2g}", flush=True)
        out.write_text(json.dumps(res, indent=1, sort_keys=True))
        torch.cuda.empty_cache()
    print(report(res))


if __name__ == "__main__":
    if "--report" in sys.argv:
        print(report(json.loads(Path(sys.argv[sys.argv.index("--report") + 1]).read_text())))
    else:
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.parent.mkdir(parents=True, exist_ok=True)
        main(o, sys.argv[sys.argv.index("--commit") + 1] if "--commit" in sys.argv else "")
