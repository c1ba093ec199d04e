"""The per-sTask profiler: what a generated kernel does, task by task, on the GPU.

``lower(..., profile=True)`` switches the skeleton's probes on (codegen.cuda.skeleton: one elected thread per role
of a few sampled CTAs reads ``clock64`` before a task's waits, after them and after its body, into a device
buffer). ``measure(schedule)`` runs the plain and the instrumented kernel on random inputs (one device call),
reads the buffer back and returns a ``Profile``: per sampled CTA, role, task and iteration the cycles spent
waiting and working, the measured initiation interval and span, the kernel time and the probes' own overhead.
``parse`` turns a recorded buffer into events on any machine (the CPU tests feed it recorded buffers);
``timeline`` gives them the structure of ``ptsolve.simulate``'s Timeline, so ``gantt`` draws predicted and
measured side by side, one row per role.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ptsolve.errors import CodegenError
from ptsolve.hw import DEFAULT_HW

from .cuda.skeleton import PHASE_CODE, PROF_CTAS, PROF_HDR, PROF_REC, prof_cap
from .kernel_ir import KernelIR

PHASES = {v: k for k, v in PHASE_CODE.items()}


@dataclass(frozen=True)
class MEvent:
    """One measured task instance, cycles of its SM's clock from the sampled CTA's first probe: ``t0`` the role
    reached the task, ``t1`` its waits (mbarrier, wgmma) were over, ``t2`` its body was issued."""

    cta: int
    role: str
    task: str
    phase: str
    iteration: int
    t0: int
    t1: int
    t2: int

    @property
    def wait(self) -> int:
        return self.t1 - self.t0

    @property
    def busy(self) -> int:
        return self.t2 - self.t1


@dataclass(frozen=True)
class Profile:
    """A kernel measured on the GPU. ``ii`` (cycles): median over the loop tasks of the median distance between the
    starts of consecutive steady iterations; ``span`` (cycles): a sampled CTA's first probe to its last, median over
    the CTAs; ``kernel_us`` / ``instrumented_us``: median launch times of the plain and the instrumented kernel;
    ``overhead`` = instrumented / plain − 1. ``smid``: the SM of each sampled CTA."""

    kernel: str
    op: str
    events: tuple[MEvent, ...]
    ii: float
    span: float
    kernel_us: float = 0.0
    instrumented_us: float = 0.0
    smid: tuple[int, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def overhead(self) -> float:
        return self.instrumented_us / self.kernel_us - 1 if self.kernel_us else float("nan")

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"overhead": self.overhead}, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> Profile:
        d = json.loads(s)
        d.pop("overhead", None)
        d["events"] = tuple(MEvent(**e) for e in d["events"])
        d["smid"] = tuple(d["smid"])
        return cls(**d)


def parse(words: Any, ir: KernelIR) -> tuple[list[MEvent], list[int]]:
    """Events and SM ids of the sampled CTAs from the profile buffer of ``ir``'s instrumented kernel (uint64
    words, codegen.cuda.skeleton's layout). Times are relative to each CTA's earliest probe."""
    cap = prof_cap(ir)
    region = PROF_HDR + PROF_REC * cap
    roles = [r.name for r in ir.roles]
    n = len(words)
    if n < PROF_CTAS * len(roles) * region:
        raise CodegenError(f"profile buffer of {n} words is shorter than the {PROF_CTAS * len(roles) * region} the "
                           "kernel writes: was it recorded for another KernelIR?")
    events: list[MEvent] = []
    smids: list[int] = []
    for c in range(PROF_CTAS):
        raw, origin, sm = [], None, None
        for k, role in enumerate(roles):
            base = (c * len(roles) + k) * region
            if not int(words[base + 1]):
                continue  # this role of this CTA was not sampled (fewer CTAs than PROF_CTAS)
            sm = int(words[base])
            origin = int(words[base + 2]) if origin is None else min(origin, int(words[base + 2]))
            for i in range(cap):
                r = base + PROF_HDR + PROF_REC * i
                meta = int(words[r])
                if not meta >> 63:
                    break
                task = (meta >> 32) & 0xFFFFFF
                if task >= len(ir.tasks):
                    raise CodegenError(f"profile record names task {task}; the KernelIR has {len(ir.tasks)}")
                raw.append((role, ir.tasks[task].name, PHASES[(meta >> 56) & 0x7F], meta & 0xFFFFFFFF,
                            int(words[r + 1]), int(words[r + 2]), int(words[r + 3])))
        if origin is None:
            continue
        smids.append(sm if sm is not None else -1)
        for role, task, ph, it, t0, t1, t2 in raw:
            it = it - (1 << 32) if it >= 1 << 31 else it
            events.append(MEvent(c, role, task, ph, it, t0 - origin, t1 - origin, t2 - origin))
    return events, smids


def measured_ii(events: list[MEvent], skip: int = 2) -> float:
    """Median over the loop tasks of the median start-to-start distance of consecutive iterations, leaving out
    ``skip`` iterations at either end (the pipeline filling and draining); NaN without a steady loop."""
    per: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for e in events:
        if e.phase == "loop":
            per.setdefault((e.cta, e.task), []).append((e.iteration, e.t1))
    meds = []
    for xs in per.values():
        xs.sort()
        last = xs[-1][0] if xs else 0
        d = [b[1] - a[1] for a, b in zip(xs, xs[1:]) if b[0] == a[0] + 1 and a[0] >= skip and b[0] <= last - skip]
        if d:
            meds.append(statistics.median(d))
    return float(statistics.median(meds)) if meds else float("nan")


def span(events: list[MEvent]) -> float:
    """Median over the sampled CTAs of (last probe − first probe), cycles."""
    by: dict[int, list[MEvent]] = {}
    for e in events:
        by.setdefault(e.cta, []).append(e)
    s = [max(e.t2 for e in es) - min(e.t0 for e in es) for es in by.values()]
    return float(statistics.median(s)) if s else float("nan")


def task_means(p: Profile, base: bool = False) -> dict[str, tuple[float, float]]:
    """``role:task`` -> (mean cycles waiting, mean cycles working) over the steady-loop instances of every sampled
    CTA; ``base``: tasks by their base name (``exp2@0`` counted as ``exp2``)."""
    acc: dict[str, list[int]] = {}
    for e in p.events:
        if e.phase == "loop":
            w = acc.setdefault(f"{e.role}:{e.task.split('@')[0] if base else e.task}", [0, 0, 0])
            w[0] += e.wait
            w[1] += e.busy
            w[2] += 1
    return {k: (w[0] / w[2], w[1] / w[2]) for k, w in sorted(acc.items())}


def timeline(p: Profile, cta: int = 0) -> Any:
    """One sampled CTA as a ptsolve.simulate.Timeline (holds: the role's stream from t1 to t2; a wait shows as a gap),
    so ``ptsolve.report.gantt`` draws it."""
    from ptsolve.simulate import Event, Timeline

    ev = tuple(Event(e.task, e.role, e.iteration, e.t1, e.t2, e.t0, ((e.role, e.t1, max(e.t2, e.t1 + 1)),))
               for e in p.events if e.cta == cta)
    trip = 1 + max((e.iteration for e in ev), default=0)
    end = max((e.end for e in ev), default=0)
    return Timeline(ev, {trip: end}, end, p.kernel_us, 0.0, 0, trip)


def gantt(predicted: Any, measured: Profile, path: str | Path, title: str = "", iterations: int = 4) -> Path:
    """Predicted (simulate's timeline) above measured (one sampled CTA), one row per role, the first ``iterations``
    loop iterations; writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ptsolve.report import gantt as draw

    fig, (a, b) = plt.subplots(2, 1, figsize=(13, 7))
    draw(predicted, a, f"{title} predicted (cycles)", max_iterations=iterations)
    draw(timeline(measured), b, f"{title} measured on the GPU, CTA 0 (SM clock cycles)", max_iterations=iterations)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def measure(schedule: Any, hw: str = DEFAULT_HW, seed: int = 0, nsets: int = 2) -> tuple[Profile, Any]:
    """Profile a schedule (SProgram, KernelPlan or KernelIR) on this machine's GPU: the plain kernel and the
    instrumented one, timed back to back (CUDA graphs, interleaved rounds), and the instrumented one's buffer
    parsed. Returns the Profile and the raw buffer (uint64 words). Needs torch, cuda-python and an sm_90 GPU.
    ``hw``: the table the schedule is lowered for (default ptsolve.hw.DEFAULT_HW, as every entry point; it is not
    detected)."""
    import dataclasses

    import numpy as np
    import torch

    from .cuda import emit_ir
    from .harness import random_args, time_many
    from .lower import lower
    from .runtime import load

    ir = schedule if isinstance(schedule, KernelIR) else lower(schedule, hw)
    plain, inst = emit_ir(dataclasses.replace(ir, profile=False)), emit_ir(dataclasses.replace(ir, profile=True))
    kp, ki = load(plain), load(inst)
    sets = [random_args(plain, seed + i) for i in range(nsets)]
    buf = torch.zeros(inst.info["profile_words"], dtype=torch.int64, device="cuda")
    ptrs = [{k: v.data_ptr() for k, v in s.items()} for s in sets]

    def stream() -> int:  # read at each launch: a CUDA graph captures on a side stream of its own
        return int(torch.cuda.current_stream().cuda_stream)

    ms = time_many({"plain": lambda i: kp.launch(ptrs[i], stream()),
                    "inst": lambda i: ki.launch(ptrs[i] | {"prof": buf.data_ptr()}, stream())}, nsets, graphs=True)
    buf.zero_()
    ki.launch(ptrs[0] | {"prof": buf.data_ptr()}, stream())
    torch.cuda.synchronize()
    words = buf.cpu().numpy().view(np.uint64)
    ev, sm = parse(words, ir)
    return Profile(inst.name, ir.op, tuple(ev), measured_ii(ev), span(ev), ms["plain"] * 1e3, ms["inst"] * 1e3,
                   tuple(sm), {"params": ir.params, "tiling": ir.tiling, "predicted_ii": ir.predicted_ii,
                               "device": torch.cuda.get_device_name()}), words


def main(argv: list[str] | None = None) -> int:
    """python3 -m codegen.profile --schedules DIR --only NAME,... --out DIR: profile committed schedules (Result JSON,
    solved on the CPU) on this GPU; writes <name>.profile.json, <name>.npz (the raw buffer and the KernelIR) and a
    predicted-vs-measured Gantt chart <name>.png; prints a table last."""
    import argparse

    import numpy as np

    from ptsolve.errors import ConfigError, PtsolveError
    from ptsolve.fileio import read_json
    from ptsolve.hw import load as load_hw
    from ptsolve.result import Result
    from ptsolve.simulate import simulate
    from ptsolve.validate import check_valid

    from .lower import lower

    class Parser(argparse.ArgumentParser):  # one-line errors, as every ptsolve command
        def error(self, message: str) -> Any:  # type: ignore[override]
            raise ConfigError(f"{message} (see `ptsolve profile --help`)")

    ap = Parser(prog="ptsolve profile", description="profile committed schedules on this GPU: "
                "per-task timelines, measured II and span, probe overhead, predicted-vs-measured Gantt charts")
    ap.add_argument("--schedules", required=True,
                    help="folder of Result JSON files solved with the current model (e.g. tests/data/sched_new)")
    ap.add_argument("--only", required=True, help="comma-separated file stems, e.g. FA3_cpsat,FA3_greedy")
    ap.add_argument("--hw", default=DEFAULT_HW, help="hardware table the schedules were solved for")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--time-limit", type=float, default=900.0,
                    help="wall-clock seconds: no schedule starts after it (the ones left are named)")
    a = ap.parse_args(argv)
    deadline = time.time() + a.time_limit
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    hw = load_hw(a.hw)
    rows = []
    names = a.only.split(",")
    for i, name in enumerate(names):
        if i and time.time() > deadline:
            print(f"ptsolve profile: the time limit ({a.time_limit:g} s) ran out; not profiled: "
                  f"{', '.join(names[i:])}", file=sys.stderr)
            break
        r = Result.from_json(json.dumps(read_json(Path(a.schedules) / f"{name}.json", "schedule")))
        if not (v := check_valid(r.program, hw)):  # its predicted timeline would be meaningless (or deadlock)
            first = str(v).splitlines()[1].strip() if len(str(v).splitlines()) > 1 else str(v)
            raise PtsolveError(f"{name}: the schedule is not valid for the current {hw.name} table ({first}); it was "
                               f"solved with an older model or table: solve it again with ptsolve optimize --hw "
                               f"{hw.name}, or pass the table it was solved with (--hw PATH)")
        ir = lower(r.program, hw)
        prof, words = measure(ir, a.hw)
        (out / f"{name}.profile.json").write_text(prof.to_json())
        np.savez_compressed(out / f"{name}.npz", words=words, ir=np.array(ir.to_json()))
        pred = simulate(r.program, hw)
        gantt(pred, prof, out / f"{name}.png", name)
        rows.append((name, ir.predicted_ii, prof.ii, pred.cta, prof.span, r.predicted_us, prof.kernel_us,
                     prof.overhead))
        print(f"{name}: predicted ii {ir.predicted_ii} measured {prof.ii:.0f} cycles; kernel {prof.kernel_us:.1f} us, "
              f"probes +{100 * prof.overhead:.1f}%", flush=True)
    print("| schedule | pred ii | measured ii | pred CTA cycles | measured span | pred µs | measured µs | "
          "probe overhead |")
    print("|---|---|---|---|---|---|---|---|")
    for n, pi, mi, pc, ms_, pu, mu, ov in rows:
        print(f"| {n} | {pi} | {mi:.0f} | {pc} | {ms_:.0f} | {pu:.1f} | {mu:.1f} | {100 * ov:+.1f}% |")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
