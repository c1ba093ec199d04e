"""The schedule table: each shape class's solved schedule (``schedule_table.json``, shipped with the package,
written by ``python3 -m ptsolve.serve table`` on a CPU machine with the solvers), or solved on first use where
OR-Tools is installed, else a PtsolveError naming the class and the command.

A class's schedule is solved once, on its representative shape (``classes.representative``): the modulo schedule's
initiation interval and stages do not depend on the trip count. The cost model does not tell fp16 from bf16, so the
table's bf16 entries are their fp16 twins' solves.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from codegen.plan import KernelPlan
from ptsolve.errors import PtsolveError

from .classes import HW, ShapeClass, class_fix, op_classes, representative

TABLE = Path(__file__).with_name("schedule_table.json")
SOLVE_TIME_LIMIT = 60.0  # seconds per class


def solve(c: ShapeClass, time_limit: float = SOLVE_TIME_LIMIT, compile_check: bool | None = None
          ) -> dict[str, Any]:
    """Solve ``c`` on its representative shape with CP-SAT (``compile_check``: the compiler in the loop on the
    class's generic build, as ``ptsolve.optimize``); the table entry: the KernelPlan and what the solve said."""
    import ptsolve
    from codegen.compile_check import check_cuda_generic
    from codegen.plan import plan_from_program

    # the compiler checks the class's shape-generic build, the binary users run: its trip counts are unknown to ptxas,
    # which then serialises some schedules whose exact-shape kernel it keeps
    res = ptsolve.optimize(ptsolve.ops.make(c.op, **representative(c)), hw=HW, solver="cpsat",
                           time_limit=time_limit, compile_check=compile_check, fix=class_fix(c),
                           kernel_check=check_cuda_generic)
    plan = plan_from_program(res.program)
    out = {"plan": json.loads(plan.to_json()), "status": res.status, "predicted_us": round(res.predicted_us, 3),
           "solve_s": round(res.solve_s, 2), "representative": representative(c)}
    if op_classes(c.op).keeps_program:  # re-timed per shape (decode: to choose its pieces)
        out["program"] = json.loads(res.program.to_json())
    return out


def table_path() -> Path:
    """``$PTSOLVE_SCHEDULE_TABLE`` (another table, e.g. one tuned on this GPU) or the shipped one."""
    return Path(os.environ.get("PTSOLVE_SCHEDULE_TABLE") or TABLE)


def load_table(path: Path | None = None) -> dict[str, Any]:
    """A schedule table (``{"classes": {key: entry}, ...}``; default ``table_path()``); an empty one when the file
    is absent."""
    path = table_path() if path is None else path
    if not path.exists():
        return {"classes": {}}
    try:
        d = json.loads(path.read_text())
        if not isinstance(d.get("classes"), dict):
            raise ValueError("no 'classes' object")
        return d
    except (OSError, ValueError) as e:
        raise PtsolveError(f"schedule table {path} is unreadable ({e}); rebuild it with "
                           "`python3 -m ptsolve.serve table`") from e


_SOLVED: dict[ShapeClass, dict[str, Any]] = {}
_TABLE: list[dict[str, Any]] = []


def _table() -> dict[str, Any]:
    """The table, read once per process."""
    if not _TABLE:
        _TABLE.append(load_table())
    return _TABLE[0]


def solvers_installed() -> bool:
    """Whether OR-Tools is here to solve a class the table lacks."""
    return importlib.util.find_spec("ortools") is not None


def _class_entry(c: ShapeClass, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """The class's table entry: the shipped table's, else solved here (OR-Tools installed; ptsolve's schedule cache
    keeps it for the next process), else a PtsolveError naming the class and how to get one."""
    t = _table() if table is None else table
    entry = t["classes"].get(c.key)
    if entry is not None:
        return entry
    base = op_classes(c.op).derived(c)
    if base is not None:  # a variant: its base class's schedule with the parameters it adds
        e = _class_entry(base[0], table)
        return {**e, "plan": {**e["plan"], "params": {**e["plan"]["params"], **base[1]}}, "derived_from": base[0].key}
    if c not in _SOLVED:
        if not solvers_installed():
            raise PtsolveError(f"no schedule for shape class {c.key}: it is not in {TABLE.name} and OR-Tools is not "
                               "installed to solve it here; run `python3 -m ptsolve.serve table` where the solvers "
                               "are (pip install ortools) and ship the file")
        _SOLVED[c] = solve(c)
    return _SOLVED[c]


def schedule(c: ShapeClass, table: dict[str, Any] | None = None) -> KernelPlan:
    """The class's schedule (``_class_entry``)."""
    return KernelPlan.from_json(json.dumps(_class_entry(c, table)["plan"]))


_PROGRAMS: dict[ShapeClass, Any] = {}


def class_program(c: ShapeClass) -> Any:
    """The SProgram a decode class's schedule came from (its table entry's ``program``)."""
    if c not in _PROGRAMS:
        from ptsolve.program import SProgram

        e = _class_entry(c)
        if "program" not in e:
            raise PtsolveError(f"the schedule table's entry {c.key} has no program to choose a shape's pieces with; "
                               "rebuild it with `python3 -m ptsolve.serve table --only flash_decode`")
        _PROGRAMS[c] = SProgram.from_dict(e["program"])
    return _PROGRAMS[c]
