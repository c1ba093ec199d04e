"""The house's arrows: ``ptsolve`` (model, solvers) never imports ``codegen`` or ``baselines``, except its PyTorch
front door ``ptsolve.torch`` (which sits above the code generator and imports it lazily); the library packages
have no import cycle at module level (imports inside functions are the lazy edges that keep solver and GPU stacks
optional, and may point back)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
FRONT_DOORS = {"ptsolve.torch"}
# codegen's drivers compare against the libraries (mamba_ssm's Triton kernels through baselines/); the lowering,
# skeleton, emitters, runtime and profiler never reach the baselines
DRIVERS = {"codegen.bench", "codegen.mamba", "codegen.round", "codegen.sanitize", "codegen.study"}


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
    (pkg / "torch.py").write_text("import codegen.generic\n\ndef f():\n    import codegen.lower\n")
    assert wrong_arrows(tmp_path) == [("ptsolve.b", "codegen.lower"), ("ptsolve.torch", "codegen.generic")]
    assert cycles(tmp_path, "ptsolve") == [["ptsolve.a", "ptsolve.b", "ptsolve.a"]]
