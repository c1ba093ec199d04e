"""The ``ptsolve`` command line: optimize one operator, compare the policies over a suite, place CTAs.

Every error is one line on stderr and exit status 2 (1 for a broken pipe, 130 for an interrupt); every
file written is announced with a ``wrote <path>`` line. Outputs go under ``--out`` (default
``$PTSOLVE_OUT_DIR`` or ``~/ptsolve-out``), never into the current folder or the repository's ``results/``
unless asked for with ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import inspect
import io
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from . import ops  # noqa: F401  (the face registers the operators it offers)
from .arguments import PLACEMENTS, SOLVER_NAMES
from .calibrate import FIT as CAL_FIT
from .errors import ConfigError, InfeasibleError, PtsolveError, SchemaError
from .fileio import read_json, write_text
from .hw import DEFAULT_HW
from .opspec import aliases, spec_of
from .provenance import stamp

OPS = aliases()  # every name the command takes for an operator -> its registered name (each spec's aliases)
DETERMINISTIC_HELP = ("reproducible search: the same schedule, status and bound under any machine load, --jobs "
                      "and --executor. --time-limit is then CP-SAT deterministic time, not seconds (its unit is "
                      "nominally a second of one core; it took 3-4 s on a 2-core test machine), for the whole "
                      "search, split evenly over the tilings that fit, with no wall-clock deadline. Solvers cpsat, "
                      "cpsat-orders, greedy, exhaustive (milp: an error)")
LEGEND = """notation: one line per phase (pre = prologue, once; loop = steady state, one iteration every ii
  cycles; post = epilogue, once after the last iteration) and warp role (producer = the TMA warp, wgN =
  consumer warpgroup N), tasks in issue order. task[sK]@C: the task starts at cycle C (loop tasks: in
  iteration 0; C mod ii is its slot in the steady state), K = C // ii its pipeline stage, omitted when 0
  (the emitted loop's iteration j runs it for reduction iteration j - K)."""


def _value(v: str) -> Any:
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    try:
        return int(v)
    except ValueError:
        return v


def parse_params(items: list[str]) -> dict[str, Any]:
    """``["batch=64", "causal=true"]`` -> {"batch": 64, "causal": True}."""
    out = {}
    for it in items:
        if "=" not in it or not it.split("=", 1)[0]:
            raise PtsolveError(f"parameter {it!r} is not key=value (e.g. batch=64); `ptsolve ops` lists each "
                               "operator's parameters")
        k, v = it.split("=", 1)
        if k in out:
            raise PtsolveError(f"parameter {k!r} given twice")
        out[k] = _value(v)
    return out


def provenance() -> dict[str, str]:
    """Date, commit and machine (ptsolve.provenance), plus the command line, for every results file."""
    return stamp() | {"command": "ptsolve " + " ".join(sys.argv[1:])}


def default_out() -> Path:
    """Where outputs go without --out: $PTSOLVE_OUT_DIR, else ~/ptsolve-out (outside any checkout)."""
    return Path(os.environ.get("PTSOLVE_OUT_DIR") or Path.home() / "ptsolve-out")


def out_dir(a: argparse.Namespace) -> Path:
    """The --out folder, created; a PtsolveError naming it when it is a file or cannot be created."""
    d = Path(a.out) if a.out else default_out()
    if d.exists() and not d.is_dir():
        raise PtsolveError(f"--out {str(d)!r} is a file, not a folder; name a folder (it is created if missing)")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PtsolveError(f"--out {str(d)!r} cannot be created ({e.strerror or e}); name a writable folder") from e
    return d


def _safe(name: str) -> str:
    """A hardware or graph name as one file-name component (a table path becomes its name, no separators)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "hw"


def _wrote(*paths: Path) -> None:
    for p in paths:
        print(f"wrote {p}", flush=True)


def _hw(a: argparse.Namespace) -> Any:
    from .hw import load

    return load(a.hw)


def op_help(name: str | None = None) -> str:
    """Each operator's parameters (from the signatures of its builder: its spec's, else ptsolve.ops' function of its
    name), with defaults and aliases."""

    if name is not None and name not in OPS:
        raise PtsolveError(f"unknown operator {name!r}; use one of {sorted(OPS)}")
    out = []
    for full in sorted(set(OPS.values())):
        if name is not None and OPS[name] != full:
            continue
        fn = spec_of(full).builder or getattr(ops, full)
        ps = [k + ("" if v.default is inspect.Parameter.empty else f"={v.default}")
              for k, v in inspect.signature(fn).parameters.items()]
        alias = sorted(k for k, v in OPS.items() if v == full and k != full)
        out.append(full + (f" (also: {', '.join(alias)})" if alias else "") + f": {' '.join(ps)}\n  "
                   + (fn.__doc__ or "").strip())
    return "\n".join(out) + "\nParameters without a default are required; write them as key=value."


def cmd_calibrate(a: argparse.Namespace) -> int:
    """Fit on the study's training configurations, evaluate before and after on its held-out ones."""
    from datetime import datetime, timezone

    from .calibrate import evaluate, fit, samples_from_study, write, write_op
    from .hw import load

    hw = load(a.hw, calibrated=False)  # fit from the datasheet table, not from an overlay already on disk
    cands = read_json(a.candidates, "--candidates file")
    study = read_json(a.study, "--study file")
    try:
        samples = samples_from_study(cands, study)
    except PtsolveError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise SchemaError(f"--candidates {a.candidates!r} / --study {a.study!r} are not a study's candidates and its "
                          f"measurements ({type(e).__name__}: {e}); make them with `python -m bench study prepare` "
                          "and `... run`") from None
    if a.op:
        ops = sorted({x.program.graph.op for x in samples})
        samples = [x for x in samples if x.program.graph.op == a.op]
        if not samples:
            raise PtsolveError(f"{a.study}: no measured schedules of operator {a.op!r}; the study has {ops}")
    train = [x for x in samples if not x.meta["held_out"]]
    held = [x for x in samples if x.meta["held_out"]]
    if not train:
        raise PtsolveError(f"{a.study}: no measured training schedules (were the checks all failing?)")
    params = tuple(x for x in a.params.split(",") if x)
    fitted, hist = fit(train, hw, params, a.rounds, progress=lambda m: print(m, file=sys.stderr), relative=a.relative,
                       deadline=time.time() + a.time_limit)
    rep = {"hw": a.hw, "op": a.op, "relative": a.relative, "params": params, "loss": hist,
           "fitted": {k: getattr(fitted, k) for k in params},
           "table": {k: getattr(hw, k) for k in params}, "train": len(train), "held_out": len(held),
           "before": {"train": evaluate(train, hw), "held_out": evaluate(held, hw) if held else None},
           "after": {"train": evaluate(train, fitted), "held_out": evaluate(held, fitted) if held else None},
           "study": {"device": study.get("device"), "candidates_date": cands.get("date")}} | provenance()
    out = out_dir(a)
    f = out / f"calibrate_{_safe(a.hw)}.json"
    write_text(f, json.dumps(rep, indent=1, default=str))
    print(f"wrote {f}")
    for when in ("before", "after"):
        for part in ("train", "held_out"):
            e = rep[when][part]
            if e:
                rho = [v for v in e["spearman"].values() if v == v]
                print(f"{when:6} {part:8}: MAPE {100 * e['mape']:.1f}%, Spearman median "
                      f"{sorted(rho)[len(rho) // 2] if rho else float('nan'):.2f} over {len(rho)} configs, sign "
                      f"agreement {e['sign_agreement']:.2f} over {e['sign_configs']} configs")
    if a.write:
        stamp_ = provenance()
        src = (f"fitted on {len(train)} measured schedules of {len({x.config for x in train})} configurations "
               f"({study.get('device')}, {datetime.now(timezone.utc):%Y-%m-%d}, commit {stamp_.get('commit')}); "
               f"`ptsolve calibrate --candidates {a.candidates} --study {a.study}"
               + (f" --op {a.op}" if a.op else "") + (f" --relative {a.relative:g}" if a.relative else "")
               + " --write`")
        print(f"wrote {write_op(fitted, hw, a.op, src, params) if a.op else write(fitted, hw, src, keys=params)}")
    return 0


