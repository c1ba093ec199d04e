"""``python3 -m ptsolve.serve table``: solve every shape class and write the schedule table; ``precompile``: fill
the cubin cache with every class's generic kernel; ``exact``: the worker that solves one shape (``exact``)."""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import subprocess
from pathlib import Path
from typing import Any

from codegen.plan import KernelPlan
from ptsolve.errors import PtsolveError

from .classes import DTYPES, HW, ShapeClass, classes, variants
from .kernels import build, compile_class, keep
from .table import SOLVE_TIME_LIMIT, TABLE, load_table, solve


def _commit() -> str:
    """The checkout's short commit (the table says what made it)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _picked(key: str, only: str) -> bool:
    """Whether a class key is among ``only``'s: every key when empty, else those containing one of its comma-separated
    parts."""
    return not only or any(x and x in key for x in only.split(","))


def build_table(out: Path = TABLE, time_limit: float = SOLVE_TIME_LIMIT, only: str = "") -> dict[str, Any]:
    """Solve every class (``only``: keys containing that text, or one of several comma-separated) and write the
    table, with each generic kernel's ptxas numbers where nvcc is installed. The solves run with the compiler in the
    loop (on the class's generic kernel; the register model alone picks tilings that spill); the
    class's generic kernel is compiled too, and one that still spills or serialises (the search's time ran out before
    the compiler was asked) is an error."""
    table = load_table(out) if out.exists() else {"classes": {}}
    solved: dict[ShapeClass, dict[str, Any]] = {}
    for c in classes():
        if not _picked(c.key, only):
            continue
        # the cost model does not tell fp16 from bf16 (both 2 bytes, same tensor-core rate): one solve serves both
        twin = dataclasses.replace(c, dtype=DTYPES[0])
        if twin in solved:
            entry = json.loads(json.dumps(solved[twin]))
            entry["plan"]["params"]["dtype"] = c.dtype
            entry["representative"]["dtype"] = c.dtype
            entry["solved_as"] = twin.key
        else:
            entry = solved[c] = solve(c, time_limit)
        plan = KernelPlan.from_json(json.dumps(entry["plan"]))
        keep(c, build(c, plan))
        try:
            rep = compile_class(c)
        except PtsolveError as e:  # no nvcc: the table still says what was solved
            rep = {"not compiled": str(e).splitlines()[0]}
        if rep.get("spill_stores") or rep.get("wgmma_serialized"):
            raise PtsolveError(f"{c.key}: the generic kernel of the solved schedule spills or serialises ({rep})")
        entry["generic_ptxas"] = rep
        table["classes"][c.key] = entry
        print(f"{c.key}: {entry['status']} {entry['predicted_us']} us tiling {plan.tiling} {rep}", flush=True)
    table["hw"] = HW
    table["made"] = (f"python3 -m ptsolve.serve table, {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                     f"commit {_commit()}")
    out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    """``python3 -m ptsolve.serve table|precompile``."""
    ap = argparse.ArgumentParser(prog="python3 -m ptsolve.serve",
                                 description="the schedule table of the shape-generic kernels")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="solve every shape class and write the schedule table")
    t.add_argument("--out", type=Path, default=TABLE)
    t.add_argument("--time-limit", type=float, default=SOLVE_TIME_LIMIT)
    t.add_argument("--only", default="", help="only the classes whose key contains this text (or one of several, "
                   "comma-separated)")
    p = sub.add_parser("precompile", help="compile every class's generic kernel (variants included: ChunkScan's "
                       "fused epilogues) into $PTSOLVE_CACHE_DIR")
    p.add_argument("--only", default="")
    p.add_argument("--pack", type=Path, default=None, help="also write these cubins (and their ptxas reports) to a "
                   "tar.xz whose entries are .cubin_dev/cubin/<key>.*: what a GPU machine without nvcc's time unpacks "
                   "at its checkout's root and uses with PTSOLVE_CACHE_DIR=$PWD/.cubin_dev")
    x = sub.add_parser("exact", help="solve one shape exactly and keep the answer (the serving layer's worker)")
    x.add_argument("job", help='JSON: {"class": ShapeClass fields, "params": the shape, "out": the entry\'s path}')
    a = ap.parse_args(argv)
    if a.cmd == "exact":
        from .exact import worker
        return worker(a.job)
    if a.cmd == "table":
        build_table(a.out, a.time_limit, a.only)
    else:
        picked = [c for c in classes() + variants() if _picked(c.key, a.only)]
        for c in picked:
            print(c.key, compile_class(c), flush=True)
        if a.pack:
            n, size = pack(picked, a.pack)
            print(f"{n} cubins packed into {a.pack} ({size / 1e6:.1f} MB)")
    return 0


def pack(picked: list[ShapeClass], to: Path) -> tuple[int, int]:
    """Write the compiled generic kernels of ``picked`` (cubin and ptxas report, from $PTSOLVE_CACHE_DIR) into the
    tar.xz ``to`` as .cubin_dev/cubin/<key>.{cubin,json}; (cubins, bytes written)."""
    import tarfile

    from codegen.runtime import _key, cache_dir

    from .kernels import kernel
    keys = sorted({_key(kernel(c).ks) for c in picked})
    src = cache_dir()  # .../cubin
    to.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(to, "w:xz", preset=6) as tf:
        for k in keys:
            for ext in (".cubin", ".json"):
                tf.add(src / f"{k}{ext}", arcname=f".cubin_dev/cubin/{k}{ext}")
    return len(keys), to.stat().st_size

