"""``ldpstream bench <name>``: dispatch to ``ldpstream.bench.<name>.main(args)``; every
benchmark's ``--help`` is its module's docstring."""
from __future__ import annotations

import ast
import importlib
import re
from importlib import resources

#: the benchmarks, in the order ``ldpstream bench --help`` lists them
BENCHES = ("castell", "adult", "pipeline", "mechanisms", "gateway", "refresh", "marginals",
           "adaptive", "fetch", "sdk", "mqtt", "numeric", "devices")
#: bench name → module of this package, where they differ
MODULES = {"refresh": "refresh_scale", "fetch": "fetch_guard"}
#: benchmarks with options beyond --json and --quick
EXTRA_OPTIONS = {"pipeline": ("--redis-cluster", "--broker"),
                 "marginals": ("--data", "--columns", "--bif", "--generate", "--seed",
                               "--epsilons", "--runs", "--bounds"),
                 "devices": ("--steps",), "numeric": ("--live", "--drift")}


def describe(name: str) -> tuple[str, str]:
    """(one-line summary, full description) of a benchmark, read from its module's docstring
    without importing it (its imports are heavy)."""
    source = resources.files(__package__).joinpath(f"{MODULES.get(name, name)}.py").read_text(
        encoding="utf-8")
    doc = ast.get_docstring(ast.parse(source)) or name
    doc = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", doc).replace("``", "`")  # no reST in --help
    first = " ".join(doc.split("\n\n", 1)[0].split())
    summary = re.sub(r"^`ldpstream bench [^`]*`:\s*", "", first)
    return summary, doc


def main(args) -> int:
    module = MODULES.get(args.name, args.name)
    return int(importlib.import_module(f"ldpstream.bench.{module}").main(args) or 0)
