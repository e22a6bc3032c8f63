"""``ldpstream simulate``: offline paper reproduction. Dispatches on the mechanism family."""
from __future__ import annotations

import importlib

from ..cli import CliError

#: mechanism name → module of ``ldpstream.simulate`` that runs it (``main(args) -> int``)
FAMILIES = {
    "rr-ind": "rr", "rr-joint": "rr", "rr-clusters": "rr",
    "rrba": "rrba",
    "corr-rr": "corr", "corr-rr-paper": "corr", "spl": "corr", "smp": "corr", "rs-fd": "corr",
    "rs-rfd": "corr",
    "lopub": "lopub",
}


def main(args) -> int:
    if args.mechanism not in FAMILIES:
        raise CliError(f"--mechanism: unknown mechanism {args.mechanism!r}; choose one of "
                       + ", ".join(FAMILIES))
    module = importlib.import_module(f"{__name__}.{FAMILIES[args.mechanism]}")
    return int(module.main(args) or 0)
