"""``python -m codegen.hip SCHEDULE.json [--out DIR]``: a ptsolve schedule to a gfx942 code object.

SCHEDULE.json is what ``ptsolve optimize ... --hw mi300x`` writes (a Result), a KernelPlan or a KernelIR. Writes
``<kernel>.hip``, ``<kernel>.hsaco`` and ``<kernel>.json`` (launch metadata, what the schedule decided, the
compiler's resource usage) and prints the resource usage. Compile-verified only: nothing is run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ptsolve.errors import PtsolveError
from ptsolve.fileio import write_text


def load_schedule(path: Path) -> Any:
    """A Result (its program), a KernelPlan or a KernelIR from its JSON file."""
    from codegen.kernel_ir import KernelIR
    from codegen.plan import KernelPlan
    from ptsolve.fileio import read_json
    from ptsolve.result import Result

    d = read_json(path, "schedule")
    text = json.dumps(d)
    if "program" in d:
        return Result.from_json(text).program
    if "roles" in d and "rings" in d:
        return KernelIR.from_json(text)
    if "order" in d:
        return KernelPlan.from_json(text)
    raise PtsolveError(f"{path}: neither a ptsolve Result, a KernelPlan nor a KernelIR")


def main(argv: list[str] | None = None) -> int:
    from . import compile as build
    from . import emit

    p = argparse.ArgumentParser(prog="python -m codegen.hip", description=__doc__)
    p.add_argument("schedule", type=Path, help="Result / KernelPlan / KernelIR JSON")
    p.add_argument("--hw", default="mi300x", help="AMD hardware table the schedule is lowered for (default mi300x)")
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--no-compile", action="store_true", help="write the .hip source only")
    a = p.parse_args(argv)
    try:
        src = emit(load_schedule(a.schedule), a.hw)
        a.out.mkdir(parents=True, exist_ok=True)
        stem = a.out / src.name
        write_text(stem.with_suffix(".hip"), src.source)
        meta: dict[str, Any] = {"name": src.name, "op": src.op, "params": src.params, "grid": src.grid,
                                "block": src.block, "lds_bytes": src.lds_bytes, "args": src.args, "arch": src.arch,
                                "persistent_tiles": src.persistent_tiles, "info": src.info,
                                "status": "compile-verified, not run"}
        if not a.no_compile:
            rep = build(src)
            stem.with_suffix(".hsaco").write_bytes(rep.code_object)
            meta["resources"] = rep.summary()
            print(" ".join(f"{k}={v}" for k, v in rep.summary().items() if k not in ("name", "cached")))
        write_text(stem.with_suffix(".json"), json.dumps(meta, indent=1, sort_keys=True, default=list))
        print(f"wrote {stem}.hip" + ("" if a.no_compile else f", {stem}.hsaco") + f" and {stem}.json")
    except PtsolveError as e:
        print(f"codegen.hip: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
