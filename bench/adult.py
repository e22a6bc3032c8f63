"""``ldpstream bench adult``: the [Castell] Table VI reproduction on the bundled UCI Adult.

Setting (fixed): the 8 categorical attributes, n = 32,561, ε = 4, w = 2…6, 20 random attribute
subsets per w (seeded, the same for every estimator), one seeded randomization (seed 0), under both
ε conventions: ``attribute`` (ε = 4 on every attribute, 32 per record) and ``record`` (4/8 on
every attribute, 4 per record). Estimators: castell, rr-independent, hybrid, hybrid-auto,
truncated, ibu; plus ``truncated+clip`` (truncated clip-rescaled to a distribution, scored from the
same estimate). Metrics: tvd, max_abs (docs/mechanisms.md §7) and l2 = ‖P − Q‖₂, averaged over the
subsets. ``--quick``: w = 2…4 and 4 subsets.

Table VI's per-w numbers could not be found in the stored copies of the paper reachable from here,
so those columns print ``n/a``. The paper's abstract gives the averages over the 2- to 6-way
marginals (0.0099 for truncated, 0.0155 for hybrid); they are printed beside our averages. The
paper does not state its distance; see docs/benchmarks.md for which of ours comes
closest.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ldpstream.datasets import ADULT_COLUMNS
from ldpstream.simulate.driver import Plan, load_dataset, run_with_progress

EPSILON = 4.0
SEED = 0
ESTIMATORS = ("castell", "rr-independent", "hybrid", "hybrid-auto", "truncated", "ibu")
METRICS = ("tvd", "max_abs", "l2")
#: [Castell] Table VI per-w values: not available here (see module docstring)
PAPER_TABLE_VI: dict[tuple[str, int], float] = {}
#: [Castell] abstract: average distance over the 2- through 6-way marginals (metric not stated)
PAPER_AVERAGE = {"truncated": 0.0099, "hybrid": 0.0155}


def run(quick: bool = False) -> dict[str, Any]:
    ds = load_dataset(None, ",".join(ADULT_COLUMNS))
    ways = (2, 3, 4) if quick else (2, 3, 4, 5, 6)
    subsets = 4 if quick else 20
    scopes = {}
    for scope in ("attribute", "record"):
        plan = Plan(ds, "rr-ind", ESTIMATORS, ways, subsets, seed=SEED, runs=1, epsilon=EPSILON,
                    scope=scope, metrics=METRICS, also_clipped=("truncated",))
        scopes[scope] = run_with_progress(plan, f"adult ({scope} ε)")
    doc = {"dataset": "adult", "n": ds.n, "m": len(ds.domain), "epsilon": EPSILON, "seed": SEED,
           "ways": list(ways), "subsets": subsets, "scopes": scopes,
           "paper": {"table_vi": None, "abstract_average_2_to_6_way": PAPER_AVERAGE}}
    doc["averages"] = {scope: _averages(d) for scope, d in scopes.items()}
    doc["checks"] = checks(scopes)
    return doc


def _rows(doc: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["estimator"], r["w"]): r for r in doc["results"]}


def _averages(doc: dict[str, Any]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in doc["results"]:
        out.setdefault(r["estimator"], {k: 0.0 for k in METRICS})
    for e in out:
        rows = [r for r in doc["results"] if r["estimator"] == e]
        out[e] = {k: float(np.mean([r["metrics"][k] for r in rows])) for k in METRICS}
    return out


def checks(scopes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The done-when targets, evaluated honestly (``passed`` may be False)."""
    out = []
    rec, att = _rows(scopes["record"]), _rows(scopes["attribute"])
    ws = sorted({w for (_, w) in rec})
    detail = []
    ok = True
    for w in (w for w in ws if w >= 3):
        i, t = rec[("ibu", w)]["metrics"], rec[("truncated", w)]["metrics"]
        good = i["tvd"] < t["tvd"] and i["max_abs"] < t["max_abs"]
        ok &= good
        detail.append(f"w={w}: ibu tvd {i['tvd']:.4g} vs {t['tvd']:.4g}, "
                      f"max_abs {i['max_abs']:.4g} vs {t['max_abs']:.4g}")
    out.append({"check": "record scope: ibu has lower tvd and max_abs than truncated at every "
                         "w ≥ 3", "passed": bool(ok), "detail": detail})
    detail, ok = [], True
    for w in ws:
        i, t = att[("ibu", w)]["metrics"], att[("truncated", w)]["metrics"]
        rt, rm = i["tvd"] / t["tvd"], i["max_abs"] / t["max_abs"]
        ok &= rt <= 1.0 and rm <= 1.0
        detail.append(f"w={w}: ibu/truncated tvd {rt:.3f}, max_abs {rm:.3f}")
    out.append({"check": "attribute scope: ibu no worse than truncated at any w (tvd and "
                         "max_abs ratios ≤ 1.00)", "passed": bool(ok), "detail": detail})
    conv = [r["converged_fraction"] for d in scopes.values() for r in d["results"]
            if r["estimator"] == "ibu"]
    frac = float(np.mean(conv))
    out.append({"check": "ibu converges in ≥ 95% of runs", "passed": frac >= 0.95,
                "detail": [f"converged fraction {frac:.3f} over "
                           f"{len(conv) * scopes['record']['results'][0]['subsets']} estimates"]})
    return out


