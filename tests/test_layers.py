"""The import arrows of docs/architecture.md: no import cycle inside ldpstream, counting every
import (module level, inside functions and under ``TYPE_CHECKING``: a cycle through a type is
still two modules that must be read together), and the lower layers never import the upper ones
(estimators/ is pure numpy; config and producers know nothing of the worker; the worker's stages
import downwards; only ``ldpstream up`` and the benchmarks start the dev services)."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import networkx as nx
import pytest

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parent.parent


def _packages() -> dict[str, Path]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dirs = cfg["tool"]["setuptools"]["package-dir"]
    return {pkg: ROOT / d for pkg, d in dirs.items()}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg, base in _packages().items():
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            if any(name.startswith(other + ".") or name == other
                   for other in _packages() if other != pkg and other.startswith(pkg + ".")):
                continue  # ldpstream/agents would shadow the mapped ldpstream.agents
            out[name] = path
    return out


def _imports(name: str, path: Path, mods: set[str]) -> set[str]:
    """Modules imported anywhere in ``name`` (module level, in functions, under
    ``TYPE_CHECKING``): for ``from pkg import x`` the submodule ``pkg.x`` when it is one, else
    ``pkg``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = name if is_pkg else name.rpartition(".")[0]
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            mod = (base + ("." + node.module if node.module else "")) if node.level else node.module
            for a in node.names:
                out.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod or "")
    return out


def _graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    for name, path in mods.items():
        g.add_node(name)
        for target in _imports(name, path, set(mods)):
            # a package's __init__ runs before its submodules anyway: not an arrow
            if target in mods and target != name and not name.startswith(target + "."):
                g.add_edge(name, target)
    return g


def test_no_import_cycle_even_through_types_or_functions():
    cycles = [sorted(c) for c in nx.strongly_connected_components(_graph()) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_cycle_check_sees_type_only_and_function_level_imports(tmp_path):
    """The check above must fail on a cycle that only a ``TYPE_CHECKING`` block or a function
    closes (the kind it used to miss)."""
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from pkg import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from pkg import a\n")
    mods = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    assert _imports("pkg.a", mods["pkg.a"], set(mods)) == {"typing", "pkg.b"}
    assert _imports("pkg.b", mods["pkg.b"], set(mods)) == {"pkg.a"}


RULES = [
    # (importer prefix, forbidden prefixes)
    ("ldpstream.estimators", ("ldpstream.agents", "ldpstream.producers", "ldpstream.config",
                              "ldpstream.dev", "ldpstream.simulate", "ldpstream.bench",
                              "ldpstream.cli", "ldpstream.embedded")),
    ("ldpstream.config", ("ldpstream.agents.", "ldpstream.producers", "ldpstream.dev")),
    ("ldpstream.names", ("ldpstream.",)),
    ("ldpstream.producers", ("ldpstream.agents", "ldpstream.dev")),
    ("ldpstream.agents", ("ldpstream.dev", "ldpstream.simulate", "ldpstream.bench",
                          "ldpstream.embedded", "ldpstream.cli")),
    ("ldpstream.credentials", ("ldpstream.agents", "ldpstream.producers", "ldpstream.dev")),
    # the worker's stages (docs/architecture.md): the store and the control state know nothing
    # of who feeds or reads them; ingest never reads estimates; refresh never touches Kafka
    ("ldpstream.agents.store", ("ldpstream.agents.ingest", "ldpstream.agents.refresh",
                                "ldpstream.agents.control", "ldpstream.agents.serve",
                                "ldpstream.agents.context", "ldpstream.agents.worker",
                                "ldpstream.agents.app")),
    ("ldpstream.agents.control.collection_state", ("ldpstream.agents.ingest",
                                                   "ldpstream.agents.refresh",
                                                   "ldpstream.agents.serve")),
    ("ldpstream.agents.ingest", ("ldpstream.agents.refresh", "ldpstream.agents.serve",
                                 "ldpstream.agents.worker", "ldpstream.agents.app",
                                 "ldpstream.agents.control.controller")),
    ("ldpstream.agents.refresh", ("ldpstream.agents.ingest", "ldpstream.agents.serve",
                                  "ldpstream.agents.worker", "ldpstream.agents.app")),
    ("ldpstream.agents.serve", ("ldpstream.agents.app",)),
]

#: the modules that may start the dev services of ldpstream/dev/: ``ldpstream up`` and the
#: benchmarks (tests import them directly); everything else is runtime code
DEV_USERS = ("ldpstream.dev", "ldpstream.embedded", "ldpstream.bench")


def test_runtime_code_never_imports_the_dev_harness():
    bad = [(a, b) for a, b in _graph().edges
           if b.startswith("ldpstream.dev") and not a.startswith(DEV_USERS)]
    assert not bad, f"runtime modules import ldpstream/dev/: {bad}"


@pytest.mark.parametrize("importer,forbidden", RULES)
def test_layers_import_downwards(importer, forbidden):
    g = _graph()
    bad = [(a, b) for a, b in g.edges
           if (a == importer or a.startswith((importer + ".", importer + "_")))
           and any(b.startswith(f) or b == f.rstrip(".") for f in forbidden)]
    assert not bad, f"{importer} imports upwards: {bad}"
