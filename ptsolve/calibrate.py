"""Calibration: fit the hardware table's estimated entries to what generated kernels measured on the GPU.

A ``Sample`` is one schedule (an SProgram) and what its kernel measured: the kernel time (µs) and, where the
profiler ran (codegen.profile), the steady-state initiation interval (SM clock cycles). The forward model is the
replay of the schedule's own orders under candidate constants (``simulate(..., mode="asap")``: every task starts as
soon as its inputs, its resources and its ring slot allow), so a fit moves the constants, not the schedules. The
fit minimises the mean squared log ratio of predicted to measured kernel times (and IIs, where measured) by a
deterministic coordinate search in log space over ``FIT``; ``evaluate`` reports MAPE, Spearman rank correlation
within a configuration and exact-vs-greedy sign agreement on held-out samples. ``write`` stores the fitted values
as ``<hw>.calibrated.json`` beside the table (ptsolve.hw loads it by default) with their provenance.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import PtsolveError
from .hw import HERE, Hardware, overlay_path
from .program import SProgram

# the entries the tables mark as estimates (besides the datasheet numbers), each with its search range
FIT: dict[str, tuple[float, float]] = {
    "mem_latency": (100, 2000), "l2_bytes_per_clk": (8, 128), "tc_fixed": (0, 512), "tc_latency": (0, 512),
    "barrier_cycles": (8, 512), "issue_cycles": (4, 256), "vector_efficiency": (0.1, 1.0), "launch_us": (0, 20),
    "tc_handoff": (0, 512), "coresident": (0, 1.0), "ring_handoff": (0, 2000),  # costs the datasheet has no entry for
}
INTS = {"mem_latency", "tc_fixed", "tc_latency", "barrier_cycles", "issue_cycles", "tc_handoff", "ring_handoff"}


@dataclass(frozen=True)
class Sample:
    """One measured kernel: ``name`` (e.g. FA3_cpsat), ``config`` (FA3: samples of one configuration are ranked
    against each other), ``policy``, the schedule, its measured kernel time (µs) and measured II (cycles, or None)."""

    name: str
    config: str
    policy: str
    program: SProgram
    kernel_us: float
    ii: float | None = None
    # the profiler's timeline of one CTA: its trip count and the start of each (task, iteration) after its
    # waits, cycles from the CTA's first probe
    trip: int = 0
    starts: dict[tuple[str, int], float] = field(default_factory=dict, compare=False)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


def predicted(s: Sample, hw: Hardware) -> tuple[float, float]:
    """(kernel µs, steady II in cycles) of the sample's schedule replayed as soon as possible under ``hw``. CTAs of
    other trip counts than the shortest and the longest are interpolated linearly between those two replays (a CTA
    of n iterations takes prologue + (n − 1)·II + drain in the replay too), which keeps a fit's many evaluations
    cheap for causal attention's many trip counts."""
    from .simulate import kernel_cycles, replay

    g = s.program.graph
    trips = sorted(set(g.row))
    lo, hi = trips[0], trips[-1]
    ev_hi, _ = replay(s.program, hw, hi, "asap")
    c_hi = max(e.end for e in ev_hi)
    c_lo = c_hi if lo == hi else max(e.end for e in replay(s.program, hw, lo, "asap")[0])
    cta = {n: c_hi if hi == lo else c_lo + (c_hi - c_lo) * (n - lo) / (hi - lo) for n in trips}
    kc, _ = kernel_cycles(g, hw, {n: int(round(v)) for n, v in cta.items()}, s.program.placement)
    starts: dict[str, list[tuple[int, int]]] = {}
    for e in ev_hi:
        if g.task[e.task].phase == "loop":
            starts.setdefault(e.task, []).append((e.iteration, e.start))
    meds = []
    for xs in starts.values():
        xs.sort()
        d = [b[1] - a[1] for a, b in zip(xs, xs[1:]) if 2 <= a[0] and b[0] <= xs[-1][0] - 2]
        if d:
            meds.append(statistics.median(d))
    return hw.cycles_to_us(kc) + hw.launch_us, float(statistics.median(meds)) if meds else float("nan")


def replayed_starts(s: Sample, hw: Hardware) -> dict[tuple[str, int], float]:
    """Start of every (task, iteration) when one CTA of the sample's measured trip count replays under ``hw``."""
    from .simulate import replay
    ev, _ = replay(s.program, hw, s.trip, "asap")
    return {(e.task, e.iteration): float(e.start) for e in ev}


TIMELINE_OFFSET = 2000.0  # cycles added to both sides of a start-time ratio, so the first tasks do not dominate


