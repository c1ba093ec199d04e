"""A/B on the GPU: old emitter's kernels (results/ab/old_sources.json, emitted at ae3a8a0) against the skeleton's
(new_sources.json) for the same schedules, interleaved in one process (codegen.bench.time_many, CUDA graphs)."""

import json

import torch

from codegen.bench import time_many
from codegen.cuda.common import KernelSource, TensorMapSpec
from codegen.runtime import load, random_args


def ks_of(d):
    d = dict(d)
    d["tensor_maps"] = tuple(TensorMapSpec(**m) for m in d["tensor_maps"])
    for k in ("grid", "block", "args", "flags"):
        d[k] = tuple(d[k])
    return KernelSource(**d)


old = {k: ks_of(v) for k, v in json.load(open("results/ab/old_sources.json")).items()}
new = {k: ks_of(v) for k, v in json.load(open("results/ab/new_sources.json")).items()}
rows = []
for name in old:
    cands = {"old": old[name], "new": new[name]} | (
        {"new_early": new[name + "_early"]} if name + "_early" in new else {}
    )
    kern = {k: load(v) for k, v in cands.items()}
    sets = [random_args(old[name], s) for s in range(2)]
    ptrs = [{k: t.data_ptr() for k, t in s.items()} for s in sets]

    def mk(kk, pp=ptrs):
        return lambda i: kk.launch(pp[i], int(torch.cuda.current_stream().cuda_stream))

    ms = time_many({k: mk(v) for k, v in kern.items()}, 2, graphs=True, rounds=30)
    rows.append((name, ms))
    print(name, {k: round(v * 1e3, 1) for k, v in ms.items()}, flush=True)
print("| schedule | old µs | new µs | new / old | new, CB released before packing µs |")
print("|---|---|---|---|---|")
for n, ms in rows:
    e = f"{ms['new_early'] * 1e3:.1f}" if "new_early" in ms else "—"
    print(f"| {n} | {ms['old'] * 1e3:.1f} | {ms['new'] * 1e3:.1f} | {ms['new'] / ms['old']:.3f} | {e} |")
