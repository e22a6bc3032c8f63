"""LoPub part of ``ldpstream bench mechanisms``: tvd (LoPub's AVD) of 2- and 3-way joints on UCI
Adult for EM JD, Lasso JD, Lasso+EM and the bit co-occurrence estimator, across bit-flip
probabilities f, with seconds per estimate.

Bloom sizes follow eqs. 6–7 with p_fp = 0.01 (h = 7, m_j ≈ 9.6·d_j); ε is eq. 8 summed over the
attributes (and the exact ε of the drawn filters beside it). Seeded; BLAS limited to one thread
(small matmuls in a loop; a shared machine).

    python -m ldpstream.bench.mech_lopub [--quick] [--json]
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any

from ..datasets import ADULT_COLUMNS, load_csv
from ..estimators.lopub import DEFAULT_P_FP, LoPub
from ..simulate.lopub import evaluate

FULL = {"columns": ADULT_COLUMNS, "fs": (0.1, 0.3, 0.5, 0.7, 0.9), "ways": (2, 3), "subsets": 5}
QUICK = {"columns": ("marital-status", "relationship", "race", "sex", "Salary"), "fs": (0.5,),
         "ways": (2,), "subsets": 3}
SEED = 0


def run(quick: bool = False, verbose: bool = True) -> dict[str, Any]:
    """Run the LoPub benchmark; returns a JSON-serializable dict (``rows``: one per f, w and
    estimator)."""
    from threadpoolctl import threadpool_limits

    cfg = QUICK if quick else FULL
    ds = load_csv(columns=cfg["columns"])
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    with threadpool_limits(1):
        for f in cfg["fs"]:
            res = evaluate(ds, f=f, estimators=LoPub.estimators, ways=cfg["ways"],
                           subsets=cfg["subsets"], seed=SEED, runs=1,
                           progress=(lambda m: print("  lopub", f"f={f}", m, file=sys.stderr,
                                                     flush=True)) if verbose else None)
            for r in res["results"]:
                rows.append({"f": f, "epsilon": res["epsilon"],
                             "epsilon_exact": res["epsilon_exact"], **r})
            proj = evaluate(ds, f=f, estimators=("cooccurrence",), ways=cfg["ways"],
                            subsets=cfg["subsets"], seed=SEED, runs=1, proper=True)
            for r in proj["results"]:
                rows.append({"f": f, "epsilon": res["epsilon"],
                             "epsilon_exact": res["epsilon_exact"], **r})
    out = {
        "dataset": "adult", "n": ds.n, "columns": list(ds.domain.attrs), "p_fp": DEFAULT_P_FP,
        "hashes": res["hashes"], "bits": res["bits"], "metric": "tvd",
        "epsilon_scope": "record: eq. 8 per attribute summed over attributes",
        "seed": SEED, "subsets": res["subsets"], "quick": quick, "rows": rows,
        "seconds_total": time.perf_counter() - t_start,
    }
    if verbose:
        _print(out)
    return out


def _print(out: dict[str, Any]) -> None:
    print(f"LoPub on Adult (n={out['n']}, {len(out['columns'])} attributes, h={out['hashes']}, "
          f"p_fp={out['p_fp']}); metric tvd, mean over {len(out['subsets'].get('2', []))} "
          f"subsets per w; seed {out['seed']}")
    print(f"{'f':>5}{'ε eq.8':>9}{'ε exact':>9}{'w':>3}  {'estimator':<22}{'tvd':>8}"
          f"{'s/est':>8}{'EM it':>7}")
    for r in out["rows"]:
        it = "" if r["em_iterations"] is None else f"{r['em_iterations']:.0f}"
        print(f"{r['f']:>5}{r['epsilon']:>9.2f}{r['epsilon_exact']:>9.2f}{r['w']:>3}  "
              f"{r['estimator']:<22}{r['tvd']:>8.4f}{r['seconds']:>8.3f}{it:>7}")
    print(f"total {out['seconds_total']:.1f}s")


if __name__ == "__main__":
    result = run(quick="--quick" in sys.argv, verbose="--json" not in sys.argv)
    if "--json" in sys.argv:
        print(json.dumps(result, indent=2))