def loss(samples: Sequence[Sample], hw: Hardware, relative: float = 0.0) -> float:
    """Mean squared log ratio of predicted to measured kernel times, plus that of the IIs where measured, plus the
    mean squared log ratio of replayed to measured task start times where a timeline was measured; plus, weighted by
    ``relative``, the variance of the kernel-time log ratios within each configuration (its candidates' times
    relative to each other: what choosing among them depends on)."""
    terms = []
    ratios: dict[str, list[float]] = {}
    for s in samples:
        us, ii = predicted(s, hw)
        terms.append(math.log(us / s.kernel_us) ** 2)
        ratios.setdefault(s.config, []).append(math.log(us / s.kernel_us))
        if s.ii and s.ii > 0 and ii == ii and ii > 0:
            terms.append(math.log(ii / s.ii) ** 2)
        if s.starts and s.trip:
            rep = replayed_starts(s, hw)
            common = [k for k in s.starts if k in rep]
            if common:
                terms.append(sum(math.log((rep[k] + TIMELINE_OFFSET) / (s.starts[k] + TIMELINE_OFFSET)) ** 2
                                 for k in common) / len(common))
    spread = [(x - statistics.mean(xs)) ** 2 for xs in ratios.values() for x in xs]
    return sum(terms) / len(terms) + (relative * sum(spread) / len(spread) if relative else 0.0)


def _set(hw: Hardware, k: str, v: float) -> Hardware:
    lo, hi = FIT[k]
    v = min(hi, max(lo, v))
    return replace(hw, **{k: int(round(v)) if k in INTS else float(v)})


