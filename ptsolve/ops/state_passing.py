"""Mamba2 SSD state passing (mamba_ssm's ``_state_passing_fwd``): the recurrence over chunks

    s_c = keep_c · exp(dA_cumsum[b, h, c, chunk − 1]) · s_{c−1} + states[b, c, h]       (s_{−1} = initial or 0)

on float32 chunk states (batch, chunks, heads, head_dim·d_state), writing the states entering each chunk
(s_{−1}, …, s_{nc−2}) in the activations' dtype and the final one s_{nc−1} in float32.

No tensor-core task: memory-bound. A CTA owns BE consecutive elements of one (batch, head)'s head_dim·d_state
state and runs its loop over the chunks in order: ``load_s`` (one bulk copy of BE float32, the chunk's states) and
``load_dec`` (the 16 bytes ending at the chunk's last dA_cumsum, and those holding its keep flag); per consumer
warpgroup g ``put@g`` writes the running state (the one entering the chunk) to global memory in the dtype, then
``step@g`` folds the chunk in: s = keep·exp(dA_last)·s + states. ``init@g`` loads the initial state before the loop,
``store@g`` writes the final one after it. The chunks are the loop's trips, so the ring's depth (how many chunks'
states are in flight) is the solver's choice. Task bodies: codegen.cuda.state_passing.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import arguments
from ..errors import ShapeError
from ..hw import Hardware
from ..ir import Edge, STaskGraph
from .base import Operator, OpSpec, TextbookPlan, check_keys, dtype_ok, make, positive, reg, register, smem, task

OP = "mamba2_state_passing"
KEYS = ("batch", "chunks", "heads", "head_dim", "d_state")
E = 2  # bytes of an fp16/bf16 entering-state element; the chunk states and the running state are float32 (4)
WG_THREADS = 128
VEC = 4  # float32 elements of one 16-byte vector: what a thread moves at a time
PER_WG = (512, 1024, 2048, 4096)  # elements a warpgroup owns: 1 to 8 vectors per thread, 4 to 32 registers
DEC_BYTES = 32  # the dA_cumsum vector and the keep vector of one chunk
RING_BYTES = 192 * 1024  # the ring leaves room for the barriers within one SM's shared memory


def validate(p: dict[str, Any]) -> dict[str, Any]:
    """``batch``, ``chunks``, ``heads``, ``head_dim``, ``d_state`` (elements), ``chunk`` (positions of a chunk:
    where its last dA_cumsum lies) and ``dtype`` (the entering states') checked; head_dim·d_state a multiple of 512
    (a warpgroup's 128 threads move whole 16-byte vectors) and chunk a multiple of 4 (its last dA_cumsum ends a
    16-byte vector)."""
    p = check_keys(OP, p, KEYS, {"chunk": 256, "dtype": "fp16"})
    dtype_ok(p["dtype"])
    positive(**{k: p[k] for k in (*KEYS, "chunk")})
    pn = p["head_dim"] * p["d_state"]
    if pn % (WG_THREADS * VEC):
        raise ShapeError(f"{OP}: head_dim·d_state = {p['head_dim']}·{p['d_state']} = {pn} must be a multiple of "
                         f"{WG_THREADS * VEC} (128 threads' 16-byte vectors); pad d_state")
    if p["chunk"] % VEC:
        raise ShapeError(f"{OP}: chunk={p['chunk']} must be a multiple of {VEC} (dA_cumsum's last element ends a "
                         "16-byte vector the kernel copies)")
    # the kernel's int indices: (batch, chunk) and (batch, head) pairs, and its tiles (up to 16 per (batch, head))
    if p["batch"] * p["heads"] * max(p["chunks"], 16) >= 1 << 31:
        raise ShapeError(f"{OP}: batch·heads·max(chunks, 16) = {p['batch'] * p['heads'] * max(p['chunks'], 16)} must "
                         "stay below 2^31 (the kernel's 32-bit indices); split the batch")
    arguments.size(OP, p["batch"] * p["heads"], "batch·heads", p["chunks"], "chunks")
    return p


def _tilings(p: dict[str, Any]) -> Iterator[dict[str, int]]:
    pn = p["head_dim"] * p["d_state"]
    for groups in (1, 2):
        for ew in PER_WG:
            for depth in (2, 3, 4, 6, 8):
                for ctas in (1, 2):
                    be = ew * groups
                    if pn % be == 0 and ctas * depth * (be * 4 + DEC_BYTES) <= RING_BYTES:
                        yield {"BE": be, "depth": depth, "groups": groups, "ctas": ctas}


def _build(p: dict[str, Any], t: dict[str, int], hw: Hardware | None = None) -> STaskGraph:
    B, NC, H, P, N = (p[k] for k in KEYS)
    BE, W = t["BE"], t["groups"]
    ew = BE // W
    if BE % W or ew not in PER_WG or (P * N) % BE:
        raise ShapeError(f"{OP} tiling: BE={BE} over {W} warpgroups must give one of {PER_WG} elements each and "
                         f"divide head_dim·d_state = {P * N}")
    tasks = [task("load_s", "load", tile=(BE,), dtype="fp32", bytes=BE * 4, is_async=True,
                  allocs=(smem("s", BE * 4),)),
             # the 16 bytes ending at the chunk's last dA_cumsum and the 16 holding its keep flag (seq_idx)
             task("load_dec", "load", tile=(2 * VEC,), dtype="fp32", bytes=DEC_BYTES, is_async=True,
                  allocs=(smem("dec", DEC_BYTES),))]
    edges = []
    for g in range(W):
        s = f"@{g}"
        tasks += [
            # the initial state (or zeros) into this warpgroup's running state, float32 registers; its read from
            # global memory (once per tile: 1/chunks of the loop's traffic) is left out of the priced bytes
            task("init" + s, "vector", phase="pre", tile=(ew,), dtype="fp32", flops=ew, group=g,
                 allocs=(reg("st" + s, ew * 4),)),
            # the state entering this chunk, converted to the dtype and written straight from registers
            task("put" + s, "store", tile=(ew,), bytes=ew * E, group=g, reads=("st" + s,)),
            # per element one fused multiply-add; one exp per chunk
            task("step" + s, "vector", tile=(ew,), dtype="fp32", flops=2 * ew, sfu=1, group=g,
                 reads=("s", "dec", "st" + s), frees=("s", "dec")),
            task("store" + s, "store", phase="post", tile=(ew,), dtype="fp32", bytes=ew * 4, group=g,
                 reads=("st" + s,)),
        ]
        edges += [Edge("init" + s, "put" + s), Edge("put" + s, "step" + s), Edge("step" + s, "put" + s, 1),
                  Edge("load_s", "step" + s), Edge("load_dec", "step" + s), Edge("step" + s, "store" + s)]
    return STaskGraph(name=f"state_passing_b{B}_c{NC}_h{H}_p{P}_n{N}", op=OP, params=dict(p), tiling=dict(t),
                      tasks=tuple(tasks), edges=tuple(edges), row=(NC,) * (P * N // BE), rows=B * H,
                      useful_flops=2 * B * NC * H * P * N)


def _textbook(params: dict[str, Any], tiling: dict[str, int], overlap: bool) -> TextbookPlan:
    """Load the chunk, then every warpgroup writes its entering state and folds the chunk in; with no tensor-core
    task there is nothing to overlap (``overlap`` is the same order) and no turn order."""
    wgs = range(int(tiling["groups"]))
    return TextbookPlan({"pre": {f"wg{g}": [(f"init@{g}", 0)] for g in wgs},
                         "loop": {"producer": [("load_s", 0), ("load_dec", 0)]}
                         | {f"wg{g}": [(f"put@{g}", 0), (f"step@{g}", 0)] for g in wgs},
                         "post": {f"wg{g}": [(f"store@{g}", 0)] for g in wgs}}, [])


def mamba2_state_passing(batch: int, chunks: int, heads: int, head_dim: int, d_state: int, chunk: int = 256,
                         dtype: str = "fp16") -> Operator:
    """Mamba2's state passing over ``chunks`` chunks of ``chunk`` positions: float32 chunk states (batch, chunks,
    heads, head_dim, d_state) → the entering states in ``dtype`` and the final state float32."""
    return make(OP, batch=batch, chunks=chunks, heads=heads, head_dim=head_dim, d_state=d_state, chunk=chunk,
                dtype=dtype)


register(OP, OpSpec(
    validate, _tilings, _build, aliases=("state_passing",), plan=_textbook, builder=mamba2_state_passing,
    out_tile=lambda t: (t["BE"],), from_out_tile=lambda p, o: {"BE": o[0]}, optional={"ctas": 1}))
