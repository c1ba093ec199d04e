"""The schedule solved for the exact shape a user calls, behind the shape classes.

A shape class serves every shape with one schedule and one shape-generic binary, solved on its representative; the
solver's answer for the shape itself can be much faster (a skinny GEMM's tile and split-K, a short sequence's query
block). On a shape's first call the class's kernel serves it while a worker process solves that shape (``python3 -m
ptsolve.serve exact``: ``ptsolve.optimize`` with the compiler in the loop, none of the class's pinned keys) and
compiles its exact-shape kernel, the very binary the compiler check passed (sizes are build constants, as in
``optimize``'s own kernels; the launcher's tensor maps carry the caller's strides). The answer is kept on disk
(``$PTSOLVE_CACHE_DIR/exact``), so a later process and every later call of the shape run it without solving or
compiling anything. Calls on a shape whose answer is pending are served by the class's kernel and their launches are
not kept (``prepared.Provisional``): the first call after the answer lands switches over. The answer is the model's
EXACT_CANDIDATES best distinct compile-clean schedules (``ptsolve.tune.candidates``: the first choice, then the
next tilings by their bound), and that call races them and the class's kernel once (``race``: a few launches each)
and keeps the fastest, per GPU model: the model ranks schedules that measure 20-30% apart as near ties (a 128-token
batch's 64-key blocks, head_dim 64's three warpgroups: ``bench exact_ab tile_probe``), and a user is never served
slower than the class.

``$PTSOLVE_EXACT`` chooses: ``background`` (the default; needs OR-Tools, else only answers already on disk are used),
``sync`` (solve on the first call and wait: benchmarks, tests), ``off`` (classes only). Decode, varlen and Mamba2
stay on their classes: their lengths change every step, and a step never waits for, or starts, a compile.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ptsolve.errors import PtsolveError

from .classes import HW, ShapeClass
from .kernels import ClassKernel, build
from .table import solvers_installed

MODES = ("background", "sync", "off")
MAX_WORKERS = 1  # solves run one at a time: a worker takes a CPU core and its nvcc another
MAX_PENDING = 256  # shapes queued beyond this are served by their class (and asked for again on a later call)
SOLVE_TIME_LIMIT = 30.0  # seconds per solve (a background worker: no call waits for it); the walk for the other
# candidates stops SOLVE_TIME_LIMIT after the first choice
EXACT_CANDIDATES = 3  # schedules kept per shape and timed against each other and the class's kernel
_VERSION = 4  # bump when an entry's meaning changes: older entries are then solved again


def mode() -> str:
    """``$PTSOLVE_EXACT`` (``background`` when unset); PtsolveError for anything else."""
    m = os.environ.get("PTSOLVE_EXACT", "background").strip().lower()
    if m not in MODES:
        raise PtsolveError(f"PTSOLVE_EXACT={m!r}: choose one of {', '.join(MODES)}")
    return m


def store() -> Path:
    """Where answers are kept: ``$PTSOLVE_CACHE_DIR/exact`` or ``~/.cache/ptsolve/exact``."""
    return Path(os.environ.get("PTSOLVE_CACHE_DIR", Path.home() / ".cache" / "ptsolve")) / "exact"


def shape_key(c: ShapeClass, params: dict[str, Any]) -> str:
    """The file name of a shape's answer: its class, parameters, the hardware table and the entry version."""
    return _shape_key(c, tuple(sorted(params.items())))


@functools.lru_cache(maxsize=4096)
def _shape_key(c: ShapeClass, items: tuple[tuple[str, Any], ...]) -> str:
    # memoised: a model's forward makes new tensors every step, so every attention call prepares a launch and asks
    blob = json.dumps({"class": c.key, "params": dict(items), "hw": HW, "v": _VERSION}, sort_keys=True)
    return f"{c.op}-{hashlib.sha256(blob.encode()).hexdigest()[:20]}"


