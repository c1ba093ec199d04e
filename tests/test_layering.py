"""The house's arrows, as ``tests/layering.toml`` allows them (ARCHITECTURE.md draws them): every import from one
part of the house (``ptsolve``'s core, ``ptsolve.serve``, ``ptsolve.torch``, ``codegen``, ``baselines``, ``bench``) into
another is an allowed arrow, at module level and inside functions alike (``lazy`` arrows only inside functions); the
library (``ptsolve``, ``codegen``, ``baselines``) has no import cycle, counting imports inside functions; and
``results/`` holds evidence, not code. Each check is shown to fail on a synthetic package."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).parents[1]
RESULTS_MAX_BYTES = 5 * 1024 * 1024


def rules(root: Path = ROOT) -> dict[str, Any]:
    """``layering.toml``: ``library`` (the packages the cycle check covers), ``arrows`` (part -> the parts it may
    import) and ``lazy`` (part -> the parts it may import only inside functions)."""
    return tomllib.loads((root / "tests" / "layering.toml").read_text())


def _module(root: Path, p: Path) -> str:
    parts = list(p.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(n: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block (never run, so its imports are no edge)."""
    t = getattr(n, "test", None)
    return isinstance(n, ast.If) and (getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) ==
                                      "TYPE_CHECKING")


