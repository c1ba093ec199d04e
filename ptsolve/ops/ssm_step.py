"""Mamba2's decode step (mamba_ssm's ``selective_state_update``; ``ptsolve.mamba2_model.recurrent_step``): one token
of the SSM for every batch row b and head j, the state (batch, heads, head_dim, d_state) updated in place:

    dt = clamp(softplus?(dt[b, j] + dt_bias[j]), dt_limit)
    h  = exp(dt·A[j])·h + dt·x[b, j] ⊗ B[b, j // (heads/groups)]
    y  = (h·C[b, j // (heads/groups)] + D·x[b, j])·silu(z[b, j])                     (y in the activations' dtype)

No tensor-core task: memory-bound (the state is read once and written once; everything else is a few hundred bytes
per (batch, head)). A CTA owns PT consecutive rows of one (batch, head)'s head_dim × d_state state and runs its loop
over them, BP rows a trip: ``load_s`` (one bulk copy of the trip's BP·d_state state elements, contiguous) and
``load_in`` (one fill of the trip's x and z rows, the group's B and C rows and, for a D of shape (heads, head_dim),
its rows); per consumer warpgroup g ``step@g`` folds the token into its BP/groups rows in float32 registers and reduces
C·h across the lanes that share a row (warp shuffles), ``put@g`` writes those rows back in the state's dtype and the
rows' y. ``init@g`` (before the loop) computes the tile's dt, exp(dt·A) and D. The tiles are (batch, head, row block),
so a batch of one still gives the SMs work: head_dim/PT tiles per (batch, head). The ring's depth and the rows of a
trip are the solver's choice. Priced bytes: the state in and out, the fills, y; the handful of scalars ``init`` reads
(dt, A, dt_bias, D of shape (heads,)) are left out. Task bodies: codegen.cuda.ssm_step.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import arguments
from ..errors import ShapeError
from ..hw import Hardware
from ..ir import Edge, STaskGraph
from .base import Operator, OpSpec, TextbookPlan, check_keys, dtype_ok, make, positive, reg, register, smem, task

OP = "mamba2_ssm_step"
KEYS = ("batch", "heads", "head_dim", "d_state")
E = 2  # bytes of an fp16/bf16 activation (x, z, B, C, y)
WG_THREADS = 128
VEC = 4  # state elements of one thread's vector (16 bytes of float32, 8 of fp16/bf16)
NVS = (1, 2, 4, 8)  # vectors a thread owns per trip: 4 to 32 float32 registers of state
TRIPS = (1, 2, 4, 8)  # trips of a tile (rows of a tile / rows of a trip)
RING_BYTES = 192 * 1024  # the ring leaves room for the barriers within one SM's shared memory
STATE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def in_bytes(bp: int, n: int) -> int:
    """Bytes of one trip's ``load_in`` slot (its largest fill): x and z (bp each, fp16/bf16), B and C (n each) and
    D's rows (bp float32, only for a D of shape (heads, head_dim)); every part a whole number of 16-byte vectors."""
    return 2 * bp * E + 2 * n * E + bp * 4


def validate(p: dict[str, Any]) -> dict[str, Any]:
    """``batch``, ``heads``, ``head_dim``, ``d_state`` (elements), ``groups`` (B's and C's groups: head j reads group
    j // (heads/groups)), ``dtype`` (x, z, B, C and y) and ``state_dtype`` ("fp32" or ``dtype``) checked:
    d_state one of 16, 32, 64, 128 (the lanes sharing a row sit in one warp), head_dim a multiple of 8 (a trip's x
    rows are whole 16-byte vectors)."""
    p = check_keys(OP, p, KEYS, {"groups": 1, "dtype": "fp16", "state_dtype": "fp32"})
    dtype_ok(p["dtype"])
    positive(**{k: p[k] for k in (*KEYS, "groups")})
    if p["state_dtype"] not in ("fp32", p["dtype"]):
        raise ShapeError(f"{OP}: state_dtype={p['state_dtype']!r}; the state is 'fp32' or the activations' dtype "
                         f"{p['dtype']!r}")
    if p["d_state"] not in (16, 32, 64, 128):
        raise ShapeError(f"{OP}: d_state={p['d_state']} must be 16, 32, 64 or 128 (a row's C·h is reduced within "
                         "one warp)")
    if p["head_dim"] % 8:
        raise ShapeError(f"{OP}: head_dim={p['head_dim']} must be a multiple of 8 (16-byte copies of x's rows)")
    if p["heads"] % p["groups"]:
        raise ShapeError(f"{OP}: heads={p['heads']} must be a multiple of groups={p['groups']}")
    if p["batch"] * p["heads"] * p["head_dim"] >= 1 << 31:
        raise ShapeError(f"{OP}: batch·heads·head_dim = {p['batch'] * p['heads'] * p['head_dim']} must stay below "
                         "2^31 (the kernel's 32-bit row indices); split the batch")
    arguments.size(OP, p["batch"], "batch", p["heads"], "heads")
    return p


