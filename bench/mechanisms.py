"""``ldpstream bench mechanisms``: three mechanism families side by side (Corr-RR and baselines,
RRBA vs the Laplace baseline, LoPub estimators). Each part lives in its own module."""
from __future__ import annotations

import importlib
import json

PARTS = ("mech_corr", "mech_rrba", "mech_lopub")


def main(args) -> int:
    results = {}
    for part in PARTS:
        mod = importlib.import_module(f"ldpstream.bench.{part}")
        results[part.removeprefix("mech_")] = mod.run(quick=getattr(args, "quick", False),
                                                       verbose=not args.json)
    if args.json:
        print(json.dumps(results, indent=2, default=float))
    return 0
