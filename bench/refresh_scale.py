"""``ldpstream bench refresh [--json] [--quick]``: one refresh of a wide collection, timed
against the number of marginals.

Collection: 37 attributes of 2–4 categories (seeded), ``rr-ind`` with ε = 1 per attribute, a
``generator:skewed`` population; windows ``5m, 1h, 24h, all`` holding 5k, 60k, 400k and 1M
randomized reports (``--quick``: a tenth), and for the three sliding windows the previous
non-overlapping window of the same size. Estimators ``castell, truncated, ibu``.

One refresh = the estimates of every marginal × estimator × window (4 current + 3 previous count
sets, :func:`~ldpstream.estimators.stream.many.estimate_many`) and the drift test of every marginal ×
estimator × sliding window (pooled null variances by a 32-replicate bootstrap for truncated and
ibu, closed form for castell, :func:`~ldpstream.estimators.stream.many.drift_many`). Timed for the first
50, 100, 200, 400 and 666 2-way marginals:

* ``cold_s`` — nothing cached (a worker's first refresh);
* ``steady_s`` — the following refresh: every current window has new reports, the previous
  windows are unchanged (their bucket range has not moved), so their estimates are reused;
  ``steady_cpu_s`` is its process CPU time (what the refresh costs on a machine shared with other
  work, where wall time also counts waiting for a core).

``one_at_a_time_s``: the same estimates (no drift) for the first 50 marginals through
``Mechanism.estimate`` one call each, the way a refresh ran before batching (side by side, same
run). Counting the reports is setup and not timed; the counts are read from Redis in a real
refresh, which this does not include.
"""
from __future__ import annotations

import itertools
import json
import time
from typing import Any, Mapping

import numpy as np

from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.mechanism import Mechanism
from ldpstream.estimators.stream.many import EstimateCache, drift_many, estimate_many
from ldpstream.producers.generator import Population

ATTRS = 37
EPSILON = 1.0
SEED = 0
WINDOWS = {"5m": 5_000, "1h": 60_000, "24h": 400_000, "all": 1_000_000}
SLIDING = ("5m", "1h", "24h")
METHODS = ("castell", "truncated", "ibu")
CURVE = (50, 100, 200, 400, 666)
ALPHA = 1e-3