def _import_nodes(tree: ast.Module, top_level_only: bool) -> list[ast.AST]:
    """The import statements of a module: its top-level ones, or every one (inside functions and classes too),
    ``if TYPE_CHECKING:`` blocks skipped."""
    if top_level_only:
        return [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    out: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            out.append(n)
        elif not _type_checking(n):
            todo.extend(ast.iter_child_nodes(n))
    return out


def _imports(root: Path, p: Path, top_level_only: bool) -> set[str]:
    """Absolute names of the modules ``p`` imports (relative imports resolved)."""
    mod = _module(root, p)
    pkg = mod if p.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for n in _import_nodes(ast.parse(p.read_text()), top_level_only):
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
    return sorted(f for p in pkgs if (root / p).is_dir() for f in (root / p).rglob("*.py"))


def part_of(module: str, parts: Any) -> str | None:
    """The part ``module`` belongs to: the longest of ``parts`` that is it or a package above it (None: none)."""
    hits = [p for p in parts if module == p or module.startswith(p + ".")]
    return max(hits, key=len) if hits else None


def config_problems(r: dict[str, Any]) -> list[str]:
    """What is wrong with the rules ``r`` themselves: an arrow to an undefined part, a library package without a
    part, a library part allowed into a part outside the library (a study), a lazy arrow that is no arrow."""
    arrows, lazy, lib = r["arrows"], r.get("lazy", {}), r["library"]
    out = [f"{p} -> {d}: no such part" for p, ds in arrows.items() for d in ds if d not in arrows]
    out += [f"{p}: a library package without a part" for p in lib if p not in arrows]
    out += [f"{p} -> {d}: the library may import only the library" for p, ds in arrows.items() if part_of(p, lib)
            for d in ds if d in arrows and not part_of(d, lib)]
    return out + [f"{p} -> {d}: a lazy arrow that is no arrow" for p, ds in lazy.items() for d in ds
                  if d not in arrows.get(p, [])]


def wrong_arrows(root: Path, r: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(module, import) pairs that no arrow of ``r`` (default: ``root``'s ``layering.toml``) allows: an import into
    another part that its part's ``arrows`` do not list, or one its ``lazy`` arrows allow only inside functions
    taken at module level."""
    r = rules(root) if r is None else r
    arrows, lazy = r["arrows"], r.get("lazy", {})
    out = []
    for f in _files(root, *{p.split(".")[0] for p in arrows}):
        mod = _module(root, f)
        src = part_of(mod, arrows)
        top = _imports(root, f, top_level_only=True)
        for i in sorted(_imports(root, f, top_level_only=False)):
            dst = part_of(i, arrows)
            if dst is None or dst == src:
                continue
            if dst not in arrows.get(src, []) or (i in top and dst in lazy.get(src, [])):
                out.append((mod, i))
    return out


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
    """Import cycles among the modules of ``pkgs``, counting imports inside functions (a package importing its own
    submodules is how packages are built, not a cycle)."""
    mods = {_module(root, f): f for f in _files(root, *pkgs)}
    graph = {m: sorted(i for i in _imports(root, f, False) if i in mods and i != m and not i.startswith(m + "."))
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


def test_every_import_is_an_allowed_arrow():
    assert not wrong_arrows(ROOT)


def test_the_config_names_every_part_and_arrow():
    assert not config_problems(rules())


def test_no_import_cycles():
    assert not cycles(ROOT, *rules()["library"])


def test_the_checks_bite(tmp_path):
    """A synthetic house with a wrong arrow at each kind (the core into the compiler inside a function, the front door
    into the serving layer at module level where only a lazy arrow is allowed, the compiler into the serving layer,
    the library into the studies) and a cycle closed inside a function: every one is caught."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "layering.toml").write_text((ROOT / "tests" / "layering.toml").read_text())
    pkg = tmp_path / "ptsolve"
    (pkg / "serve").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("import os\n\ndef f():\n    from ptsolve.a import y\n    import codegen.lower\n")
    (pkg / "torch.py").write_text("import ptsolve.serve\n\ndef f():\n    import codegen.lower\n")
    (pkg / "serve" / "__init__.py").write_text("import codegen.lower\nfrom ptsolve import a\n")
    (tmp_path / "codegen").mkdir()
    (tmp_path / "codegen" / "lower.py").write_text("import ptsolve\n\ndef f():\n    import ptsolve.serve.x\n")
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "y.py").write_text("import codegen.lower\n\ndef f():\n    from bench.round import r\n")
    assert wrong_arrows(tmp_path) == [
        ("baselines.y", "bench.round"), ("baselines.y", "bench.round.r"), ("codegen.lower", "ptsolve.serve.x"),
        ("ptsolve.b", "codegen.lower"), ("ptsolve.torch", "ptsolve.serve")]
    assert cycles(tmp_path, "ptsolve") == [["ptsolve.a", "ptsolve.b", "ptsolve.a"]]


def test_the_config_check_bites():
    """An arrow to a part the config does not define, a library package without a part, the library allowed into a
    study and a lazy arrow that is no arrow are all caught."""
    bad = {"library": ["ptsolve", "codegen"], "arrows": {"ptsolve": ["nowhere", "bench"], "bench": []},
           "lazy": {"ptsolve": ["codegen"]}}
    assert config_problems(bad) == ["ptsolve -> nowhere: no such part", "codegen: a library package without a part",
                                    "ptsolve -> bench: the library may import only the library",
                                    "ptsolve -> codegen: a lazy arrow that is no arrow"]


def results_citations(root: Path, *pkgs: str) -> list[tuple[str, str]]:
    """(file, path) where a library or test file names a path under ``results/`` that exists: the evidence is
    cited by its bench study's name, so moving a result never breaks the code that cites it."""
    res = root / "results"
    out = []
    for f in _files(root, *(p for p in pkgs if (root / p).is_dir())):
        for m in re.finditer(r"results/([\w.\-]+)", f.read_text()):
            if (res / m.group(1)).exists():
                out.append((str(f.relative_to(root)), m.group(0)))
    return out


def test_the_library_and_tests_cite_studies_not_results_paths():
    assert not results_citations(ROOT, *rules()["library"], "tests")


def test_the_citation_check_bites(tmp_path):
    (tmp_path / "results" / "gemm_x").mkdir(parents=True)
    (tmp_path / "codegen").mkdir()
    (tmp_path / "codegen" / "a.py").write_text('"""measured: results/gemm_x/README.md; 2 results/clk"""\n')
    assert results_citations(tmp_path, "codegen") == [("codegen/a.py", "results/gemm_x")]


MAX_FUNCTION_LINES = 80
# an operator family's shared file (Mamba2's parameters, ptsolve/ops/mamba2.py) is one of its operators' own files
FAMILY = {"chunk_scan": "mamba2", "chunk_state": "mamba2"}


def long_functions(root: Path, *pkgs: str) -> list[tuple[str, str, int]]:
    """(file, function, lines) of every function longer than MAX_FUNCTION_LINES in ``pkgs``."""
    return [(str(f.relative_to(root)), n.name, n.end_lineno - n.lineno + 1)
            for f in _files(root, *(p for p in pkgs if (root / p).is_dir()))
            for n in ast.walk(ast.parse(f.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]


def op_branches(root: Path, *pkgs: str) -> list[tuple[str, str]]:
    """(file, operator) where a library file compares against an operator's name (``== "gemm"``, ``in ("gemm", ...``)
    outside that operator's own files: the files named after its file in ``ptsolve/ops`` (``gemm.py`` in every
    layer; ``mamba2.py`` for the Mamba2 kernels)."""
    own = {}
    for f in sorted((root / "ptsolve" / "ops").glob("*.py")):
        for name in re.findall(r'^register\("(\w+)"', f.read_text(), re.M):
            own[name] = {f.stem, FAMILY.get(f.stem, f.stem)}
    out = []
    for f in _files(root, *(p for p in pkgs if (root / p).is_dir())):
        text = f.read_text()
        for name, stems in sorted(own.items()):
            if f.stem not in stems and re.search(rf'(?:[!=]=\s*|\bin\s*\((?:"\w+",\s*)*)"{name}"', text):
                out.append((str(f.relative_to(root)), name))
    return out


def test_no_function_is_longer_than_the_cap():
    assert not long_functions(ROOT, *rules()["library"])


def test_no_operator_branches_outside_the_operators_files():
    # baselines/ times the peers (cuBLAS, SDPA, mamba_ssm) per peer family, not ptsolve's operators
    assert not op_branches(ROOT, "ptsolve", "codegen")


def test_the_function_and_branch_checks_bite(tmp_path):
    (tmp_path / "ptsolve" / "ops").mkdir(parents=True)
    (tmp_path / "ptsolve" / "ops" / "gemm.py").write_text('register("gemm", OpSpec())\nif op == "gemm": pass\n')
    (tmp_path / "codegen").mkdir()
    (tmp_path / "codegen" / "lower.py").write_text('def f(op):\n    return op in ("flash", "gemm")\n')
    (tmp_path / "codegen" / "gemm.py").write_text('x = op == "gemm"\n')  # the operator's own file in a layer
    assert op_branches(tmp_path, "ptsolve", "codegen") == [("codegen/lower.py", "gemm")]
    (tmp_path / "codegen" / "long.py").write_text("def g():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert long_functions(tmp_path, "codegen") == [("codegen/long.py", "g", MAX_FUNCTION_LINES + 1)]


def test_results_is_evidence_not_code():
    assert not results_problems(ROOT)


def test_the_results_check_bites(tmp_path):
    """Code in results/ and a results/ over the limit are both caught (tmp_path is no git checkout: the folder is
    walked)."""
    (tmp_path / "results" / "s").mkdir(parents=True)
    (tmp_path / "results" / "s" / "README.md").write_text("what, device, date, commit, command\n")
    assert results_problems(tmp_path) == []
    (tmp_path / "results" / "s" / "run.sh").write_text("echo\n")
    (tmp_path / "results" / "s" / "big.json").write_bytes(b"0" * (RESULTS_MAX_BYTES + 1))
    got = results_problems(tmp_path)
    assert got[0] == "code in results/: results/s/run.sh" and "more than 5 MiB" in got[1] and len(got) == 2
