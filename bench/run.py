"""``ldpstream bench <name>``: dispatch to ``ldpstream.bench.<name>.main(args)``."""
from __future__ import annotations

import importlib


#: bench name → module of this package, where they differ
MODULES = {"refresh": "refresh_scale", "fetch": "fetch_guard"}


def main(args) -> int:
    module = MODULES.get(args.name, args.name)
    return int(importlib.import_module(f"ldpstream.bench.{module}").main(args) or 0)
