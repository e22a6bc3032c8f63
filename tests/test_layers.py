"""The import arrows of docs/architecture.md: no module-level import cycle inside ldpstream, and
the lower layers never import the upper ones (estimators/ is pure numpy; config and producers
know nothing of the worker; only the shell starts the embedded dev services)."""
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


def _imports(name: str, path: Path, top_level: bool, mods: set[str]) -> set[str]:
    """Modules imported by ``name`` (only at module level when ``top_level``): for
    ``from pkg import x`` the submodule ``pkg.x`` when it is one, else ``pkg``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level else list(ast.walk(tree))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.If):  # TYPE_CHECKING blocks do not run
            continue
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


def _graph(top_level: bool) -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    for name, path in mods.items():
        g.add_node(name)
        for target in _imports(name, path, top_level, set(mods)):
            # a package's __init__ runs before its submodules anyway: not an arrow
            if target in mods and target != name and not name.startswith(target + "."):
                g.add_edge(name, target)
    return g


def test_no_module_level_import_cycle():
    g = _graph(top_level=True)
    cycles = [c for c in nx.simple_cycles(g) if not all(m.startswith("ldpstream.bench") for m in c)]
    assert not cycles, f"import cycles: {cycles[:5]}"


RULES = [
    # (importer prefix, forbidden prefixes)
    ("ldpstream.estimators", ("ldpstream.agents", "ldpstream.producers", "ldpstream.config",
                              "ldpstream.dev", "ldpstream.simulate", "ldpstream.bench",
                              "ldpstream.cli", "ldpstream.embedded")),
    ("ldpstream.config", ("ldpstream.agents.", "ldpstream.producers", "ldpstream.dev")),
    ("ldpstream.names", ("ldpstream.",)),
    ("ldpstream.producers", ("ldpstream.agents", "ldpstream.dev")),
    ("ldpstream.agents", ("ldpstream.dev", "ldpstream.simulate", "ldpstream.bench")),
]


@pytest.mark.parametrize("importer,forbidden", RULES)
def test_layers_import_downwards(importer, forbidden):
    g = _graph(top_level=False)
    bad = [(a, b) for a, b in g.edges
           if (a == importer or a.startswith((importer + ".", importer + "_")))
           and any(b.startswith(f) or b == f.rstrip(".") for f in forbidden)]
    assert not bad, f"{importer} imports upwards: {bad}"
