"""LoPub part of ``ldpstream bench mechanisms``: tvd (LoPub's AVD) of 2- and 3-way joints on UCI
Adult for EM JD, Lasso JD, Lasso+EM and the bit co-occurrence estimator, across bit-flip
probabilities f, with seconds per estimate.

Bloom sizes follow eqs. 6–7 with p_fp = 0.01 (h = 7, m_j ≈ 9.6·d_j); ``epsilon`` is the exact ε
per record of the drawn filters (as in ``simulate``), ``epsilon_eq8`` the paper's eq. 8 bound
summed over the attributes. Seeded; BLAS limited to one thread
(small matmuls in a loop; a shared machine).

    python -m ldpstream.bench.mech_lopub [--quick] [--json]
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

from ldpstream.cli import CliError
from ldpstream.datasets import ADULT_COLUMNS, Dataset, load_csv
from ldpstream.estimators.families.lopub import DEFAULT_P_FP, LoPub
from ldpstream.simulate.driver import Plan, simulate
from ldpstream.simulate.synthesize import marginal_fidelity, synthesize_dataset

FULL = {"columns": ADULT_COLUMNS, "fs": (0.1, 0.3, 0.5, 0.7, 0.9), "ways": (2, 3), "subsets": 5,
        "synth_fs": (0.3, 0.5, 0.7, 0.9)}
QUICK = {"columns": ("marital-status", "relationship", "race", "sex", "Salary"), "fs": (0.5,),
         "ways": (2,), "subsets": 3, "synth_fs": ()}
SEED = 0
TARGET = "Salary"


def _one_hot(ds: Dataset, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y_col = ds.domain.axes((TARGET,))[0]
    cols = [j for j in range(len(ds.domain)) if j != y_col]
    X = np.concatenate([np.eye(ds.domain.shape[j])[records[:, j]] for j in cols], axis=1)
    return X, records[:, y_col]


def classification(ds: Dataset, synthetic: np.ndarray | None, seed: int = SEED) -> dict[str, float]:
    """Accuracy of predicting Salary from the other attributes (one-hot), tested on the last third
    of the original records; trained on the synthetic records (or, with ``None``, on the first
    two thirds of the original ones). Linear SVM and a 50-tree random forest."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.svm import LinearSVC

    cut = 2 * ds.n // 3
    X_test, y_test = _one_hot(ds, ds.records[cut:])
    X, y = _one_hot(ds, ds.records[:cut] if synthetic is None else synthetic)
    out = {}
    for name, model in (("svm", LinearSVC(C=1.0, dual=False, random_state=seed)),
                        ("random_forest", RandomForestClassifier(50, random_state=seed, n_jobs=1))):
        model.fit(X, y)
        out[name] = float((model.predict(X_test) == y_test).mean())
    return out


def evaluate(ds: Dataset, f: float, estimators: tuple[str, ...], ways: tuple[int, ...],
             subsets: int, proper: bool = False) -> dict[str, Any]:
    """One ``simulate`` run of LoPub at flip probability f (tvd only), with the filters' ε."""
    plan = Plan(ds, "lopub", tuple(estimators), tuple(ways), subsets, seed=SEED, epsilon=None,
                scope="record", params={"f": f}, proper=proper, metrics=("tvd",))
    doc = simulate(plan)
    mech = LoPub.from_config(ds.domain, {"f": f}, epsilon=None)
    if proper:
        for r in doc["results"]:
            r["estimator"] += "+project"
    doc.update(epsilon=mech.epsilon, epsilon_exact=mech.epsilon_exact,
               epsilon_eq8=mech.epsilon_eq8, hashes=mech.hashes,
               bits=dict(zip(ds.domain.attrs, mech.bits)),
               subsets={str(w): doc["results"][0]["subsets"] for w in ways})
    return doc


