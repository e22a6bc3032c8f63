"""``ldpstream simulate``: offline paper reproduction. Dispatches on the mechanism family."""
from __future__ import annotations

import importlib
import math

from ..cli import CliError

#: mechanism name → module of ``ldpstream.simulate`` that runs it (``main(args) -> int``)
FAMILIES = {
    "rr-ind": "rr", "rr-joint": "rr", "rr-clusters": "rr",
    "rrba": "rrba",
    "corr-rr": "corr", "corr-rr-paper": "corr", "spl": "corr", "smp": "corr", "rs-fd": "corr",
    "rs-rfd": "corr",
    "lopub": "lopub",
}


def check_epsilon(value) -> float:
    """``--epsilon`` as a float, or a one-line :class:`CliError` unless it is finite and > 0."""
    try:
        e = float(value)
    except (TypeError, ValueError):
        raise CliError(f"--epsilon: must be a finite number > 0, got {value!r}") from None
    if not math.isfinite(e) or e <= 0:
        raise CliError(f"--epsilon: must be a finite number > 0, got {value}")
    return e


def main(args) -> int:
    if args.mechanism not in FAMILIES:
        raise CliError(f"--mechanism: unknown mechanism {args.mechanism!r}; choose one of "
                       + ", ".join(FAMILIES))
    # every family: an explicit --epsilon must be a usable budget (``None`` = not given; each
    # family module applies its own default or derives ε from its parameters)
    if getattr(args, "epsilon", None) is not None:
        check_epsilon(args.epsilon)
    module = importlib.import_module(f"{__name__}.{FAMILIES[args.mechanism]}")
    return int(module.main(args) or 0)