def _paper(e: str, w: int) -> str:
    v = PAPER_TABLE_VI.get((e, w))
    return "n/a" if v is None else f"{v:.4g}"


def print_report(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    for scope, d in doc["scopes"].items():
        t = Table(title=f"[Castell] Table VI on Adult: n={d['n']}, ε={doc['epsilon']:g} per "
                        f"{scope} (ε per record {d['epsilon_per_record']:.4g}), "
                        f"{doc['subsets']} subsets per w, seed {doc['seed']}")
        for c in ("estimator", "w", "tvd", "max_abs", "l2", "Table VI", "seconds",
                  "ibu iterations", "converged"):
            t.add_column(c, justify="left" if c == "estimator" else "right")
        for r in d["results"]:
            m = r["metrics"]
            t.add_row(r["estimator"], str(r["w"]), f"{m['tvd']:.4g}", f"{m['max_abs']:.4g}",
                      f"{m['l2']:.4g}", _paper(r["estimator"], r["w"]), f"{r['seconds']:.2f}",
                      f"{r['iterations']:.0f}" if "iterations" in r else "",
                      f"{r['converged_fraction']:.0%}" if "converged_fraction" in r else "")
        console.print(t)
        a = Table(title=f"average over w = {doc['ways'][0]}…{doc['ways'][-1]} ({scope} ε) vs the "
                        "paper's abstract (2…6-way, metric not stated)")
        for c in ("estimator", "tvd", "max_abs", "l2", "paper"):
            a.add_column(c, justify="left" if c == "estimator" else "right")
        for e, m in doc["averages"][scope].items():
            p = PAPER_AVERAGE.get(e)
            a.add_row(e, f"{m['tvd']:.4g}", f"{m['max_abs']:.4g}", f"{m['l2']:.4g}",
                      "n/a" if p is None else f"{p:g}")
        console.print(a)
    for c in doc["checks"]:
        console.print(f"[{'green' if c['passed'] else 'red'}]{'PASS' if c['passed'] else 'FAIL'}"
                      f"[/] {c['check']}")
        for line in c["detail"]:
            console.print(f"      {line}")
    console.print("Table VI per-w values: n/a (not found in the stored copies of the paper); "
                  "paper averages from its abstract.")


def main(args: Any) -> int:
    doc = run(quick=bool(getattr(args, "quick", False)))
    if getattr(args, "json", False):
        print(json.dumps(doc))
    else:
        print_report(doc)
    return 0
