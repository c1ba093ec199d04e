"""A/B on the GPU (one process, interleaved, CUDA graphs): the tensor-core turns the skeleton enforces between two
consumer warpgroups that read the same ring slots (GEMM, Mamba2), on and off; and ChunkState's old CP-SAT
program with the xs copies its start times use (1) and with two. Kernels compiled beforehand (carried cubins)."""
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))
from codegen.cuda import emit  # noqa: E402
from codegen.harness import (
    random_args,  # noqa: E402
    time_many,  # noqa: E402
)
from codegen.plan import default_plan, plan_from_program  # noqa: E402
from codegen.runtime import load  # noqa: E402
from ptsolve.result import Result  # noqa: E402

ST = {"batch": 64, "seq": 1024, "heads": 64, "head_dim": 64, "d_state": 128, "chunk": 256, "groups": 1, "dtype": "bf16"}
CS = ST | {"seq": 2048, "batch": 4}
G = {"M": 8192, "N": 8192, "K": 8192, "dtype": "fp16"}
root = Path(__file__).parents[2]
st3 = plan_from_program(Result.from_json((root / "results/schedules_h200/ST3_cpsat.json").read_text()).program, "h200")
TILE_ST = {"BM": 128, "BK": 64, "depth": 2, "groups": 2, "ctas": 2}
TILE_CS = {"BM": 128, "BK": 64, "depth": 2, "groups": 2}
TILE_G = {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}
st_hand = default_plan("mamba2_chunk_state", ST, TILE_ST, True)
cs_hand = default_plan("mamba2_chunk_scan", CS, TILE_CS)
g_hand = default_plan("gemm", G, TILE_G)
off = {"turns": False}
cases = {
    "ST hand g2 2cta overlap": {"turns": (st_hand, {}), "no turns": (st_hand, off)},
    "ST3 old cpsat program": {"xs 1 copy": (st3, {}),
                              "xs 2 copies": (dataclasses.replace(st3, copies={"xs@0": 2}), {})},
    "CS hand g2 bk64": {"turns": (cs_hand, {}), "no turns": (cs_hand, off)},
    "GEMM 8192 128x256 d4 g2": {"turns": (g_hand, {}), "no turns": (g_hand, off)},
}
if sys.argv[1:] == ["compile"]:
    from codegen.runtime import compile_kernel
    for c in cases.values():
        for p, kw in c.values():
            compile_kernel(emit(p, "h200", **kw))
    sys.exit(0)
import torch  # noqa: E402

out = {}
for name, c in cases.items():
    ks = {k: emit(p, "h200", **kw) for k, (p, kw) in c.items()}
    kern = {k: load(v) for k, v in ks.items()}
    sets = [random_args(next(iter(ks.values())), s) for s in range(2)]
    ptrs = [{k: t.data_ptr() for k, t in s.items()} for s in sets]
    fns = {k: (lambda i, kk=kk, ptrs=ptrs: kk.launch(ptrs[i], int(torch.cuda.current_stream().cuda_stream)))
           for k, kk in kern.items()}
    ms = time_many(fns, 2, graphs=True, rounds=30)
    out[name] = {k: v * 1e3 for k, v in ms.items()}
    print(name, {k: round(v * 1e3, 1) for k, v in ms.items()}, flush=True)
print(json.dumps(out))
