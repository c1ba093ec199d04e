"""The house's arrows: ``ptsolve`` (model, solvers) never imports ``codegen`` or ``baselines``, except its PyTorch
front door ``ptsolve.torch`` (which sits above the code generator and imports it lazily); the library packages
have no import cycle at module level (imports inside functions are the lazy edges that keep solver and GPU stacks
optional, and may point back); the library (``ptsolve``, ``codegen``, ``baselines``) never imports ``bench`` (the
studies that made the evidence), not even inside a function; and ``results/`` holds evidence, not code."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]
FRONT_DOORS = {"ptsolve.torch"}
# codegen.harness's compare() times our kernels next to mamba_ssm's Triton ones (through baselines/); the lowering,
# skeleton, emitters, runtime, profiler and the checks and timing of codegen.bench never reach the baselines
DRIVERS = {"codegen.mamba"}
LIBRARY = ("ptsolve", "codegen", "baselines")
RESULTS_MAX_BYTES = 5 * 1024 * 1024


def _module(root: Path, p: Path) -> str:
    parts = list(p.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(root: Path, p: Path, top_level_only: bool) -> set[str]:
    """Absolute names of the modules ``p`` imports (relative imports resolved)."""
    mod = _module(root, p)
    pkg = mod if p.name == "__init__.py" else mod.rpartition(".")[0]
    tree = ast.parse(p.read_text())
    out: set[str] = set()
    for n in (tree.body if top_level_only else ast.walk(tree)):  # top level: `if TYPE_CHECKING:` blocks skipped
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                base = ".".join([*up, base] if base else up)
            out |= {base} | {f"{base}.{a.name}" for a in n.names}
    return out


def _files(root: Path, *pkgs: str) -> list[Path]:
    return sorted(f for p in pkgs for f in (root / p).rglob("*.py"))


def wrong_arrows(root: Path) -> list[tuple[str, str]]:
    """(module, import) pairs where ptsolve reaches into codegen or baselines, or codegen's library into baselines."""
    out = [(_module(root, f), i) for f in _files(root, "ptsolve")
           # a front door reaches codegen only lazily, inside the functions that launch kernels
           for i in sorted(_imports(root, f, top_level_only=_module(root, f) in FRONT_DOORS))
           if i.split(".")[0] in ("codegen", "baselines")]
    return out + [(_module(root, f), i) for f in _files(root, "codegen") if _module(root, f) not in DRIVERS
                  for i in sorted(_imports(root, f, top_level_only=False)) if i.split(".")[0] == "baselines"]


def bench_arrows(root: Path) -> list[tuple[str, str]]:
    """(module, import) pairs where the library imports ``bench``, at any depth (inside functions too)."""
    return [(_module(root, f), i) for f in _files(root, *(p for p in LIBRARY if (root / p).is_dir()))
            for i in sorted(_imports(root, f, top_level_only=False)) if i.split(".")[0] == "bench"]


def results_files(root: Path) -> list[Path]:
    """The files of ``root/results`` that a commit would hold: git's tracked and untracked-but-not-ignored files
    that exist (a file deleted but not yet committed is gone) in a git checkout, else every file under it."""
    res = root / "results"
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "results"],
                             cwd=root, capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout
        return sorted(p for p in res.rglob("*") if p.is_file())
    return sorted({root / n for n in out.split("\0") if n and (root / n).is_file()})


def results_problems(root: Path) -> list[str]:
    """Code in ``results/`` (a .py or .sh file: scripts belong in bench/) and a results/ over RESULTS_MAX_BYTES."""
    files = results_files(root)
    out = [f"code in results/: {f.relative_to(root)}" for f in files if f.suffix in (".py", ".sh")]
    total = sum(f.stat().st_size for f in files)
    if total > RESULTS_MAX_BYTES:
        out.append(f"results/ holds {total / 2**20:.2f} MiB, more than {RESULTS_MAX_BYTES / 2**20:.0f} MiB")
    return out


def cycles(root: Path, *pkgs: str) -> list[list[str]]:
    """Module-level import cycles among the modules of ``pkgs`` (a package importing its own submodules is how
    packages are built, not a cycle)."""
    mods = {_module(root, f): f for f in _files(root, *pkgs)}
    graph = {m: sorted(i for i in _imports(root, f, True) if i in mods and i != m and not i.startswith(m + "."))
             for m, f in mods.items()}
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in graph[m]:
            if state.get(d) == 1:
                found.append([*path[path.index(d):], d])
            elif d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_arrows_point_one_way():
    assert not wrong_arrows(ROOT)


def test_no_import_cycles_at_module_level():
    assert not cycles(ROOT, "ptsolve", "codegen")


def test_the_checks_bite(tmp_path):
    """A package with a wrong arrow and a cycle (one relative, one absolute import) is caught by both checks."""
    pkg = tmp_path / "ptsolve"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("from ptsolve.a import y\n\ndef f():\n    import codegen.lower\n")
    (pkg / "torch.py").write_text("import ptsolve.serve\n\ndef f():\n    import codegen.lower\n")
    assert wrong_arrows(tmp_path) == [("ptsolve.b", "codegen.lower"), ("ptsolve.torch", "ptsolve.serve")]
    assert cycles(tmp_path, "ptsolve") == [["ptsolve.a", "ptsolve.b", "ptsolve.a"]]


def test_the_library_never_imports_bench():
    assert not bench_arrows(ROOT)


def test_results_is_evidence_not_code():
    assert not results_problems(ROOT)


def test_the_bench_and_results_checks_bite(tmp_path):
    """An import of bench inside a library function, code in results/ and a results/ over the limit are all caught
    (tmp_path is no git checkout: the folder is walked)."""
    (tmp_path / "codegen").mkdir()
    (tmp_path / "codegen" / "x.py").write_text("import os\n\ndef f():\n    from bench.round import round\n")
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "y.py").write_text("import bench\n")
    assert bench_arrows(tmp_path) == [("baselines.y", "bench"), ("codegen.x", "bench.round"),
                                      ("codegen.x", "bench.round.round")]
    (tmp_path / "results" / "s").mkdir(parents=True)
    (tmp_path / "results" / "s" / "README.md").write_text("what, device, date, commit, command\n")
    assert results_problems(tmp_path) == []
    (tmp_path / "results" / "s" / "run.sh").write_text("echo\n")
    (tmp_path / "results" / "s" / "big.json").write_bytes(b"0" * (RESULTS_MAX_BYTES + 1))
    got = results_problems(tmp_path)
    assert got[0] == "code in results/: results/s/run.sh" and "more than 5 MiB" in got[1] and len(got) == 2
