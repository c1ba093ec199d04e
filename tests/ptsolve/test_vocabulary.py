"""The operator vocabulary (ptsolve.tiling, ptsolve.opspec, ptsolve.geometry, ptsolve.hw) is what the core, the
lowering and the back-ends know of operators: none of them imports the op builders (``ptsolve.ops``), not even
inside a function, so a new operator is its op file, its task bodies and one registry line. And the core has no
import cycle, counting imports inside functions."""
from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

from test_layering import _files, _imports, _module

ROOT = Path(__file__).parents[2]
# the IR, the cost model, the checks, simulate, the solvers, the vocabulary itself, the lowering and the back-ends;
# the face (ptsolve/__init__, optimize, cli, suites, tune, torch) and the serving layer may import the builders
NO_BUILDERS = ("ptsolve.ir", "ptsolve.program", "ptsolve.protocol", "ptsolve.cost", "ptsolve.validate",
               "ptsolve.arguments", "ptsolve.kernelcheck", "ptsolve.simulate", "ptsolve.placement", "ptsolve.search",
               "ptsolve.policies", "ptsolve.tiling", "ptsolve.opspec", "ptsolve.geometry", "ptsolve.hw",
               "ptsolve.cpsolver", "ptsolve.errors", "ptsolve.fileio", "codegen.lower", "codegen.plan",
               "codegen.kernel_ir", "codegen.sync_sim", "codegen.cuda", "codegen.hip")


def _in(mod: str, prefixes: tuple[str, ...]) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def _builders(name: str) -> bool:
    return name == "ptsolve.ops" or name.startswith("ptsolve.ops.")


def builder_arrows(root: Path) -> list[tuple[str, str]]:
    """(module, what) where a module of NO_BUILDERS reaches ``ptsolve.ops``: an import at any depth, or the
    attribute ``ptsolve.ops`` of an imported ``ptsolve``."""
    out = []
    for f in _files(root, *(p for p in ("ptsolve", "codegen") if (root / p).is_dir())):
        mod = _module(root, f)
        if not _in(mod, NO_BUILDERS):
            continue
        out += [(mod, i) for i in sorted(_imports(root, f, top_level_only=False)) if _builders(i)]
        out += [(mod, "ptsolve.ops (attribute)") for n in ast.walk(ast.parse(f.read_text()))
                if isinstance(n, ast.Attribute) and n.attr == "ops" and isinstance(n.value, ast.Name)
                and n.value.id == "ptsolve"]
    return out


def import_cycles(root: Path, pkg: str) -> list[list[str]]:
    """Strongly connected groups of more than one module of ``pkg``, imports inside functions counted (a package
    importing its own submodules is how packages are built, not an arrow back)."""
    mods = {_module(root, f): f for f in _files(root, pkg)}
    graph = {m: sorted(i for i in _imports(root, f, False) if i in mods and i != m and not i.startswith(m + "."))
             for m, f in mods.items()}
    reach = {m: set(graph[m]) for m in graph}
    changed = True
    while changed:  # transitive closure: the graph is a few dozen modules
        changed = False
        for m in reach:
            more = set().union(*(reach[d] for d in reach[m])) - reach[m]
            if more:
                reach[m] |= more
                changed = True
    groups = {tuple(sorted({m} | {d for d in reach[m] if m in reach[d]})) for m in graph if m in reach[m]}
    return [list(g) for g in sorted(groups)]


def test_core_lowering_and_back_ends_never_import_the_builders():
    assert not builder_arrows(ROOT)


def test_no_import_cycle_in_ptsolve_counting_lazy_imports():
    assert not import_cycles(ROOT, "ptsolve")


def test_the_checks_bite(tmp_path):
    """A solver that imports a builder inside a function, a back-end that reads ``ptsolve.ops`` off the package,
    and a cycle closed by an import inside a function are all caught."""
    pkg = tmp_path / "ptsolve"
    (pkg / "policies").mkdir(parents=True)
    (pkg / "ops").mkdir()
    for p in (pkg, pkg / "policies", pkg / "ops"):
        (p / "__init__.py").write_text("")
    (pkg / "ops" / "gemm.py").write_text("X = 1\n")
    (pkg / "policies" / "greedy.py").write_text("def f():\n    from ..ops.gemm import X\n    return X\n")
    (pkg / "cost.py").write_text("from . import program\n")
    (pkg / "program.py").write_text("def g():\n    from .cost import h\n")
    back = tmp_path / "codegen" / "cuda"
    back.mkdir(parents=True)
    (tmp_path / "codegen" / "__init__.py").write_text("")
    (back / "__init__.py").write_text("")
    (back / "gemm.py").write_text("import ptsolve\n\n\ndef k():\n    return ptsolve.ops.make\n")
    assert sorted(builder_arrows(tmp_path)) == [("codegen.cuda.gemm", "ptsolve.ops (attribute)"),
                                                ("ptsolve.policies.greedy", "ptsolve.ops.gemm"),
                                                ("ptsolve.policies.greedy", "ptsolve.ops.gemm.X")]
    assert import_cycles(tmp_path, "ptsolve") == [["ptsolve.cost", "ptsolve.program"]]


