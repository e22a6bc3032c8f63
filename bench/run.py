"""``ldpstream bench <name>``: dispatch to ``ldpstream.bench.<name>.main(args)``."""
from __future__ import annotations

import importlib


def main(args) -> int:
    return int(importlib.import_module(f"ldpstream.bench.{args.name}").main(args) or 0)