def solve_exact(c: ShapeClass, params: dict[str, Any], time_limit: float = SOLVE_TIME_LIMIT,
                k: int = EXACT_CANDIDATES) -> dict[str, Any]:
    """Solve ``params`` exactly (CP-SAT, the compiler in the loop) for the ``k`` best distinct compile-clean
    schedules and compile their exact-shape kernels; the entry kept on disk: ``plan`` (the model's first choice) and
    ``candidates`` (the others, best predicted first), or the reason there is none."""
    import ptsolve
    from codegen.plan import plan_from_program
    from codegen.runtime import compile_kernel
    from ptsolve.tune import candidates

    t0 = time.perf_counter()
    try:
        op = ptsolve.ops.make(c.op, **params)
        first = ptsolve.optimize(op, hw=HW, solver="cpsat", time_limit=time_limit, compile_check=True)
        progs = [first.program]
        if k > 1:  # the walk's first candidate is this answer (optimize's cache); it stops a time limit later
            cands, _ = candidates(op, HW, k=2 * k, solver="cpsat", time_limit=time_limit,
                                  deadline=time.time() + time_limit)
            progs = diverse([first.program, *(x.result.program for x in cands)], k)
        plans: list[Any] = []
        for prog in progs:
            plan = plan_from_program(prog)
            if any(plan.to_json() == p.to_json() for p in plans):
                continue
            rep = compile_kernel(build(c, plan, generic=False).ks).report
            if not (rep["spill_stores"] or rep["wgmma_serialized"]):
                plans.append(plan)
        if not plans:
            return {"params": params, "error": f"its kernel spills or serialises ({first.kernel_check})",
                    "seconds": round(time.perf_counter() - t0, 2)}
        return {"params": params, "plan": json.loads(plans[0].to_json()),
                "candidates": [json.loads(p.to_json()) for p in plans[1:]], "status": first.status,
                "predicted_us": round(first.predicted_us, 3), "seconds": round(time.perf_counter() - t0, 2)}
    except PtsolveError as e:
        return {"params": params, "error": str(e).splitlines()[0][:300], "seconds": round(time.perf_counter() - t0, 2)}


def diverse(progs: list[Any], k: int) -> list[Any]:
    """Up to ``k`` of ``progs`` (best predicted first), other kernel structures before ring-depth twins: a race slot
    spent on the first choice's tiling at another ring depth measured within noise of it (bench study peers,
    14e0e0f), where another tile or warpgroup count can measure 10-30% apart."""
    shape = [tuple(sorted((n, v) for n, v in p.graph.tiling.items() if n != "depth")) for p in progs]
    first = [i for i in range(len(progs)) if shape[i] not in shape[:i]]
    rest = [i for i in range(len(progs)) if i not in first]
    return [progs[i] for i in sorted((first + rest)[:k])]