def cmd_calibrate_tasks(a: argparse.Namespace) -> int:
    """Fit hw.task_extra from profiler timelines (ptsolve.calibrate.task_extra) and print it next to the data."""
    from dataclasses import replace
    from datetime import datetime, timezone

    from .calibrate import task_extra, write
    from .hw import load
    from .result import Result

    hw = load(a.hw)
    pairs = []
    deadline, left_out = time.time() + a.time_limit, []
    for d in a.profiles:
        files = sorted(Path(d).glob("*.profile.json"))
        if not files:
            raise PtsolveError(f"{d}: no *.profile.json files (write them with `ptsolve profile --out {d}`)")
        for f in files:
            if pairs and time.time() > deadline:  # the fit takes what was read in time, and says what was not
                left_out.append(str(f))
                continue
            sched = Path(a.schedules) / f"{f.name[:-len('.profile.json')]}.json"
            if not sched.exists():
                raise PtsolveError(f"{f}: its schedule {sched} does not exist; pass --schedules, the folder of the "
                                   "Result JSON files the profiles were measured from")
            pairs.append((read_json(f, "profile"), Result.from_json(json.dumps(read_json(sched, "schedule"))).program))
    if left_out:
        print(f"ptsolve: the time limit ({a.time_limit:g} s) ran out; not read: {', '.join(left_out)}", file=sys.stderr)
    fit_ = task_extra(pairs, hw)
    print("| op/task | measured body, cycles (kernel: median per warpgroup) | model cycles | extra |")
    print("|---|---|---|---|")
    for k, v in fit_.items():
        ms = ", ".join(f"{m:.0f}" for _, _, m, _ in v["observations"])
        mc = sorted({c for _, _, _, c in v["observations"]})
        print(f"| {k} | {ms} | {', '.join(map(str, mc))} | {v['extra']} |")
    if a.write:
        # zeros too: a fitted 0 is a measurement, an absent key borrows a neighbouring warpgroup count's entry
        new = replace(hw, task_extra={k: v["extra"] for k, v in fit_.items()})
        st = provenance()
        src = (f"fitted on {len(pairs)} profiled kernels ({', '.join(a.profiles)}; "
               f"{datetime.now(timezone.utc):%Y-%m-%d}, commit {st.get('commit')}); `ptsolve calibrate-tasks "
               f"--profiles {' '.join(a.profiles)} --schedules {a.schedules} --hw {a.hw} --write`")
        print(f"wrote {write(new, replace(hw, task_extra={}), src, keys=('task_extra',))}")
    return 0


def cmd_tune(a: argparse.Namespace) -> int:
    """Prepare, run (with a GPU runner) or finish a measured selection."""
    from .hw import load
    from .tune import candidates, finish, tune

    if a.op not in OPS:
        raise PtsolveError(f"unknown operator {a.op!r}; use one of {sorted(OPS)}")
    op = ops.make(OPS[a.op], **parse_params(a.params))
    hw = load(a.hw)
    if a.prepare:
        cands, rejected = candidates(op, hw, a.top_k, a.solver, a.search_limit, per=a.per,
                                     deterministic=a.deterministic, deadline=_deadline(a))
        doc = {"hw": hw.name, "op": op.op, "params": op.params, "top_k": a.top_k, "solver": a.solver,
               "time_limit": a.search_limit, "rejected": rejected, **({"per": a.per} if a.per else {}),
               **({"deterministic": True} if a.deterministic else {}),
               "candidates": [{"rank": c.rank, "tiling": c.tiling, "predicted_us": c.result.predicted_us,
                               "check": c.check.status, "program": c.result.program.to_json(),
                               "result": c.result.to_json()} for c in cands]}
        write_text(a.prepare, json.dumps(doc, indent=1))
        print(f"wrote {a.prepare} ({len(cands)} candidates, {len(rejected)} tilings rejected by the compiler)")
        return 0
    if a.finish:
        doc = read_json(a.finish, "--finish file")
        try:
            r = finish(op, hw, doc)
        except PtsolveError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise SchemaError(f"--finish {a.finish!r} is not what `python3 -m codegen.tune_runner` writes "
                              f"({type(e).__name__}: {e})") from None
        for m in r.measured:
            print(f"rank {m['rank']}: {m['tiling']} predicted {m['predicted_us']:.1f} µs, measured "
                  f"{m['measured_us']:.1f} µs" + ("  <- measured best" if m["measured_us"] == r.measured_us else ""))
        print(r)
        print("cached: `ptsolve tune` of this shape now returns it without timing")
        return 0
    print(tune(op, hw, a.top_k, solver=a.solver, time_limit=a.search_limit, per=a.per, deterministic=a.deterministic,
               deadline=_deadline(a)))
    return 0