def fit(samples: Sequence[Sample], hw: Hardware, params: Sequence[str] = tuple(FIT), rounds: int = 6,
        progress: Callable[[str], None] | None = None, relative: float = 0.0,
        deadline: float | None = None) -> tuple[Hardware, list[float]]:
    """Constants of ``params`` (within FIT's ranges) that minimise ``loss`` on ``samples``, by pattern search in log
    space: a sweep tries every parameter scaled by 1 ± step and 1 ± step/2 (and 0 where 0 is in range; from 0, 1/64,
    1/16 and 1/4 of its range's top), keeping
    improvements; a sweep that improves nothing halves the step; ``rounds`` halvings in all (at most 8 sweeps per
    step). Returns the fitted table and the loss after each sweep. ``deadline`` (``time.time()`` seconds): the search
    stops there with the best constants so far (a wall-clock bound for ``ptsolve calibrate --time-limit``)."""
    if not samples:
        raise PtsolveError("calibrate: no samples to fit; give measured schedules (codegen.profile output)")
    bad = sorted(set(params) - set(FIT))
    if bad:
        raise PtsolveError(f"calibrate: cannot fit {bad}; fittable entries are {sorted(FIT)}")
    best, cur = hw, loss(samples, hw, relative)
    hist = [cur]
    step = 0.5
    for _round in range(rounds):
        if deadline is not None and time.time() > deadline:
            if progress:
                progress(f"the time limit ran out after {len(hist) - 1} sweeps; the best constants so far stand")
            break
        for _sweep in range(8):
            before = cur
            for k in params:
                v0 = float(getattr(best, k))
                cands = sorted({v0 * (1 + step), v0 / (1 + step), v0 * (1 + step / 2), v0 / (1 + step / 2)}
                               | ({0.0} if FIT[k][0] == 0 else set())
                               | ({FIT[k][1] / 64, FIT[k][1] / 16, FIT[k][1] / 4} if v0 == 0 else set()))
                for v in cands:
                    trial = _set(best, k, v)
                    if getattr(trial, k) == getattr(best, k):
                        continue
                    lv = loss(samples, trial, relative)
                    if lv < cur - 1e-12:
                        best, cur = trial, lv
            hist.append(cur)
            if cur >= before - 1e-12:
                break
        if progress:
            progress(f"step {step:.4f}: loss {cur:.5f} " + " ".join(f"{k}={getattr(best, k)}" for k in params))
        step /= 2
    return best, hist


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN for fewer than 3 values or a constant side."""
    if len(a) < 3:
        return float("nan")

    def ranks(x: Sequence[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va and vb else float("nan")


def evaluate(samples: Sequence[Sample], hw: Hardware) -> dict[str, Any]:
    """Fidelity on ``samples``: per sample predicted and measured µs; MAPE of the kernel time; Spearman within each
    configuration with at least 3 schedules; the share of configurations with a greedy and an exact sample whose
    predicted and measured exact-vs-greedy speedups have the same sign (a tie counts as agreeing with a tie)."""
    rows, by = [], {}
    for s in samples:
        us, ii = predicted(s, hw)
        rows.append({"name": s.name, "config": s.config, "policy": s.policy, "pred_us": us, "meas_us": s.kernel_us,
                     "err": us / s.kernel_us - 1, "pred_ii": ii, "meas_ii": s.ii})
        by.setdefault(s.config, []).append(rows[-1])
    rho = {c: spearman([r["pred_us"] for r in rs], [r["meas_us"] for r in rs]) for c, rs in by.items() if len(rs) >= 3}
    signs = []
    for rs in by.values():
        g = [r for r in rs if r["policy"] == "greedy"]
        x = [r for r in rs if r["policy"] == "cpsat"]
        if g and x:
            def sgn(v: float) -> int:
                return 0 if abs(v) < 0.01 else (1 if v > 0 else -1)
            signs.append(sgn(g[0]["pred_us"] / x[0]["pred_us"] - 1) == sgn(g[0]["meas_us"] / x[0]["meas_us"] - 1))
    return {"rows": rows, "mape": sum(abs(r["err"]) for r in rows) / len(rows) if rows else float("nan"),
            "spearman": rho, "sign_agreement": sum(signs) / len(signs) if signs else float("nan"),
            "sign_configs": len(signs)}


def write(hw: Hardware, base: Hardware, provenance: str, path: str | Path | None = None,
          keys: Sequence[str] = tuple(FIT)) -> Path:
    """``<name>.calibrated.json`` (in $PTSOLVE_CALIBRATION_DIR, else beside the built-in tables, unless ``path``)
    with every fitted entry of ``keys`` that differs from ``base``, each with ``provenance`` as its source;
    ptsolve.hw.load overlays it on the table.
    Entries of the file outside ``keys`` (another fit's) are kept."""
    p = Path(path) if path else overlay_path(HERE / f"{hw.name}.json")
    out = {k: v for k, v in (json.loads(p.read_text()) if p.exists() else {}).items() if k not in keys}
    out |= {k: {"value": getattr(hw, k), "source": f"ptsolve.calibrate: {provenance} (table value "
                                                   f"{getattr(base, k)})"}
            for k in keys if getattr(hw, k) != getattr(base, k)}
    p.write_text(json.dumps(out, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    return p


def write_op(fitted: Hardware, base: Hardware, op: str, provenance: str, keys: Sequence[str],
             path: str | Path | None = None) -> Path:
    """Store the entries ``keys`` of ``fitted`` that differ from ``base`` as ``op``'s own constants (Hardware.
    op_constants: they price ``op``'s graphs only) in the overlay ``write`` writes; other entries and other
    operators' constants are kept, and so are ``op``'s entries not named in ``keys``."""
    p = Path(path) if path else overlay_path(HERE / f"{fitted.name}.json")
    out = json.loads(p.read_text()) if p.exists() else {}
    cur = out.get("op_constants", {"value": {}, "source": ""})
    own = {k: getattr(fitted, k) for k in sorted(keys) if getattr(fitted, k) != getattr(base, k)}
    kept = {k: v for k, v in cur["value"].get(op, {}).items() if k not in keys}
    value = {o: v for o, v in cur["value"].items() if o != op} | ({op: kept | own} if kept | own else {})
    notes = [x for x in cur["source"].split(" | ") if x and not (x.startswith(f"{op}: ") and
                                                                 any(f" {k} " in x for k in keys))]
    notes += [f"{op}: ptsolve.calibrate: {provenance} (table values "
              + ", ".join(f"{k} {getattr(base, k)}" for k in own) + ")"] if own else []
    out["op_constants"] = {"value": dict(sorted(value.items())), "source": " | ".join(sorted(notes))}
    if not value:
        del out["op_constants"]
    p.write_text(json.dumps(out, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    return p


def task_extra(profiled: Sequence[tuple[dict[str, Any], SProgram]], hw: Hardware) -> dict[str, dict[str, Any]]:
    """Per ``op/task/groups`` key (cost.task_key) of the profiled kernels' vector loop tasks: the cycles its body
    measured beyond the model's stream occupancy of it on ``hw`` without task_extra, the fit for hw.task_extra.

    ``profiled``: (a codegen.profile Profile as JSON, the SProgram it ran). A task's measured body is the median of
    t2 − t1 (after its waits, before the next probe) over its loop instances; each warpgroup's copy of a task is
    one observation, the extra is the median over all observations less the model's cycles, at least 0 (work a
    probe shows in a neighbour's body is that neighbour's). Returns {key: {"extra": cycles, "observations":
    [(kernel, task, measured, model)]}}, sorted by key."""
    from .cost import task_key, timings
    bare = replace(hw, task_extra={})
    obs: dict[str, list[tuple[str, str, float, int]]] = {}
    for prof, prog in profiled:
        g = prog.graph
        if prof.get("op") != g.op:
            raise PtsolveError(f"profile {prof.get('kernel')!r} is of {prof.get('op')!r}, its schedule of {g.op!r}: "
                               "pair each profile with the schedule it was measured from")
        tm = timings(g, bare)
        busy: dict[str, list[int]] = {}
        for e in prof["events"]:
            t = g.task.get(e["task"])
            if t is not None and t.kind == "vector" and e["phase"] == "loop":
                busy.setdefault(t.name, []).append(int(e["t2"]) - int(e["t1"]))
        for n, xs in sorted(busy.items()):
            obs.setdefault(task_key(g.op, g.task[n], g.groups), []).append(
                (str(prof.get("kernel")), n, float(statistics.median(xs)), tm[n].busy(tm[n].stream)))
    return {k: {"extra": max(0, int(round(statistics.median(m - c for _, _, m, c in v)))), "observations": v}
            for k, v in sorted(obs.items())}


def store_rates(profiled: Sequence[tuple[dict[str, Any], SProgram]]) -> dict[str, dict[str, Any]]:
    """Hardware.reg_store_bytes_per_clk and staged_store_bytes_per_clk from profiled kernels: per kernel and kind of
    store (``STask.staged``), the bytes its tile's warpgroups store together (the graph's post-phase store tasks of
    that kind: a cooperative tile's warpgroups store at once; a ping-pong graph is one warpgroup's tile) over the
    measured cycles of that epilogue (the slowest warpgroup's median body, t2 − t1, over the sampled tiles; a
    ping-pong kernel's second warpgroup runs the graph's tasks under its own names). The fit per kind is the median
    rate over the kernels, B/clk/SM. Returns {field: {"value": rate, "observations": [(kernel, bytes, cycles)]}}."""
    obs: dict[str, list[tuple[str, int, float]]] = {}
    for prof, prog in profiled:
        g = prog.graph
        if prof.get("op") != g.op:
            raise PtsolveError(f"profile {prof.get('kernel')!r} is of {prof.get('op')!r}, its schedule of {g.op!r}: "
                               "pair each profile with the schedule it was measured from")
        stores = [t for t in g.tasks if t.kind == "store" and t.phase == "post" and t.bytes]
        own = {t.name.split("@")[0] for t in stores}
        body: dict[tuple[str, str], list[int]] = {}  # (role, task) -> bodies over the sampled tiles
        for e in prof["events"]:
            if e["phase"] == "post" and e["task"].split("@")[0] in own:
                body.setdefault((e["role"], e["task"]), []).append(int(e["t2"]) - int(e["t1"]))
        for staged in (False, True):
            mine = {t.name.split("@")[0] for t in stores if t.staged == staged}
            med = [statistics.median(v) for (_, n), v in sorted(body.items()) if n.split("@")[0] in mine]
            if med and max(med) > 0:
                key = "staged_store_bytes_per_clk" if staged else "reg_store_bytes_per_clk"
                nbytes = sum(t.bytes for t in stores if t.staged == staged)
                obs.setdefault(key, []).append((str(prof.get("kernel")), nbytes, float(max(med))))
    return {k: {"value": statistics.median(b / c for _, b, c in v), "observations": v} for k, v in sorted(obs.items())}


def samples_from_study(candidates: dict[str, Any], study: dict[str, Any]) -> list[Sample]:
    """Samples of a codegen.study run: every schedule that passed its check and was timed, with the profiler's II and
    timeline where it was profiled; ``meta['held_out']`` says whether its configuration is held out."""
    out = []
    for name, e in candidates["configs"].items():
        got = study["configs"].get(name)
        if not got:
            continue
        for c in e["candidates"]:
            us = got["measured_us"].get(c["label"])
            if us is None or not got["checks"].get(c["label"], {}).get("ok"):
                continue
            prof = got.get("profiles", {}).get(c["label"], {})
            starts = {(k.rsplit("|", 1)[0], int(k.rsplit("|", 1)[1])): v for k, v in prof.get("starts", {}).items()}
            out.append(Sample(f"{name}/{c['label']}", name, c["policy"], SProgram.from_json(c["program"]), float(us),
                              prof.get("ii") if prof.get("ii") == prof.get("ii") else None, int(prof.get("trip", 0)),
                              starts, {"held_out": e["held_out"], "rank": c["rank"],
                                       "library": {k: v for k, v in got["measured_us"].items()
                                                   if not k.startswith(("cpsat", "greedy"))}}))
    return out
