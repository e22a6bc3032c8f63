"""``ldpstream simulate --compare``: which mechanism gives the lowest error for *your* data shape
and ε per record — splitting the record's budget over the attributes (``rr-ind``, every attribute
ε_record/m; castell and IBU) or reporting one assigned marginal with the whole budget
(``partitioned``; consistent, calm and global) — run side by side through the one driver on the same
data, subsets and seeds.

The two mechanisms are built from the same ``--epsilon`` / ``--epsilon-scope`` (so the same ε
per record, stated in the output), the same ``--ways`` / ``--subsets`` / ``--runs`` / ``--seed``.
partitioned runs collecting every pair (``ways: 2``), every triple (``ways: 3``) and, when
``ways: auto`` would declare a larger size for this shape (large ε: reports of 4 or more
attributes, up to the whole record), that size too: which is better depends on the domain
sizes and ε (small domains favour triples — each pair is then informed by m−2 collected
marginals). ``best`` names, per w, the (mechanism, ways, estimator) with the lowest mean TVD,
and ``ratio`` is the best split TVD over the best partitioned TVD (> 1: partitioned wins).
``auto_ways`` states the size ``ways: auto`` would declare for this data's shape (n,
attribute sizes, ε per record;
:func:`~ldpstream.estimators.families.partitioned.choose_ways`).
"""
from __future__ import annotations

import json
from typing import Any

from ldpstream.cli import CliError
from ldpstream.estimators.families.partitioned import Partitioned, choose_ways
from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.mechanism import record_budget
from ldpstream.simulate.driver import plan_from_args, run_with_progress

__all__ = ["CONTENDERS", "compare", "main"]

#: the budget split over the attributes against one marginal per report
SPLIT, PARTITIONED = RRIndependent.name, Partitioned.name
#: mechanism → estimators compared
CONTENDERS = {SPLIT: ("castell", "ibu"), PARTITIONED: ("consistent", "calm", "global")}
#: partitioned collects every pair, and (with at least 3 attributes) every triple instead, and
#: the size ``ways: auto`` picks: the marginal size trades the oracle's domain against the
#: users per marginal (CALM §4)
PARTITIONED_WAYS = (2, 3)


def compare(args: Any) -> dict[str, Any]:
    """Run every contender on the plan ``args`` describe; the merged JSON document."""
    docs = []
    shape: tuple[int, ...] = ()
    auto = 2
    for mech, ests in CONTENDERS.items():
        a = replace_args(args, mechanism=mech, estimator=list(ests))
        plan = plan_from_args(a)
        m = len(plan.dataset.domain)
        if m < 2:
            raise CliError(f"--compare: needs at least 2 columns (got {m}); with one "
                           "attribute there is no budget to split")
        if mech == PARTITIONED:
            shape = plan.dataset.domain.shape
            auto = choose_ways(shape, len(plan.dataset.records),
                               record_budget(plan.epsilon, plan.scope, m))
            plan.variants = tuple({"ways": w} for w in sorted({*PARTITIONED_WAYS, auto})
                                  if w <= m)
        docs.append(run_with_progress(plan, label=f"compare: {mech}"))
    rows = [r for d in docs for r in d["results"]]
    eps = {d["mechanism"]: d["epsilon_per_record"] for d in docs}
    best: dict[str, Any] = {}
    for w in sorted({r["w"] for r in rows}):
        at = [r for r in rows if r["w"] == w]
        top = min(at, key=lambda r: r["metrics"]["tvd"])
        per = {m: min(r["metrics"]["tvd"] for r in at if r["mechanism"] == m) for m in CONTENDERS}
        best[str(w)] = {"mechanism": top["mechanism"], "estimator": top["estimator"],
                        "ways": top.get("ways"), "tvd": top["metrics"]["tvd"],
                        "ratio": per[SPLIT] / per[PARTITIONED]}
    first = docs[0]
    return {"compare": list(CONTENDERS), "n": first["n"], "m": first["m"],
            "epsilon": first["epsilon"], "epsilon_scope": first["epsilon_scope"],
            "epsilon_per_record": eps, "seed": first["seed"], "runs": first["runs"],
            "results": rows, "best": best,
            "auto_ways": auto}


def replace_args(args: Any, **changes: Any) -> Any:
    """A copy of the argparse namespace with ``changes``."""
    ns = type(args)(**vars(args))
    for k, v in changes.items():
        setattr(ns, k, v)
    return ns


def main(args: Any) -> int:
    if args.estimator:
        raise CliError("--compare: runs its own estimators (rr-ind castell/ibu, partitioned "
                       "consistent/calm/global); drop --estimator")
    if getattr(args, "synthesize", None):
        raise CliError("--compare and --synthesize are exclusive")
    doc = compare(args)
    if args.json:
        print(json.dumps(doc))
        return 0
    from rich.console import Console
    from rich.table import Table
    eps = doc["epsilon_per_record"]
    t = Table(title=f"which mechanism for this data: n={doc['n']} m={doc['m']} ε per record "
                    + ", ".join(f"{m} {e:.4g}" for m, e in eps.items()))
    for c in ("mechanism", "collects", "estimator", "w", "subsets", "tvd", "max_abs", "mse",
              "seconds"):
        t.add_column(c, justify="left" if c in ("mechanism", "estimator") else "right")
    for r in doc["results"]:
        mt, se = r["metrics"], r.get("stderr")
        t.add_row(r["mechanism"], f"all {r['ways']}-way" if "ways" in r else "",
                  r["estimator"], str(r["w"]), str(r["subsets"]),
                  *[f"{mt[k]:.4g}" + (f" ±{se[k]:.2g}" if se else "")
                    for k in ("tvd", "max_abs", "mse")], f"{r['seconds']:.3f}")
    console = Console()
    (console if console.is_terminal else Console(width=160)).print(t)
    for w, b in doc["best"].items():
        how = f" (params: ways: {b['ways']})" if b["ways"] is not None else ""
        print(f"{w}-way: lowest TVD {b['mechanism']}{how} / {b['estimator']} ({b['tvd']:.4f}); "
              f"split/partitioned TVD ratio {b['ratio']:.2f}")
    print(f"partitioned ways: auto (expected_reports: {doc['n']}) declares every "
          f"{doc['auto_ways']}-way marginal at this shape and ε")
    return 0