def _row(f: float, res: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
    """One bench row (flat) from an :func:`evaluate` result row."""
    out = {"f": f, "epsilon": res["epsilon"], "epsilon_exact": res["epsilon_exact"],
           "epsilon_eq8": res["epsilon_eq8"]}
    out.update({k: v for k, v in r.items() if k not in ("metrics", "stderr", "mechanism")})
    out["tvd"] = r["metrics"]["tvd"]
    out["tvd_se"] = r["stderr"]["tvd"] if "stderr" in r else None
    return out


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
            res = evaluate(ds, f, LoPub.estimators, cfg["ways"], cfg["subsets"])
            if verbose:
                print("  lopub", f"f={f}", file=sys.stderr, flush=True)
            for r in res["results"]:
                rows.append(_row(f, res, r))
            proj = evaluate(ds, f, ("cooccurrence",), cfg["ways"], cfg["subsets"], proper=True)
            for r in proj["results"]:
                rows.append(_row(f, res, r))
        synth = []
        if TARGET in ds.domain.attrs and cfg["synth_fs"]:
            synth.append({"f": None, "source": "original (first 2/3)",
                          **classification(ds, None)})
            maj = float(np.bincount(ds.column(TARGET)[2 * ds.n // 3:]).max()
                        / (ds.n - 2 * ds.n // 3))
            synth.append({"f": None, "source": "majority class", "svm": maj,
                          "random_forest": maj})
        for f in cfg["synth_fs"]:
            mech = LoPub(ds.domain, f=f, seed=SEED)
            rng = np.random.default_rng([SEED, 104729])
            t0 = time.perf_counter()
            try:
                x, info = synthesize_dataset(ds, mech, mech.randomize(ds.records, rng), "em", rng)
            except CliError as exc:          # a cluster too large to estimate
                synth.append({"f": f, "source": "LoPub synthetic (EM)", "error": str(exc)})
                continue
            secs = time.perf_counter() - t0
            synth.append({"f": f, "source": "LoPub synthetic (EM)",
                          "epsilon": mech.epsilon, "epsilon_eq8": mech.epsilon_eq8,
                          "clusters": info["clusters"], "seconds": secs,
                          **marginal_fidelity(ds, x), **classification(ds, x)})
            if verbose:
                print("  lopub synthesis", f"f={f}", f"{secs:.1f}s", file=sys.stderr, flush=True)
    out = {
        "dataset": "adult", "n": ds.n, "columns": list(ds.domain.attrs), "p_fp": DEFAULT_P_FP,
        "hashes": res["hashes"], "bits": res["bits"], "metric": "tvd",
        "epsilon_scope": "record",
        "seed": SEED, "subsets": res["subsets"], "quick": quick, "rows": rows,
        "synthesis": synth,
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
        print(f"{r['f']:>5}{r['epsilon_eq8']:>9.2f}{r['epsilon_exact']:>9.2f}{r['w']:>3}  "
              f"{r['estimator']:<22}{r['tvd']:>8.4f}{r['seconds']:>8.3f}{it:>7}")
    if out["synthesis"]:
        print(f"synthetic datasets (Alg. 4 + 6, EM joints, φ=0.2): predicting {TARGET}, tested on "
              "the last third of Adult")
        print(f"{'f':>5}  {'source':<24}{'1-way tvd':>10}{'2-way tvd':>10}{'SVM':>7}{'RF':>7}"
              f"{'s':>7}")
        for r in out["synthesis"]:
            f = "" if r["f"] is None else r["f"]
            if "error" in r:
                print(f"{f:>5}  {r['source']:<24}{r['error']}")
                continue
            t1 = f"{r['tvd_1way']:.4f}" if "tvd_1way" in r else ""
            t2 = f"{r['tvd_2way']:.4f}" if "tvd_2way" in r else ""
            sec = f"{r['seconds']:.1f}" if "seconds" in r else ""
            print(f"{f:>5}  {r['source']:<24}{t1:>10}{t2:>10}{r['svm']:>7.3f}"
                  f"{r['random_forest']:>7.3f}{sec:>7}")
    print(f"total {out['seconds_total']:.1f}s")


if __name__ == "__main__":
    result = run(quick="--quick" in sys.argv, verbose="--json" not in sys.argv)
    if "--json" in sys.argv:
        print(json.dumps(result, indent=2))
