"""How a study runs its tools.

A study is a package ``bench/<study>/``; each of its tools is a file in it: ``<tool>.py`` (run as ``__main__``,
with ``sys.argv`` set to the tool's arguments, exactly as ``python3 <tool>.py ARGS`` ran it before it moved here)
or ``<tool>.sh`` (run with bash, from the repository root: the device calls). ``python -m bench <study> <tool>
ARGS`` runs one; a study with a ``default`` tool also takes ``python -m bench <study> ARGS`` for it (the first
argument then is no tool name). ``python -m bench <study> --help`` lists the tools.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the repository root
RESULTS = ROOT / "results"  # the curated evidence; raw logs, sources and candidate files stay out of git


def tools(pkg: str) -> dict[str, Path]:
    """A study's tools: name -> file (``.py`` / ``.sh`` in the package, none starting with ``_``)."""
    d = Path(importlib.import_module(pkg).__file__).parent
    return {p.stem: p for p in sorted(d.iterdir())
            if p.suffix in (".py", ".sh") and not p.name.startswith("_")}


def summary(path: Path) -> str:
    """A tool's one line: its module docstring's first line, or a shell script's first comment after the shebang."""
    text = path.read_text()
    if path.suffix == ".py":
        doc = ast.get_docstring(ast.parse(text)) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""
    for line in text.splitlines():
        if line.startswith("#") and not line.startswith("#!"):
            return line.lstrip("# ").strip()
    return ""


def run_tool(pkg: str, name: str, path: Path, argv: list[str]) -> int:
    """Run one tool with ``argv``; its exit status."""
    if path.suffix == ".sh":
        return subprocess.call(["bash", str(path), *argv], cwd=ROOT, env=os.environ.copy())
    saved = sys.argv
    sys.argv = [str(path), *argv]
    try:
        runpy.run_module(f"{pkg}.{name}", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved
    return 0


def dispatch(pkg: str, argv: list[str] | None, default: str | None = None) -> int:
    """``main(argv)`` of the study ``pkg``: ``[tool, *args]`` runs that tool, anything else the ``default`` tool."""
    argv = sys.argv[1:] if argv is None else list(argv)
    found = tools(pkg)
    study = pkg.rpartition(".")[2]
    if argv and argv[0] in found:
        return run_tool(pkg, argv[0], found[argv[0]], argv[1:])
    if argv[:1] in (["-h"], ["--help"]) or not (default or argv):
        doc = (importlib.import_module(pkg).__doc__ or "").strip()
        print(f"python -m bench {study} <tool> [args...]" + (f"  (or [args...] for {default})" if default else ""))
        if doc:
            print("\n" + doc + "\n")
        width = max(map(len, found), default=0)
        for n, p in found.items():
            print(f"  {n:<{width}}  {summary(p)}{'  [default]' if n == default else ''}")
        return 0
    if default is None:
        print(f"bench {study}: no tool {argv[0]!r}; tools: {', '.join(found)}", file=sys.stderr)
        return 2
    return run_tool(pkg, default, found[default], argv)


def picked_rows(arg: str, rows: dict) -> list[str]:
    """The row names a tool's comma-separated ``--rows`` picks (all of ``rows`` when empty); SystemExit naming the
    first unknown one and the choices."""
    names = [r for r in arg.split(",") if r] or list(rows)
    bad = [n for n in names if n not in rows]
    if bad:
        raise SystemExit(f"--rows: no row {bad[0]!r}; choose from {', '.join(rows)}")
    return names


def synced_ms(fn: Any) -> tuple[float, Any]:
    """(ms, result) of ``fn()`` with the GPU synchronised before and after: wall time, host work included."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    got = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, got


def rows_parser(doc: str, rows: dict, nsets: int) -> argparse.ArgumentParser:
    """The arguments every GPU row tool of a study takes: --out (the JSON), --rows (``picked_rows``), --nsets (input
    sets the timing rotates over), --graphs (CUDA graph replays) and --commit (the tree's, where git cannot tell)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="", help=f"comma-separated row names (default: all: {', '.join(rows)})")
    ap.add_argument("--nsets", type=int, default=nsets, help="input sets the timing rotates over")
    ap.add_argument("--graphs", action="store_true", help="time CUDA graph replays (host time per call left out)")
    ap.add_argument("--commit", default="")
    return ap


def gpu_stamp(command: str, commit: str = "") -> dict[str, Any]:
    """A GPU row tool's JSON head: device, date (UTC), commit (``commit`` or the tree's), torch, the command, and
    an empty row list."""
    import datetime as dt

    import torch

    commit = commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                      cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    return {"device": torch.cuda.get_device_name(), "date": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
            "commit": commit, "torch": torch.__version__, "command": command, "rows": []}