def cmd_ops(a: argparse.Namespace) -> int:
    print(op_help(a.name))
    return 0


def cmd_optimize(a: argparse.Namespace) -> int:
    from . import optimize
    from .report import gantt_svg
    from .simulate import simulate

    if a.op not in OPS:
        raise PtsolveError(f"unknown operator {a.op!r}; use one of {sorted(OPS)} (`ptsolve ops` lists their "
                           "parameters)")
    op = ops.make(OPS[a.op], **parse_params(a.params))
    hw = _hw(a)
    out = out_dir(a)
    res = optimize(op, hw=hw, solver=a.solver, time_limit=a.time_limit, cache=not a.no_cache,
                   placement=a.placement, executor=a.executor, jobs=a.jobs, decoupled=a.decoupled,
                   fix=parse_params(a.fix) if a.fix else None,
                   progress=(lambda s: print(s, file=sys.stderr)) if a.verbose else None,
                   compile_check=False if a.no_compile_check else None, deterministic=a.deterministic)
    print(res)
    for f in res.features:
        print("  " + f)
    print(res.program.summary(hw))
    print(LEGEND)
    stem = str(out / f"{_safe(res.program.graph.name)}_{_safe(hw.name)}_{a.solver}")
    write_text(stem + ".json", res.to_json())
    # an SVG drawn by hand, not matplotlib: its import alone is slower than a cached answer is allowed to be
    title = f"{res.program.graph.name} — {res.solver}, {res.predicted_us:.1f} µs"
    write_text(stem + ".svg", gantt_svg(simulate(res.program, hw), title=title))
    _wrote(Path(stem + ".json"), Path(stem + ".svg"))
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from .cache import code_fingerprint
    from .search import check_deterministic
    from .suites import SUITES

    hw = _hw(a)
    solvers = list(dict.fromkeys(x.strip() for x in a.solvers.split(",") if x.strip()))
    bad = [x for x in solvers if x not in SOLVER_NAMES]
    if bad or not solvers:
        raise PtsolveError(f"--solvers {a.solvers!r}: unknown {bad}; use a comma-separated list of {SOLVER_NAMES}")
    every = SUITES[a.suite]()
    prefixes = [x.strip() for x in a.only.split(",") if x.strip()]
    cfgs = [c for c in every if not prefixes or any(c["name"].startswith(x) for x in prefixes)]
    if not cfgs:
        raise PtsolveError(f"--only {a.only!r} matches no configuration of suite {a.suite!r}; its names are "
                           f"{', '.join(c['name'] for c in every[:6])}, ... (prefixes match, e.g. --only FA1,GEMM)")
    for s in solvers:  # before the first configuration is solved
        check_deterministic(s, "even", a.deterministic)
    out = out_dir(a)
    stem = out / f"compare_{_safe(hw.name)}"
    part = Path(str(stem) + ".partial.json")
    sig = hashlib.sha256(json.dumps([a.suite, hw.to_dict(), solvers, a.search_limit, a.decoupled,
                                     [c["name"] for c in cfgs], code_fingerprint(),
                                     *(["deterministic"] if a.deterministic else [])], sort_keys=True,
                                    default=str).encode()).hexdigest()
    done: dict[str, dict[str, Any]] = {}
    if part.exists():
        try:
            saved = json.loads(part.read_text())
        except (OSError, ValueError):
            saved = {}
        if saved.get("signature") == sig:
            done = {r["config"]: r for r in saved.get("rows", [])}
            print(f"resuming: {len(done)}/{len(cfgs)} configurations already in {part}", file=sys.stderr)
    todo = [c for c in cfgs if c["name"] not in done]
    rows_by = {c["name"]: done[c["name"]] for c in cfgs if c["name"] in done}
    bar = _progress(len(cfgs), len(rows_by))
    opts = dict(solvers=solvers, time_limit=a.search_limit, cache=not a.no_cache, compile_check=a.compile_check,
                deterministic=a.deterministic, decoupled=a.decoupled, deadline=_deadline(a))
    for row in _compare_rows(todo, hw, opts, a.jobs or os.cpu_count() or 1):
        rows_by[row["config"]] = row
        rows = [rows_by[c["name"]] for c in cfgs if c["name"] in rows_by]  # suite order, whatever finishes first
        bar.update(1)
        bar.set_postfix_str(row["config"])
        # partial results as they complete: a CSV to look at and a file to resume from after an interrupt
        _write_csv(Path(str(stem) + ".csv"), rows)
        write_text(part, json.dumps({"signature": sig, "rows": rows}, sort_keys=True))
    bar.close()
    rows = [rows_by[c["name"]] for c in cfgs]
    _write_csv(Path(str(stem) + ".csv"), rows)
    prov = provenance()
    write_text(str(stem) + ".md", compare_markdown(rows, solvers, a, prov, hw.name))
    written = [Path(str(stem) + ".csv"), Path(str(stem) + ".md")]
    if _bar_chart(rows, solvers, Path(str(stem) + ".png"), hw.name):
        written.append(Path(str(stem) + ".png"))
    part.unlink(missing_ok=True)
    print(Path(str(stem) + ".md").read_text())
    _wrote(*written)
    return 0


WHOLE = {False: 600.0, True: 900.0}  # default --time-limit of placement, compare (s): far above a normal run