def _rows_per_wg(n: int) -> list[int]:
    """Rows a warpgroup owns per trip: 1 to 8 vectors per thread."""
    return [nv * WG_THREADS * VEC // n for nv in NVS]


def _tilings(p: dict[str, Any]) -> Iterator[dict[str, int]]:
    P, N = p["head_dim"], p["d_state"]
    es = STATE_BYTES[p["state_dtype"]]
    for groups in (1, 2):
        for rw in _rows_per_wg(N):
            bp = rw * groups
            if bp % 8 or P % bp:
                continue
            for trips in TRIPS:
                pt = bp * trips
                if P % pt:
                    continue
                for depth in (2, 3, 4):
                    for ctas in (1, 2, 4):
                        if depth <= max(2, trips) and ctas * depth * (bp * N * es + in_bytes(bp, N)) <= RING_BYTES:
                            yield {"BP": bp, "PT": pt, "depth": depth, "groups": groups, "ctas": ctas}


def _check_tiling(p: dict[str, Any], t: dict[str, int]) -> None:
    P, N = p["head_dim"], p["d_state"]
    BP, PT, W = t["BP"], t["PT"], t["groups"]
    if BP % W or BP // W not in _rows_per_wg(N) or BP % 8 or PT % BP or P % PT or PT // BP not in TRIPS:
        raise ShapeError(f"{OP} tiling: BP={BP} rows a trip over {W} warpgroups must give one of "
                         f"{_rows_per_wg(N)} rows each (1 to 8 vectors a thread at d_state {N}), a multiple of 8; "
                         f"PT={PT} rows a tile {TRIPS} trips of BP and dividing head_dim = {P}")


def _build(p: dict[str, Any], t: dict[str, int], hw: Hardware | None = None) -> STaskGraph:
    Bt, H, P, N = (p[k] for k in KEYS)
    _check_tiling(p, t)
    BP, PT, W = t["BP"], t["PT"], t["groups"]
    rw, es = BP // W, STATE_BYTES[p["state_dtype"]]
    tasks = [task("load_s", "load", tile=(BP, N), dtype="fp32", bytes=BP * N * es, is_async=True,
                  allocs=(smem("s", BP * N * es),)),
             # x and z rows, the group's B and C rows, D's rows where it has them: priced at their largest fill
             task("load_in", "load", tile=(in_bytes(BP, N) // E,), bytes=in_bytes(BP, N), is_async=True,
                  allocs=(smem("in", in_bytes(BP, N)),))]
    edges = []
    for g in range(W):
        s = f"@{g}"
        tasks += [
            # dt (bias, softplus, clamp), exp(dt·A) and a scalar D; the updated state rows and their y live in "st"
            task("init" + s, "vector", phase="pre", tile=(1,), dtype="fp32", flops=8, sfu=3, group=g,
                 allocs=(reg("st" + s, rw * N * 4 + rw * 4),)),
            # per element: the update's multiply and fused multiply-add, C·h's fused multiply-add; per row the
            # shuffle tree, the skip and the gate (one exp)
            task("step" + s, "vector", tile=(rw, N), dtype="fp32", flops=4 * rw * N, sfu=rw, group=g,
                 reads=("s", "in", "st" + s), frees=("s", "in")),
            # the rows back in the state's dtype, and their y
            task("put" + s, "store", tile=(rw, N), bytes=rw * N * es + rw * E, group=g, reads=("st" + s,)),
        ]
        edges += [Edge("init" + s, "step" + s), Edge("load_s", "step" + s), Edge("load_in", "step" + s),
                  Edge("step" + s, "put" + s), Edge("put" + s, "step" + s, 1)]
    return STaskGraph(name=f"ssm_step_b{Bt}_h{H}_p{P}_n{N}", op=OP, params=dict(p), tiling=dict(t),
                      tasks=tuple(tasks), edges=tuple(edges), row=(PT // BP,) * (P // PT), rows=Bt * H,
                      useful_flops=4 * Bt * H * P * N)


def _textbook(params: dict[str, Any], tiling: dict[str, int], overlap: bool) -> TextbookPlan:
    """Load the trip's state rows and inputs, then every warpgroup folds the token in and writes its rows back; with
    no tensor-core task there is nothing to overlap (``overlap`` is the same order) and no turn order."""
    wgs = range(int(tiling["groups"]))
    return TextbookPlan({"pre": {f"wg{g}": [(f"init@{g}", 0)] for g in wgs},
                         "loop": {"producer": [("load_s", 0), ("load_in", 0)]}
                         | {f"wg{g}": [(f"step@{g}", 0), (f"put@{g}", 0)] for g in wgs},
                         "post": {f"wg{g}": [] for g in wgs}}, [])


def mamba2_ssm_step(batch: int, heads: int, head_dim: int, d_state: int, groups: int = 1, dtype: str = "fp16",
                    state_dtype: str = "fp32") -> Operator:
    """Mamba2's one-token SSM update, in place on the state (batch, heads, head_dim, d_state) of ``state_dtype``
    ("fp32" or ``dtype``): x, z (batch, heads, head_dim), B, C (batch, groups, d_state) in ``dtype`` → y in
    ``dtype``."""
    return make(OP, batch=batch, heads=heads, head_dim=head_dim, d_state=d_state, groups=groups, dtype=dtype,
                state_dtype=state_dtype)


register(OP, OpSpec(
    validate, _tilings, _build, aliases=("ssm_step",), plan=_textbook, builder=mamba2_ssm_step,
    out_tile=lambda t: (t["BP"],), from_out_tile=lambda p, o: {"BP": o[0], "PT": o[0]}, optional={"ctas": 1}))