def test_tiling_is_the_dict_it_was():
    """A Tiling equals, serialises and pickles like the plain dict of its keys (cache keys and saved results keep
    their bytes), and its derived facts read the optional keys at their defaults."""
    from ptsolve.tiling import Tiling, kernel_groups, slots_of
    d = {"BM": 128, "BN": 128, "depth": 3, "groups": 1, "pingpong": 1, "ctas": 2}
    t = Tiling(d)
    assert t == d and d == t and json.dumps(t, sort_keys=True) == json.dumps(d, sort_keys=True)
    assert pickle.loads(pickle.dumps(t)) == t and repr(t) == repr(d)
    assert (t.ctas, t.pingpong, t.cluster, t.slots, t.kernel_groups(1)) == (2, True, 1, 4, 2)
    assert slots_of({"BM": 64}) == 1 and kernel_groups(2, {"BM": 64}) == 2
    import ptsolve
    g = ptsolve.ops.gemm(M=256, N=256, K=256).graph({"BM": 128, "BN": 128, "BK": 64, "depth": 2, "groups": 1})
    assert isinstance(g.tiling, Tiling) and type(ptsolve.STaskGraph.from_json(g.to_json()).tiling) is Tiling


def test_the_registry_names_every_operator_and_alias():
    """The ``ptsolve`` command's operator names come from the specs (each names its aliases)."""
    from ptsolve.cli import OPS
    from ptsolve.opspec import REGISTRY
    # the built-in ones at least: an operator added later brings its own names without editing this test
    assert OPS.items() >= {"gemm": "gemm", "fa": "flash_attention", "flash_attention": "flash_attention",
                           "decode": "flash_decode", "flash_decode": "flash_decode",
                           "chunk_scan": "mamba2_chunk_scan", "mamba2_chunk_scan": "mamba2_chunk_scan",
                           "chunk_state": "mamba2_chunk_state", "mamba2_chunk_state": "mamba2_chunk_state"}.items()
    assert {n: s.persistent for n, s in REGISTRY.items()}.items() >= {
        "gemm": 1, "flash_attention": 0, "flash_decode": 0, "mamba2_chunk_scan": 0, "mamba2_chunk_state": 0}.items()
    assert set(OPS.values()) == set(REGISTRY)


def test_operators_register_by_discovery():
    """Every module of ``ptsolve/ops`` and ``codegen/cuda`` is imported with its package, in sorted order, so an
    operator registers by its files alone (no import line to add); each registered operator has CUDA task bodies."""
    import importlib
    import pkgutil
    import sys

    import codegen.cuda
    import ptsolve.ops
    from ptsolve.opspec import REGISTRY
    for pkg in (ptsolve.ops, codegen.cuda):
        names = [m.name for m in pkgutil.iter_modules(pkg.__path__)]
        assert names and all(f"{pkg.__name__}.{n}" in sys.modules for n in names)
    assert set(REGISTRY) <= set(importlib.import_module("codegen.cuda").REGISTRY)
    homes = [REGISTRY[n].build.__module__ for n in REGISTRY]
    assert homes == sorted(homes)


def test_an_operator_without_a_builder_in_ptsolve_ops_lists_its_own(monkeypatch) -> None:
    """``ptsolve ops`` reads an operator's parameters from its spec's builder when ptsolve.ops has no function of its
    name (an operator file that needs no line elsewhere)."""
    import dataclasses

    from ptsolve import cli
    from ptsolve.opspec import REGISTRY, Operator, make

    def toy(n: int, dtype: str = "fp16") -> Operator:
        """A toy: the gemm spec under another name."""
        return make("toy_op", n=n, dtype=dtype)

    monkeypatch.setitem(REGISTRY, "toy_op", dataclasses.replace(REGISTRY["gemm"], builder=toy, aliases=("toy",)))
    monkeypatch.setitem(cli.OPS, "toy", "toy_op")
    monkeypatch.setitem(cli.OPS, "toy_op", "toy_op")
    assert cli.op_help("toy") == ("toy_op (also: toy): n dtype=fp16\n  A toy: the gemm spec under another name.\n"
                                  "Parameters without a default are required; write them as key=value.")
    assert cli.op_help("gemm").startswith("gemm: M N K dtype=fp16")