def _deadline(a: argparse.Namespace) -> float | None:
    """The epoch second the command's --time-limit runs out (time.time(): worker processes read the same clock);
    None for a deterministic run, which no wall clock may cut short."""
    return None if a.deterministic else time.time() + a.time_limit


def _left(opts: dict[str, Any]) -> float | None:
    """Seconds left of the command's --time-limit (None: no wall-clock bound)."""
    return None if opts.get("deadline") is None else opts["deadline"] - time.time()


def _progress(total: int, initial: int) -> Any:
    """A progress bar on stderr with an ETA (tqdm), or a stand-in that prints nothing where tqdm is missing."""
    try:
        from tqdm import tqdm
        return tqdm(total=total, initial=initial, desc="compare", unit="config", file=sys.stderr,
                    bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining} left{postfix}]")
    except ImportError:  # pragma: no cover
        class _Quiet:
            def update(self, n: int) -> None: ...
            def set_postfix_str(self, s: str) -> None: ...
            def close(self) -> None: ...
        return _Quiet()


def _compare_rows(cfgs: list[dict[str, Any]], hw: Any, opts: dict[str, Any], jobs: int) -> Any:
    """Yield each configuration's compare row as it completes. With ``jobs`` > 1 the configurations are solved
    side by side in worker processes, each search serial inside one: a configuration's solves are too short to keep
    a pool of their own busy, the suite's many configurations are not. Ctrl-C stops the workers too."""
    from .pools import unordered

    if len(cfgs) == 1:  # one configuration: its searches get the processes
        yield compare_row(cfgs[0], hw, opts, jobs)
        return
    for _, row in unordered(compare_row, [(c, hw, opts, 1) for c in cfgs], jobs):
        yield row


def compare_row(c: dict[str, Any], hw: Any, opts: dict[str, Any], jobs: int = 1) -> dict[str, Any]:
    """One configuration of a suite under every solver of ``opts`` (and the decoupled ablation): latencies (µs),
    TFLOP/s, status, gap, solve seconds, tiling, features; every answer replayed by ``simulate`` first."""
    from . import optimize
    from .errors import PtsolveError as Err
    from .simulate import claimed_cycles, simulate
    from .suites import operator

    op = operator(c)
    solvers = opts["solvers"]
    row: dict[str, Any] = {"config": c["name"], "op": c["op"], "params": json.dumps(c["params"], sort_keys=True)}
    if _left(opts) is not None and _left(opts) <= 0:
        return row | {"reached": False}  # the command's --time-limit ran out before this configuration

    def common() -> dict[str, Any]:
        left = _left(opts)
        # replay=False: every policy's answer under the one objective the study compares (optimize's declared-order
        # replay would swap in a schedule the formula ranks lower, bench study replay_orders)
        return dict(hw=hw, time_limit=opts["time_limit"] if left is None else min(opts["time_limit"], max(0.5, left)),
                    cache=opts["cache"], jobs=jobs, compile_check=opts["compile_check"],
                    deterministic=opts["deterministic"], replay=False)
    for s in solvers:
        try:
            r = optimize(op, solver=s, **common())
        except InfeasibleError as e:  # this configuration has no answer of s's: said in the table, the rest go on
            return row | {"reached": False, "failed": f"{s}: {str(e).splitlines()[0][:400]}"}
        tl = simulate(r.program, hw)
        if tl.kernel_cycles != claimed_cycles(r.program, hw) or tl.late or tl.kernel_cycles != r.objective:
            raise Err(f"{c['name']} {s}: simulate() gives {tl.kernel_cycles} cycles but the policy claims "
                      f"{r.objective}: a ptsolve bug, please report it")
        row |= {f"{s}_us": round(r.predicted_us, 3), f"{s}_cycles": r.objective,
                f"{s}_check": (r.kernel_check or {}).get("status", ""), f"{s}_tflops": round(r.tflops, 1),
                f"{s}_status": r.status,
                f"{s}_gap": round(r.gap, 4) if r.gap is not None else "", f"{s}_solve_s": round(r.solve_s, 2),
                f"{s}_cached": r.cached,
                f"{s}_tiling": json.dumps(r.tiling, sort_keys=True), f"{s}_solved": f"{r.solved}/{r.tilings}"}
        if s != "greedy":
            row[f"{s}_features"] = "; ".join(f.split(":")[0] for f in r.features)
    if opts["decoupled"]:
        try:
            r = optimize(op, solver="cpsat", decoupled=True, **common())
            row |= {"decoupled_us": round(r.predicted_us, 3),
                    "decoupled_tiling": json.dumps(r.tiling, sort_keys=True)}
        except InfeasibleError as e:  # the roofline's one tiling refused by the compiler: an empty cell, said why
            row |= {"decoupled_us": "", "decoupled_failed": str(e).splitlines()[0][:400]}
    if "greedy" in solvers:
        for s in solvers:
            if s != "greedy":
                row[f"speedup_{s}"] = round(row["greedy_us"] / row[f"{s}_us"], 4)
    return row


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    write_text(path, buf.getvalue())