def write_entry(path: Path, entry: dict[str, Any]) -> None:
    """Write an entry atomically (a reader never sees half a file; two writers of one shape agree)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry, sort_keys=True))
    os.replace(tmp, path)


# shape key -> the kernel of its answer, or None where the class's kernel is final for it (no better answer)
_READY: dict[str, ClassKernel | None] = {}
_ALTS: dict[str, list[ClassKernel]] = {}  # shape key -> the kernels of its other candidates
_RUNNING: dict[str, subprocess.Popen] = {}
_QUEUE: dict[str, tuple[ShapeClass, dict[str, Any]]] = {}
_WARNED: list[str] = []


def _settle(key: str, c: ShapeClass, entry: dict[str, Any]) -> ClassKernel | None:
    from codegen.plan import KernelPlan

    ck = None
    if "plan" in entry:
        ck = build(c, KernelPlan.from_json(json.dumps(entry["plan"])), generic=False)
        _ALTS[key] = [build(c, KernelPlan.from_json(json.dumps(p)), generic=False) for p in entry.get("candidates", ())]
    _READY[key] = ck
    return ck


def _read(key: str) -> dict[str, Any] | None:
    try:
        return json.loads((store() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def _start(key: str, c: ShapeClass, params: dict[str, Any]) -> None:
    arg = json.dumps({"class": c.__getstate__(), "params": params, "out": str(store() / f"{key}.json")})
    _RUNNING[key] = subprocess.Popen([sys.executable, "-m", "ptsolve.serve", "exact", arg],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def poll() -> None:
    """Reap finished workers and start queued ones (each call on a pending shape does this)."""
    for key, p in list(_RUNNING.items()):
        if p.poll() is not None:
            del _RUNNING[key]
            if _read(key) is None:  # the worker died without an answer: the class's kernel is final for it
                _READY[key] = None
    while _QUEUE and len(_RUNNING) < MAX_WORKERS:
        key = next(iter(_QUEUE))
        _start(key, *_QUEUE.pop(key))


def wait(timeout: float = 600.0) -> None:
    """Block until every queued and running solve has finished (benchmarks and tests; a server never needs it)."""
    t0 = time.monotonic()
    while _RUNNING or _QUEUE:
        poll()
        if time.monotonic() - t0 > timeout:
            raise PtsolveError(f"exact-shape solves still running after {timeout:.0f} s: {sorted(_RUNNING)}")
        time.sleep(0.05)


def exact_kernel(c: ShapeClass, params: dict[str, Any]) -> tuple[ClassKernel | None, bool]:
    """The kernel of the schedule solved for this exact shape, or None where the class's kernel serves it; and
    whether that is final (False while a solve is pending: the caller must not keep the launch)."""
    key = shape_key(c, params)
    if key in _READY:
        return _READY[key], True
    entry = _read(key)
    if entry is not None:
        return _settle(key, c, entry), True
    m = mode()
    if m == "off":
        _READY[key] = None
        return None, True
    if m == "sync":
        entry = solve_exact(c, params)
        write_entry(store() / f"{key}.json", entry)
        return _settle(key, c, entry), True
    if not solvers_installed():
        if not _WARNED:
            _WARNED.append(key)
            print("ptsolve: exact-shape schedules are not solved here (OR-Tools is not installed); shapes without a "
                  f"kept answer in {store()} run their class's kernel. Set PTSOLVE_EXACT=off to silence this.",
                  file=sys.stderr)
        _READY[key] = None
        return None, True
    if key not in _RUNNING and key not in _QUEUE and len(_QUEUE) < MAX_PENDING:
        _QUEUE[key] = (c, params)
    poll()
    return None, False


_RACED: dict[str, ClassKernel | None] = {}  # shape key -> the fastest of its exact kernels (or None: the class's)
RACE_LAUNCHES = 3  # timed launches of each kernel per round; two rounds, interleaved


def _us(ln: Any, out: int, stream: int) -> float:
    """Microseconds per launch of ``ln`` (CUDA events around RACE_LAUNCHES launches on ``stream``)."""
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(RACE_LAUNCHES):
        ln(stream, out)
    b.record()
    b.synchronize()
    return 1e3 * a.elapsed_time(b) / RACE_LAUNCHES


def race(c: ShapeClass, params: dict[str, Any], ck: ClassKernel, launch: Any, scratch: Any
         ) -> tuple[ClassKernel | None, bool]:
    """Of a shape's exact kernels (``ck``, the model's first choice, and its other candidates) and its class's, the
    one that runs fastest on this GPU: the model can be wrong (an exact attention kernel measured 1.5x slower than
    its class's), so the first call with a GPU times them all (``launch(kernel)`` -> a prepared launch; two rounds
    of a few launches each into ``scratch()``, a new output tensor) and the verdict is kept in the shape's entry,
    per GPU model, for every later call and process (``exact_us``, ``exact1_us``..., ``class_us``; a tie goes to
    the model's order, the class last). While a CUDA graph is being captured nothing can be timed: the class's
    kernel serves, not final."""
    import torch

    key = shape_key(c, params)
    if key in _RACED:
        return _RACED[key], True
    exacts = {"exact": ck, **{f"exact{i}": x for i, x in enumerate(_ALTS.get(key, ()), 1)}}
    out = scratch()
    gpu = torch.cuda.get_device_name(out.device)
    entry = _read(key) or {}
    verdict = entry.get("measured", {}).get(gpu)
    if verdict is None:
        if torch.cuda.is_current_stream_capturing():
            return None, False
        from .kernels import kernel
        from .prepared import current_stream

        lns = {**{n: launch(x) for n, x in exacts.items()}, "class": launch(kernel(c))}
        stream, ptr = current_stream(out.device.index or 0), out.data_ptr()
        for ln in lns.values():
            ln(stream, ptr)  # loads the module, warms the caches
        us = {n: min(_us(ln, ptr, stream) for _ in range(2)) for n, ln in lns.items()}
        verdict = {f"{n}_us": round(u, 2) for n, u in us.items()}
        entry.setdefault("measured", {})[gpu] = verdict
        write_entry(store() / f"{key}.json", entry)
    times = [(verdict.get(f"{n}_us", math.inf), i, n) for i, n in enumerate([*exacts, "class"])]
    _RACED[key] = exacts.get(min(times)[2])
    return _RACED[key], True


def serving(c: ShapeClass, params: dict[str, Any], launch: Any, scratch: Any) -> tuple[ClassKernel | None, bool]:
    """The exact-shape kernel a call of ``params`` runs (``exact_kernel``, kept only where ``race`` measures it faster
    than the class's on this GPU), or None for the class's; and whether that is final."""
    ck, final = exact_kernel(c, params)
    return race(c, params, ck, launch, scratch) if ck is not None else (None, final)


def worker(arg: str) -> int:
    """``python3 -m ptsolve.serve exact JSON``: one shape's solve, its entry written where JSON's ``out`` says."""
    d = json.loads(arg)
    c = ShapeClass(**d["class"])
    write_entry(Path(d["out"]), solve_exact(c, d["params"]))
    return 0