def _setup(scale: float) -> tuple[Mechanism, list[tuple[str, ...]], dict[str, Any]]:
    rng = np.random.default_rng(SEED)
    shape = tuple(int(s) for s in rng.integers(2, 5, size=ATTRS))
    dom = Domain(tuple(f"a{i:02d}" for i in range(ATTRS)), shape)
    mech = RRIndependent(dom, epsilon=EPSILON)
    marginals = list(itertools.combinations(dom.attrs, 2))
    specs = mech.tensors(marginals)
    pop = Population(dom, "skewed", seed=SEED)

    def counts(n: int) -> Mapping[int, Mapping[str, np.ndarray]]:
        reports = mech.randomize(pop.sample(n, rng), rng)
        return {mech.version: mech.count(reports, specs)}

    sizes = {w: max(200, int(n * scale)) for w, n in WINDOWS.items()}
    data = {"current": {w: counts(n) for w, n in sizes.items()},
            "previous": {w: counts(sizes[w]) for w in SLIDING},
            "extra": counts(max(50, sizes["5m"] // 10)), "sizes": sizes}
    return mech, marginals, data


def _add(a: Mapping[int, Mapping[str, np.ndarray]], b: Mapping[int, Mapping[str, np.ndarray]]
         ) -> dict[int, dict[str, np.ndarray]]:
    return {v: {k: a[v][k] + b[v][k] for k in a[v]} for v in a}


def refresh(mech: Mechanism, marginals: list[tuple[str, ...]], current: Mapping[str, Any],
            previous: Mapping[str, Any], cache: EstimateCache | None) -> dict[str, Any]:
    """One refresh (module docstring); returns timings and counts."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    windows = dict(current)
    windows.update({f"{w}-previous": c for w, c in previous.items()})
    est = estimate_many(mech, windows, marginals, METHODS, cache=cache)
    t1 = time.perf_counter()
    prev_est = {(k[0][: -len("-previous")], k[1], k[2]): e for k, e in est.estimates.items()
                if k[0].endswith("-previous")}
    drift = drift_many(mech, {w: (current[w], previous[w]) for w in previous}, est.estimates,
                       prev_est, alpha=ALPHA, cache=cache)
    t2 = time.perf_counter()
    cpu = time.process_time() - c0
    if est.failures or drift.failures:
        raise RuntimeError(f"refresh failures: {est.failures or drift.failures}")
    return {"seconds": t2 - t0, "cpu_s": cpu, "estimate_s": t1 - t0, "drift_s": t2 - t1,
            "estimates": len(est.estimates), "estimated": est.computed,
            "drift_tests": len(drift.results), "variances": drift.computed,
            "alarms": sum(r.alarm for r in drift.results.values())}


def run(quick: bool = False) -> dict[str, Any]:
    mech, marginals, data = _setup(0.1 if quick else 1.0)
    rows = []
    for m in CURVE:
        sub = marginals[:m]
        cache = EstimateCache()
        cold = refresh(mech, sub, data["current"], data["previous"], cache)
        moved = {w: _add(c, data["extra"]) for w, c in data["current"].items()}
        steady = refresh(mech, sub, moved, data["previous"], cache)
        rows.append({"marginals": m, "cold_s": cold["seconds"], "steady_s": steady["seconds"],
                     "steady_cpu_s": steady["cpu_s"],
                     "steady_estimate_s": steady["estimate_s"], "steady_drift_s": steady["drift_s"],
                     "estimates": cold["estimates"], "drift_tests": cold["drift_tests"],
                     "steady_estimated": steady["estimated"], "alarms": cold["alarms"]})
    sub = marginals[:CURVE[0]]
    windows = dict(data["current"])
    windows.update({f"{w}-previous": c for w, c in data["previous"].items()})
    t0 = time.perf_counter()
    for counts in windows.values():
        single = next(iter(counts.values()))
        for attrs in sub:
            for method in METHODS:
                mech.estimate(single, attrs, method)
    one = time.perf_counter() - t0
    batched = refresh(mech, sub, data["current"], data["previous"], None)["estimate_s"]
    return {"attributes": ATTRS, "epsilon_per_attribute": EPSILON, "methods": list(METHODS),
            "windows": data["sizes"], "alpha": ALPHA, "curve": rows,
            "one_at_a_time_s": one, "batched_estimates_s": batched,
            "one_at_a_time_marginals": CURVE[0], "quick": quick}


def _print(doc: dict[str, Any]) -> None:
    print(f"refresh at scale: {doc['attributes']} attributes, rr-ind ε={doc['epsilon_per_attribute']}"
          f"/attribute, {', '.join(doc['methods'])}; windows (reports) {doc['windows']} + the "
          f"previous 5m/1h/24h windows; drift α={doc['alpha']}")
    print(f"{'marginals':>9} {'estimates':>9} {'drift':>6} {'cold s':>8} {'steady s':>9} "
          f"{'(estimate':>10} {'+ drift)':>9} {'steady CPU s':>12} {'re-estimated':>12}")
    for r in doc["curve"]:
        print(f"{r['marginals']:>9} {r['estimates']:>9} {r['drift_tests']:>6} {r['cold_s']:>8.2f} "
              f"{r['steady_s']:>9.2f} {r['steady_estimate_s']:>10.2f} {r['steady_drift_s']:>9.2f} "
              f"{r['steady_cpu_s']:>12.2f} {r['steady_estimated']:>12}")
    print(f"estimates of {doc['one_at_a_time_marginals']} marginals × 7 windows × 3 methods: "
          f"one Mechanism.estimate call each {doc['one_at_a_time_s']:.2f} s, batched "
          f"{doc['batched_estimates_s']:.2f} s "
          f"({doc['one_at_a_time_s'] / max(doc['batched_estimates_s'], 1e-9):.0f}× faster)")
    print("how: the tables of every window stacked per estimator and channel pair (9 groups), "
          "castell/truncated/IBU and the drift bootstraps vectorized over each stack; unchanged "
          "windows reused by digest; one bootstrap per window and marginal serves every estimator")


def main(args: Any) -> int:
    doc = run(quick=bool(getattr(args, "quick", False)))
    if getattr(args, "json", False):
        print(json.dumps(doc))
    else:
        _print(doc)
    return 0