def cmd_placement(a: argparse.Namespace) -> int:
    """Inter-EU placement of the exact schedules of every suite entry with unequal CTAs."""
    from . import optimize
    from .placement import exact_loads, lower_bound, sm_loads
    from .simulate import unit_floor
    from .suites import SUITES, operator

    hw = _hw(a)
    out = out_dir(a)
    prov = provenance()
    lines = [f"# Inter-EU placement on {hw.name}: even split vs the block scheduler vs longest-first vs exact "
             "(predicted)", "",
             f"- command: `{prov['command']}`", f"- date: {prov['date']}", f"- commit: {prov['commit']}",
             f"- machine: {prov['machine']}", "",
             "Kernel latency (µs, busiest SM + launch) of the CP-SAT schedule of each configuration whose CTAs have "
             "unequal trip counts, placed four ways over the SM slots (SMs × resident CTAs). `dynamic`: launch "
             "order, each CTA to the slot that frees first (the GPU's block scheduler); `exact`: CP-SAT over how "
             f"many CTAs of each latency each slot runs ({a.search_limit:.0f} "
             + ("units of CP-SAT deterministic time" if a.deterministic else "s")
             + " limit), proven = optimal; `bound`: max(average slot load, longest CTA). With co-resident CTAs every "
             "column is at least the SMs' shared-unit floor.", "",
             "| config | CTAs | even µs | dynamic µs | lpt µs | exact µs | exact proven | bound µs | even / lpt |",
             "|---|---|---|---|---|---|---|---|---|"]
    path = out / f"placement_{_safe(hw.name)}.md"
    opts = {"deadline": _deadline(a)}
    missed = []
    for c in SUITES[a.suite]():
        left = _left(opts)
        if left is not None and left <= 0:  # the command's --time-limit ran out
            missed.append(c["name"])
            continue
        limit = a.search_limit if left is None else min(a.search_limit, max(0.5, left))
        op = operator(c)
        r = optimize(op, hw=hw, solver="cpsat", time_limit=limit, cache=not a.no_cache, jobs=a.jobs,
                     compile_check=False, deterministic=a.deterministic)
        g, p = r.program.graph, r.program
        if len(set(g.row)) < 2:
            continue
        costs = [p.cta_cycles(n, hw) for n in g.row]
        slots = hw.sms * g.tiling.slots
        fl = {x: unit_floor(g, hw, x) for x in ("even", "dynamic", "lpt")}
        floor = fl["lpt"]  # exact is approximated by longest-first's slots (as in the model)
        even, dyn, lpt = (max(fl[x], int(sm_loads(costs, g.rows, slots, x).max())) for x in ("even", "dynamic", "lpt"))
        left = _left(opts)
        ex, proven = exact_loads(costs, g.rows, slots, deterministic=a.deterministic,
                                 time_limit=a.search_limit if left is None else min(a.search_limit, max(0.5, left)))
        us = [hw.cycles_to_us(x) + hw.launch_us for x in (even, dyn, lpt, max(floor, int(ex.max())),
                                                          max(floor, lower_bound(costs, g.rows, slots)))]
        lines.append(f"| {c['name']} | {g.n_ctas} | {us[0]:.2f} | {us[1]:.2f} | {us[2]:.2f} | {us[3]:.2f} | {proven} "
                     f"| {us[4]:.2f} | {even / lpt:.3f} |")
        print(lines[-1], flush=True)
        write_text(path, "\n".join(lines) + "\n")  # partial results as they complete
    if missed:
        lines += ["", f"**not reached** before the command's --time-limit ({a.time_limit:g} s): {', '.join(missed)}."]
    write_text(path, "\n".join(lines) + "\n")
    _wrote(path)
    return 0


def compare_markdown(rows: list[dict[str, Any]], solvers: list[str], a: argparse.Namespace,
                     prov: dict[str, str], hw_name: str | None = None) -> str:
    """The compare table: one column per solver for latency, status/gap (exact solvers) and solve time, a speedup
    column per exact solver when greedy ran, then the exact schedule's tiling and features."""
    exact = [s for s in solvers if s != "greedy"]
    speed = exact if "greedy" in solvers else []
    missed = [r["config"] for r in rows if not r.get("reached", True) and "failed" not in r]
    failed = [f"{r['config']} ({r['failed']})" for r in rows if "failed" in r]
    rows = [r for r in rows if r.get("reached", True)]
    det = getattr(a, "deterministic", False)
    lines = [f"# Greedy vs exact schedules, {a.suite} suite on {hw_name or a.hw} (predicted by the ptsolve cost model)",
             "", f"- command: `{prov['command']}`", f"- date: {prov['date']}", f"- commit: {prov['commit']}",
             f"- machine: {prov['machine']}", f"- time limit per configuration and solver: {a.search_limit} s"
             + (" of CP-SAT deterministic time (--deterministic)" if det else
                f", within {a.time_limit:g} s for the whole command"), "",
             "Latencies are the cost model's predictions (µs), not GPU measurements; `simulate()` replayed every "
             "schedule and reproduced its claimed latency. Speedup = greedy latency / exact latency. Status: OPTIMAL "
             "= proven (gap 0), TIME_LIMIT = stopped by the time limit with the gap shown, FEASIBLE = no proof. "
             "A solve time marked * comes from the schedule cache (the time of the search that produced it). Every "
             "policy's answer is its own under the one formula objective: `optimize`'s declared-order replay, which "
             "may swap in FlashAttention-3's issue order that the formula ranks lower, is off here "
             "(`optimize(..., replay=False)`).", ""]
    head = ["config"] + [f"{s} µs" for s in solvers] + [f"{s} status/gap" for s in exact]
    head += [f"{s} solve s" for s in solvers] + [f"speedup {s}" for s in speed]
    head += (["decoupled µs"] if a.decoupled else []) + ["exact tiling", "schedule"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ex = exact[0] if exact else solvers[0]
    for r in rows:
        cells = [r["config"]] + [f"{r[f'{s}_us']:.2f}" for s in solvers]
        cells += [f"{r[f'{s}_status']} {100 * r[f'{s}_gap']:.1f}%" if r[f"{s}_gap"] != "" else r[f"{s}_status"]
                  for s in exact]
        cells += [f"{r[f'{s}_solve_s']:.2f}" + ("*" if r.get(f"{s}_cached") else "") for s in solvers]
        cells += [f"{r[f'speedup_{s}']:.3f}" for s in speed]
        cells += ([f"{r['decoupled_us']:.2f}" if r["decoupled_us"] != "" else "—"] if a.decoupled else [])
        cells += [r[f"{ex}_tiling"].replace('"', ""), r.get(f"{ex}_features", "")]
        assert len(cells) == len(head)
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    for s in exact if rows else ():
        st = [r[f"{s}_solve_s"] for r in rows]
        opt = sum(r[f"{s}_status"] == "OPTIMAL" for r in rows)
        line = f"**{s}**: proven optimal {opt}/{len(rows)}; solve time median {sorted(st)[len(st) // 2]:.2f} s, max " \
               f"{max(st):.2f} s"
        if s in speed:
            sp = [r[f"speedup_{s}"] for r in rows]
            line += f"; speedup over greedy mean {sum(sp) / len(sp):.3f}×, max {max(sp):.3f}×, min {min(sp):.3f}×"
        lines += ["", line + "."]
    lines += _contradictions(rows, solvers)
    stopped = [f"{s} {r['config']}" for r in rows for s in exact if r[f"{s}_status"] == "TIME_LIMIT"]
    lines += ["", f"**time limit**: {len(stopped)} solve(s) stopped by the time limit"
              + (f" (hatched in the chart): {', '.join(stopped)}." if stopped else ".")]
    if missed:
        lines += ["", f"**not reached** before the command's --time-limit ({a.time_limit:g} s): {', '.join(missed)}."]
    if failed:
        lines += ["", f"**no schedule** (left out of every figure above): {'; '.join(failed)}."]
    nodec = [f"{r['config']} ({r['decoupled_failed']})" for r in rows if "decoupled_failed" in r]
    if nodec:
        lines += ["", f"**decoupled: no schedule** (—): {'; '.join(nodec)}."]
    return "\n".join(lines) + "\n"


def _contradictions(rows: list[dict[str, Any]], solvers: list[str]) -> list[str]:
    """Issue "Exact means exact"'s two checks over a compare table, by kernel cycles: every exact answer no worse
    than greedy's, and no OPTIMAL answer beaten by another policy's answer that the compiler took (with
    --compile-check every answer is one: its ``check`` is ok)."""
    exact = [s for s in solvers if s != "greedy"]
    if not rows or f"{solvers[0]}_cycles" not in rows[0]:
        return []  # a table written before the cycles were recorded
    worse = [f"{r['config']} {s} ({r[f'{s}_cycles']} > {r['greedy_cycles']})" for r in rows for s in exact
             if "greedy" in solvers and r[f"{s}_cycles"] > r["greedy_cycles"]]
    beaten = [f"{r['config']} {s} OPTIMAL at {r[f'{s}_cycles']}, {o} {r[f'{o}_cycles']}" for r in rows
              for s in exact if r[f"{s}_status"] == "OPTIMAL" for o in solvers
              if o != s and r[f"{o}_check"] in ("ok", "") and r[f"{o}_cycles"] < r[f"{s}_cycles"]]
    checked = sum(all(r[f"{s}_check"] == "ok" for s in solvers) for r in rows)
    out = ["", "**exact ≤ greedy** (kernel cycles): " + (f"violated on {len(worse)}: {'; '.join(worse)}." if worse
                                                           else f"holds on all {len(rows)} configurations.")]
    if "greedy" not in solvers:
        out = []
    out += ["", "**OPTIMAL contradicted** by another policy's answer"
            + (f" (compile-checked on {checked}/{len(rows)} configurations)" if checked else "") + ": "
            + (f"{len(beaten)}: {'; '.join(beaten)}." if beaten else "none.")]
    return out


def _bar_chart(rows: list[dict[str, Any]], solvers: list[str], path: Path, hw: str) -> bool:
    """The speedup bars of every exact solver over greedy; False (nothing written) when greedy did not run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [r for r in rows if r.get("reached", True)]
    ex = [s for s in solvers if s != "greedy" and rows and f"speedup_{s}" in rows[0]]
    if not ex:
        return False
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.28), 4))
    x = np.arange(len(rows))
    w = 0.8 / len(ex)
    for i, s in enumerate(ex):
        sp = [r[f"speedup_{s}"] for r in rows]
        bars = ax.bar(x + i * w, sp, w, label=s)
        for b, r in zip(bars, rows):  # a solve the time limit stopped (or that proves nothing) is not a clean bar
            if r[f"{s}_status"] != "OPTIMAL":
                b.set_hatch("///")
                b.set_edgecolor("black")
    # the gains are a few percent: an axis from 0 would hide them
    lo = min(r[f"speedup_{s}"] for r in rows for s in ex)
    hi = max(r[f"speedup_{s}"] for r in rows for s in ex)
    pad = max(0.005, 0.08 * (hi - lo))
    ax.set_ylim(min(lo, 1.0) - pad, max(hi, 1.0) + pad)
    ax.axhline(1.0, color="black", lw=0.8, ls="--", label="greedy (1.0)")
    if any(r[f"{s}_status"] != "OPTIMAL" for r in rows for s in ex):
        ax.bar([0], [0], 0, color="white", edgecolor="black", hatch="///", label="not proven optimal")
    ax.set_xticks(x + 0.4 - w / 2, [r["config"] for r in rows], rotation=90, fontsize=7)
    ax.set_ylabel("predicted speedup over greedy")
    ax.set_title(f"exact vs greedy schedules on {hw} (cost model)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    try:  # whole or not at all, as every output (fileio.write_text)
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {str(path)!r}: {e.strerror or e}; free space or pick another --out") from None
    plt.close(fig)
    return True


class _Fmt(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's line breaks and appends every option's default (unless None/False or already said)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        h = action.help or ""
        if (action.default not in (None, argparse.SUPPRESS) and action.nargs != 0 and "default" not in h
                and action.option_strings):
            h += " (default: %(default)s)"
        return h


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (ptsolve's rule for every refusal)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise ConfigError(f"{message} (see `{self.prog} --help`)")


def _policy_list(v: str) -> str:
    names = [x.strip() for x in v.split(",")]
    bad = [x for x in names if x not in SOLVER_NAMES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown policy {bad[0]!r}; choose from {', '.join(SOLVER_NAMES)}")
    return ",".join(dict.fromkeys(names))


def _positive_int(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{v!r} is not a whole number >= 1")
    return n


def _weight(v: str) -> float:
    try:
        w = float(v)
    except ValueError:
        w = -1.0
    if not w >= 0 or w == float("inf"):
        raise argparse.ArgumentTypeError(f"{v!r} is not a finite number >= 0")
    return w


def _seconds(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        x = -1.0
    if not 0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"{v!r} is not a number of seconds > 0")
    return x


def parser() -> argparse.ArgumentParser:
    """The ``ptsolve`` command line: the plugin commands (listed; main hands them their own command lines), then the
    search commands, the calibrations and measured selection."""
    from . import __version__

    fmt = _Fmt
    p = _Parser(prog="ptsolve", description=__doc__, formatter_class=fmt)
    p.add_argument("--version", action="version", version=f"ptsolve {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    for name, ep in plugin_commands().items():  # listed here; main hands them their own command lines
        sub.add_parser(name, help=f"{_first_doc_line(ep.value.split(':')[0])} (`ptsolve {name} --help`; from "
                                  f"{ep.value.split(':')[0]})", add_help=False)
    _search_commands(sub, fmt)
    _calibrate_commands(sub, fmt)
    _tune_command(sub, fmt)
    return p


def _search_commands(sub: Any, fmt: type) -> None:
    """optimize (one operator), compare and placement (a suite), ops (the operators' parameters)."""
    from .hw import known
    from .suites import SUITES

    o = sub.add_parser("optimize", formatter_class=fmt, epilog=op_help() + "\n\n" + LEGEND,
                       help="schedule one operator; print the schedule, write its JSON and a Gantt chart (SVG)")
    o.add_argument("op", metavar="OP", help=f"operator: {', '.join(sorted(OPS))} (`ptsolve ops OP` lists its "
                   "parameters)")
    o.add_argument("params", nargs="*", metavar="KEY=VALUE", help="shape, e.g. batch=64 heads=32 kv_heads=8 seq=4096")
    c = sub.add_parser("compare", formatter_class=fmt,
                       help="greedy vs exact over a suite; writes CSV, markdown and a bar chart as configurations "
                            "complete, resumes an interrupted run")
    c.add_argument("--suite", default="paper", choices=sorted(SUITES), help="benchmark suite")
    c.add_argument("--solvers", default="greedy,cpsat,milp",
                   help=f"comma-separated solvers, of {', '.join(SOLVER_NAMES)}")
    c.add_argument("--only", default="", help="comma-separated config name prefixes, e.g. FA1,GEMM (default: all)")
    c.add_argument("--no-decoupled", dest="decoupled", action="store_false",
                   help="skip the decoupled (tile by roofline, then schedule) ablation column")
    pl = sub.add_parser("placement", formatter_class=fmt,
                        help="even vs longest-first vs exact CTA placement of the suite's unequal tiles")
    pl.add_argument("--suite", default="paper", choices=sorted(SUITES), help="benchmark suite")
    ls = sub.add_parser("ops", formatter_class=fmt, help="list the operators and their parameters")
    ls.add_argument("name", nargs="?", default=None, help="one operator (default: all)")
    for q in (o, c, pl):
        q.add_argument("--hw", default=DEFAULT_HW, metavar="NAME|PATH",
                       help=f"hardware: {', '.join(known())}, or the path of a .json table")
        q.add_argument("--time-limit", type=_seconds, default=30.0 if q is o else WHOLE[q is c],
                       help=("wall-clock seconds for the solves; the compile check of the answer runs to its end "
                             "past it (no answer is served unchecked); an answer it cut short says TIME_LIMIT"
                             if q is o else "wall-clock seconds for the whole command (what is not reached by then is "
                             "listed as such); each search keeps to --search-limit, its compile checks past it"))
        q.add_argument("--no-cache", action="store_true", help="ignore and do not fill the schedule cache")
        q.add_argument("--jobs", type=_positive_int, default=None, help="parallel solves (default: all cores)")
        q.add_argument("--out", default=None, metavar="DIR",
                       help="output folder (default: $PTSOLVE_OUT_DIR or ~/ptsolve-out)")
    for q in (c, pl):
        q.add_argument("--search-limit", type=_seconds, default=30.0,
                       help="seconds per search" + (" and per exact placement" if q is pl else "")
                            + " (--deterministic: CP-SAT deterministic time), within what --time-limit leaves")
    for q in (o, c, pl):
        q.add_argument("--deterministic", action="store_true", help=DETERMINISTIC_HELP)
    o.add_argument("--solver", default="cpsat", choices=SOLVER_NAMES, help="policy")
    o.add_argument("--placement", default="even", choices=PLACEMENTS,
                   help="CTAs over SMs: the paper's even split, the GPU's block scheduler (dynamic: launch order, "
                        "first free SM; closer to the GPU for unequal CTAs, bench study placement), longest "
                        "first, or exact")
    o.add_argument("--executor", default="process", choices=("process", "serial", "ray"),
                   help="where tilings are solved")
    o.add_argument("--decoupled", action="store_true", help="pick the tiling by its roofline bound, then schedule it")
    o.add_argument("--fix", nargs="*", default=[], metavar="KEY=VALUE",
                   help="search only tilings with these values, e.g. --fix ctas=1")
    o.add_argument("-v", "--verbose", action="store_true", help="print the search's progress on stderr")
    o.add_argument("--no-compile-check", action="store_true",
                   help="do not generate and compile the chosen schedule's kernel (default: the compiler is in the "
                        "loop where a code generator and its compiler are installed; PTSOLVE_COMPILE_CHECK=0 too)")
    c.add_argument("--compile-check", action="store_true",
                   help="put the compiler in the loop (each chosen kernel generated and compiled: minutes more)")


def _calibrate_commands(sub: Any, fmt: type) -> None:
    """calibrate (the table's estimated entries from a measured study) and calibrate-tasks (the vector tasks'
    extra cycles from profiler timelines)."""
    cal = sub.add_parser("calibrate", formatter_class=fmt,
                         help="fit the hardware table's estimated entries to a measured study (codegen.study) and "
                              "evaluate the fit on its held-out configurations")
    cal.add_argument("--hw", default=DEFAULT_HW, metavar="NAME", help="hardware table to calibrate")
    cal.add_argument("--candidates", required=True, help="candidates JSON of `python3 -m codegen.study prepare`")
    cal.add_argument("--study", required=True, help="study.json of `python3 -m codegen.study run` (the GPU)")
    cal.add_argument("--params", default=",".join(CAL_FIT), help="comma-separated entries to fit")
    cal.add_argument("--rounds", type=_positive_int, default=6, help="rounds of the coordinate search")
    cal.add_argument("--op", default="", metavar="OP", help="fit on this operator's schedules only and write the "
                     "entries as its own (hw op_constants: they price its graphs, the shared ones the rest)")
    cal.add_argument("--relative", type=_weight, default=0.0, metavar="W",
                     help="weight of the spread of log ratios within each configuration in the loss (what choosing "
                          "among its candidates depends on; bench study gemm_model used 4)")
    cal.add_argument("--write", action="store_true", help="write <hw>.calibrated.json beside the built-in table")
    cal.add_argument("--time-limit", type=_seconds, default=600.0,
                     help="wall-clock seconds for the fit: it stops there with the best constants so far")
    cal.add_argument("--out", default=None, metavar="DIR", help="report folder (default: $PTSOLVE_OUT_DIR or "
                     "~/ptsolve-out)")
    ct = sub.add_parser("calibrate-tasks", formatter_class=fmt,
                        help="fit the vector tasks' cycles beyond the throughput model (hw.task_extra) from the "
                             "profiler's timelines (ptsolve profile)")
    ct.add_argument("--profiles", nargs="+", required=True, metavar="DIR", help="folders of *.profile.json")
    ct.add_argument("--schedules", required=True, metavar="DIR",
                    help="folder of the Result JSON files the profiles ran (<name>.json beside <name>.profile.json)")
    ct.add_argument("--hw", default=DEFAULT_HW, metavar="NAME", help="hardware table to calibrate")
    ct.add_argument("--write", action="store_true", help="write task_extra into <hw>.calibrated.json")
    ct.add_argument("--time-limit", type=_seconds, default=600.0,
                    help="wall-clock seconds for reading the profiles; the fit takes those read by then")


def _tune_command(sub: Any, fmt: type) -> None:
    """tune: measured selection among the model's best compile-clean schedules."""
    tu = sub.add_parser("tune", formatter_class=fmt, epilog=op_help(),
                        help="measured selection: the model's K best compile-clean schedules, timed on the GPU")
    tu.add_argument("op", metavar="OP", help=f"operator: {', '.join(sorted(OPS))}")
    tu.add_argument("params", nargs="*", metavar="KEY=VALUE", help="shape")
    tu.add_argument("--hw", default=DEFAULT_HW, metavar="NAME|PATH", help="hardware")
    tu.add_argument("--top-k", type=_positive_int, default=5, help="schedules to time")
    tu.add_argument("--solver", default="cpsat", type=_policy_list, metavar="POLICY[,POLICY]",
                    help=f"policy, or several comma-separated (each tiling's distinct orders): "
                    f"{', '.join(SOLVER_NAMES)}")
    tu.add_argument("--time-limit", type=_seconds, default=300.0,
                    help="wall-clock seconds for the whole command: the walk over tilings stops there with the "
                         "candidates it has (GPU timing, if any, comes after)")
    tu.add_argument("--search-limit", type=_seconds, default=30.0, help="seconds per tiling's search")
    tu.add_argument("--deterministic", action="store_true",
                    help="reproducible candidates: --search-limit is then CP-SAT deterministic time per tiling, not "
                         "seconds (optimize --deterministic); the timing on the GPU is what it measures")
    tu.add_argument("--prepare", metavar="FILE", help="only solve: write the candidates for a GPU machine "
                    "(python3 -m codegen.tune_runner FILE --out TIMED)")
    tu.add_argument("--finish", metavar="TIMED",
                    help="read the GPU's times (codegen.tune_runner output), report the best")
    tu.add_argument("--per", action="append", default=[], metavar="KEY", help="the K best of every value of this "
                    "structure key, e.g. --per pingpong (GEMM: cooperative and ping-pong both timed); repeatable")


def _first_doc_line(module: str) -> str:
    """The first line of a module's docstring, read from its source without importing it (a plugin's imports can
    be heavy, and the parser is built for every command)."""
    import ast
    from importlib.util import find_spec

    try:
        spec = find_spec(module)
        doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) if spec and spec.origin else None
    except (ImportError, OSError, SyntaxError, ValueError):
        doc = None
    return (doc or "a plugin command").strip().splitlines()[0].rstrip(".:;")


def plugin_commands() -> dict[str, Any]:
    """Subcommands a code generator registers (entry points ``ptsolve.commands``, e.g. ``profile``): name -> its
    entry point, whose ``load()`` is a ``main(argv) -> int``."""
    from importlib.metadata import entry_points
    return {ep.name: ep for ep in sorted(entry_points(group="ptsolve.commands"), key=lambda e: e.name)}


def _interrupted() -> int:
    print("ptsolve: interrupted (solver workers stopped; `compare` resumes from its .partial.json)", file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    # a library warning (e.g. the cache rebuilt itself) is one line, like an error
    warnings.formatwarning = lambda m, c, *_a, **_k: f"ptsolve: warning: {m}\n"
    argv = sys.argv[1:] if argv is None else argv
    try:
        plugins = plugin_commands()
        if argv and argv[0] in plugins:  # e.g. ptsolve profile ...: the code generator's own command line
            return int(plugins[argv[0]].load()(argv[1:]) or 0)
        a = parser().parse_args(argv)
        return {"optimize": cmd_optimize, "compare": cmd_compare, "placement": cmd_placement,
                "ops": cmd_ops, "calibrate": cmd_calibrate,
                "calibrate-tasks": cmd_calibrate_tasks, "tune": cmd_tune}[a.cmd](a)
    except PtsolveError as e:
        if os.environ.get("PTSOLVE_DEBUG") == "1":  # where it came from, for a bug report
            import traceback
            traceback.print_exc()
        print(f"ptsolve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted()
    except ImportError as e:
        # Ctrl-C while a C extension is imported (OR-Tools, lazily, in the main process) surfaces as
        # "ImportError: initialization failed" caused by the KeyboardInterrupt: still the user's interrupt
        if isinstance(e.__cause__ or e.__context__, KeyboardInterrupt):
            return _interrupted()
        raise
    except BrokenPipeError:
        # the reader went away (``| head``): no traceback; stdout is closed, so flush into /dev/null
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
