"""``ldpstream simulate`` for the RR family (rr-ind, rr-joint, rr-clusters): offline paper
reproduction on a CSV (default: the bundled UCI Adult and its 8 attributes).

Per run (seeded ``numpy.random.Generator([seed, run])``) the records are randomized once; for each
w, ``--subsets`` attribute subsets are drawn (seeded by ``[seed, w]``, the same in every run and
for every estimator); each subset's randomized counts go through every estimator, and the metrics
(MECHANISMS.md §7: tvd, max_abs, mae, mse) against the true marginal are averaged over subsets,
then over runs (JSON adds standard errors when ``--runs`` > 1).

ε: ``--epsilon-scope attribute`` gives every attribute ε; ``record`` gives each of the m
attributes ε/m. ``epsilon_per_record`` is computed from the channels (sequential composition),
never echoed. rr-joint uses ε_C = Σ ε_A over all m attributes; rr-clusters uses ε_C per cluster.

rr-clusters needs the clusters of [MDRR] Alg. 1 before anyone reports with them: a random
``--phase1-fraction`` (default 0.1) of the users report once with RR-Independent (same per-record
ε); their randomized data are only used for the dependence measures; the other users report once
with RR-Clusters and only their reports are used for estimation. Every user reports once, so the
ε per user is the ε of one report. Thresholds: T_v = 1000 cells, T_d = 0.1 (Cramér's V on the
randomized data).

Every estimator the mechanism offers goes through ``mech.estimate`` on the subset's count table,
exactly what the streaming server computes from the same reports. That includes rr-adjustment
([MDRR] Alg. 2 on the distinct randomized patterns of the w-way table). ``rr-adjustment-full``
(simulate only: a server keeps w-way tables, not whole records) is Alg. 2 as the paper runs it on
full records: one raking per run over the distinct randomized patterns of all m attributes
(targets: clip-rescaled 1-way RR-Independent estimates, or for rr-clusters the clip-rescaled
cluster joints); each subset's estimate is the sum of pattern weights. Its ``seconds`` include
that raking once per w row.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from itertools import combinations
from math import comb
from typing import Any, Callable, Sequence

import numpy as np

from ..cli import CliError
from ..datasets import ADULT_COLUMNS, Dataset, DatasetError, load_csv
from ..estimators import metrics as M
from ..estimators.mechanism import histogram
from ..estimators.proper import clip_rescale
from ..estimators.rr_adjustment import adjusted_marginal, distinct_patterns, rr_adjustment
from ..estimators.proper import repair
from ..estimators.rr_ind import RRClusters, RRIndependent, RRJoint
from ..estimators.rr_joint import estimate_joint
from . import check_epsilon

MECHS = {"rr-ind": RRIndependent, "rr-joint": RRJoint, "rr-clusters": RRClusters}
DEFAULT_ESTIMATORS = {"rr-ind": ("castell", "truncated", "ibu"),
                      "rr-joint": ("castell", "ibu"),
                      "rr-clusters": ("rr-independent", "castell", "ibu")}
#: simulate-only estimators (need whole randomized records), per mechanism
FULL_RECORD = {"rr-ind": ("rr-adjustment-full",), "rr-clusters": ("rr-adjustment-full",),
               "rr-joint": ()}
ITERATIVE = ("ibu", "rr-adjustment", "rr-adjustment-full")
METRICS = ("tvd", "max_abs", "mae", "mse")
CLUSTER_MAX_CELLS = 1000
CLUSTER_MIN_DEPENDENCE = 0.1


@dataclass
class Plan:
    """Everything one simulation needs (validated)."""

    dataset: Dataset
    mechanism: str
    estimators: tuple[str, ...]
    ways: tuple[int, ...]
    subsets: int
    seed: int = 0
    runs: int = 1
    epsilon: float = 1.0
    scope: str = "attribute"
    proper: bool = False
    phase1_fraction: float = 0.1
    ibu_options: dict[str, Any] = field(default_factory=dict)
    #: metric names to compute (``l2`` = Euclidean distance ‖P − Q‖₂ is available for benches)
    metrics: tuple[str, ...] = METRICS
    #: estimators whose clip-rescaled output is also scored, as rows named ``<estimator>+clip``
    also_clipped: tuple[str, ...] = ()


# --- validation ---------------------------------------------------------------------------------

#: ``--epsilon`` when not given (per attribute or per record, by ``--epsilon-scope``)
DEFAULT_EPSILON = 1.0


def parse_ways(text: str, m: int) -> tuple[int, ...]:
    try:
        ways = tuple(int(w) for w in str(text).split(",") if w.strip())
    except ValueError:
        raise CliError(f"--ways: expected comma-separated integers, got {text!r}") from None
    if not ways:
        raise CliError("--ways: give at least one marginal size")
    bad = [w for w in ways if not 1 <= w <= m]
    if bad:
        raise CliError(f"--ways: {bad[0]} is not between 1 and the {m} columns")
    return ways


def load_dataset(data: str | None, columns: str | None) -> Dataset:
    cols = None
    if columns is not None:
        cols = [c.strip() for c in columns.split(",")]
        if not cols or any(not c for c in cols):
            raise CliError(f"--columns: empty column name in {columns!r}")
    elif data is None:
        cols = list(ADULT_COLUMNS)
    try:
        return load_csv(data, cols)
    except DatasetError as exc:
        raise CliError(str(exc).replace("\n", " ")) from None


def plan_from_args(args: Any) -> Plan:
    if getattr(args, "generator", None):
        raise CliError(f"--generator: the rr family reads CSV data (--data); got "
                       f"--generator {args.generator!r}")
    if args.mechanism not in MECHS:
        raise CliError(f"--mechanism: {args.mechanism!r} is not in the rr family "
                       f"({', '.join(MECHS)})")
    eps = check_epsilon(DEFAULT_EPSILON if args.epsilon is None else args.epsilon)
    if int(args.subsets) < 1:
        raise CliError(f"--subsets: must be ≥ 1, got {args.subsets}")
    if int(args.runs) < 1:
        raise CliError(f"--runs: must be ≥ 1, got {args.runs}")
    cls = MECHS[args.mechanism]
    ests = tuple(args.estimator) if args.estimator else DEFAULT_ESTIMATORS[args.mechanism]
    allowed = cls.estimators + FULL_RECORD[args.mechanism]
    for e in ests:
        if e not in allowed:
            raise CliError(f"--estimator: {e!r} does not apply to --mechanism {args.mechanism} "
                           f"(choose from {', '.join(allowed)})")
    ests = tuple(dict.fromkeys(ests))
    beta = float(getattr(args, "phase1_fraction", 0.1))
    if args.mechanism == "rr-clusters" and not 0 < beta < 1:
        raise CliError(f"--phase1-fraction: must be in (0, 1) for rr-clusters, got {beta}")
    ds = load_dataset(args.data, args.columns)
    if args.mechanism == "rr-joint" and float(np.prod([float(s) for s in ds.domain.shape])) > 2 ** 62:
        raise CliError(f"--mechanism rr-joint: the product of the {len(ds.domain)} columns' "
                       "domains is too large for one GRR")
    return Plan(ds, args.mechanism, ests, parse_ways(args.ways, len(ds.domain)),
                int(args.subsets), int(args.seed), int(args.runs), eps, args.epsilon_scope,
                bool(args.proper), beta)


# --- simulation ---------------------------------------------------------------------------------

def draw_subsets(m: int, w: int, k: int, seed: int) -> list[tuple[int, ...]]:
    """``k`` distinct w-subsets of range(m) (all of them if there are fewer), seeded."""
    total = comb(m, w)
    if total <= k:
        return [tuple(c) for c in combinations(range(m), w)]
    rng = np.random.default_rng([seed, w])
    seen: dict[tuple[int, ...], None] = {}
    while len(seen) < k:
        seen.setdefault(tuple(sorted(rng.choice(m, size=w, replace=False).tolist())), None)
    return list(seen)


def _randomize(plan: Plan, rng: np.random.Generator):
    """Build the mechanism, randomize, and return (mechanism, reports, ε per record)."""
    dom = plan.dataset.domain
    recs = plan.dataset.records
    m = len(dom)
    eps = plan.epsilon if plan.scope == "attribute" else plan.epsilon / m
    if plan.mechanism == "rr-clusters":
        perm = rng.permutation(len(recs))
        k = max(1, int(round(plan.phase1_fraction * len(recs))))
        ind = RRIndependent(dom, eps)
        y1 = ind.randomize(recs[perm[:k]], rng)
        mech = RRClusters.from_randomized(dom, y1, eps, max_cells=CLUSTER_MAX_CELLS,
                                          min_dependence=CLUSTER_MIN_DEPENDENCE)
        reports = mech.randomize(recs[perm[k:]], rng)
        return mech, reports, max(ind.epsilon, mech.epsilon)
    mech = MECHS[plan.mechanism](dom, eps)
    return mech, mech.randomize(recs, rng), mech.epsilon


def _adjustment(mech, reports: np.ndarray):
    """``rr-adjustment-full``: Alg. 2 once over all m attributes of the randomized records:
    (patterns, weights, iterations, converged)."""
    shape = mech.domain.shape
    patterns, counts, _ = distinct_patterns(reports, shape)
    targets: list = []
    if isinstance(mech, RRIndependent):
        from ..estimators.castell import castell
        for j, P in enumerate(mech.channels):
            targets.append(clip_rescale(castell(np.bincount(reports[:, j], minlength=shape[j]),
                                                [P])))
    else:
        for cols, (p, q) in zip(mech._cols, mech._pq):
            sub = tuple(shape[c] for c in cols)
            targets.append((tuple(cols), clip_rescale(estimate_joint(
                histogram(reports, cols, sub), p, q))))
    res = rr_adjustment(patterns, counts, targets)
    return patterns, res.weights, res.iterations, res.converged


_METRIC_FUNCS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "tvd": M.tvd, "max_abs": M.max_abs, "mae": M.mae, "mse": M.mse,
    "l2": lambda p, q: float(np.sqrt(np.square(np.asarray(p) - np.asarray(q)).sum())),
}


def _metrics(est: np.ndarray, truth: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    return {k: _METRIC_FUNCS[k](est, truth) for k in names}


def simulate(plan: Plan, advance: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run ``plan``; returns the JSON document of ``--json``. ``advance(k)`` reports progress
    (k estimates done)."""
    ds = plan.dataset
    dom, recs = ds.domain, ds.records
    m, n = len(dom), ds.n
    subsets = {w: draw_subsets(m, w, plan.subsets, plan.seed) for w in plan.ways}
    truths = {(w, s): histogram(recs, s, [dom.shape[c] for c in s]) / n
              for w in plan.ways for s in subsets[w]}
    names = list(plan.estimators) + [f"{e}+clip" for e in plan.also_clipped
                                      if e in plan.estimators]
    # acc[(row name, w)] -> per-run metric means, seconds, iterations, converged flags
    acc: dict[tuple[str, int], dict[str, list]] = {
        (e, w): {"metrics": [], "seconds": [], "iterations": [], "converged": []}
        for e in names for w in plan.ways}
    eps_record = None
    for run in range(plan.runs):
        rng = np.random.default_rng([plan.seed, run])
        mech, reports, eps_rec = _randomize(plan, rng)
        eps_record = eps_rec
        adj = None
        adj_seconds = 0.0
        if "rr-adjustment-full" in plan.estimators:
            t0 = time.perf_counter()
            adj = _adjustment(mech, reports)
            adj_seconds = time.perf_counter() - t0
        for w in plan.ways:
            per = {e: {"metrics": [], "seconds": 0.0, "iterations": [], "converged": []}
                   for e in names}
            for s in subsets[w]:
                attrs = tuple(dom.attrs[c] for c in s)
                shape = [dom.shape[c] for c in s]
                counts = mech.count(reports, mech.tensors([attrs]))
                truth = truths[(w, s)]
                for e in plan.estimators:
                    t0 = time.perf_counter()
                    if e == "rr-adjustment-full":
                        patterns, weights, iters, conv = adj  # type: ignore[misc]
                        values = repair(adjusted_marginal(patterns, weights, s, shape),
                                              plan.proper)
                    else:
                        opts = dict(plan.ibu_options) if e == "ibu" else {}
                        est = mech.estimate(counts, attrs, e, proper=plan.proper, **opts)
                        values = est.factor.values
                        iters, conv = est.iterations, est.converged
                    per[e]["seconds"] += time.perf_counter() - t0
                    per[e]["metrics"].append(_metrics(values, truth, plan.metrics))
                    if e in ITERATIVE:
                        per[e]["iterations"].append(iters)
                        per[e]["converged"].append(bool(conv))
                    if f"{e}+clip" in per:
                        clipped = per[f"{e}+clip"]
                        clipped["seconds"] += time.perf_counter() - t0
                        clipped["metrics"].append(_metrics(clip_rescale(values), truth,
                                                           plan.metrics))
                    if advance is not None:
                        advance(1)
            for e in names:
                a = acc[(e, w)]
                a["metrics"].append({k: float(np.mean([x[k] for x in per[e]["metrics"]]))
                                     for k in plan.metrics})
                a["seconds"].append(per[e]["seconds"] + (adj_seconds if e == "rr-adjustment-full"
                                                         else 0.0))
                a["iterations"].extend(per[e]["iterations"])
                a["converged"].extend(per[e]["converged"])
    results = []
    for e in names:
        for w in plan.ways:
            a = acc[(e, w)]
            row: dict[str, Any] = {
                "mechanism": plan.mechanism, "estimator": e, "w": w,
                "subsets": len(subsets[w]),
                "metrics": {k: float(np.mean([r[k] for r in a["metrics"]])) for k in plan.metrics},
                "seconds": float(np.mean(a["seconds"])),
            }
            if plan.runs > 1:
                row["stderr"] = {k: float(np.std([r[k] for r in a["metrics"]], ddof=1)
                                          / np.sqrt(plan.runs)) for k in plan.metrics}
            if e in ITERATIVE:
                row["iterations"] = float(np.mean(a["iterations"]))
                row["converged_fraction"] = float(np.mean(a["converged"]))
            results.append(row)
    return {"n": n, "m": m, "epsilon": plan.epsilon, "epsilon_scope": plan.scope,
            "epsilon_per_record": float(eps_record), "results": results}


# --- output -------------------------------------------------------------------------------------

def _progress_total(plan: Plan) -> int:
    m = len(plan.dataset.domain)
    return plan.runs * len(plan.estimators) * sum(min(comb(m, w), plan.subsets) for w in plan.ways)


def run_with_progress(plan: Plan, label: str = "simulate") -> dict[str, Any]:
    """:func:`simulate` with a rich progress bar on stderr when stderr is a terminal."""
    if not sys.stderr.isatty():
        return simulate(plan)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TimeElapsedColumn, TimeRemainingColumn
    with Progress("[progress.description]{task.description}", BarColumn(),
                  "{task.completed}/{task.total}", TimeElapsedColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task(label, total=_progress_total(plan))
        return simulate(plan, lambda k: prog.advance(task, k))


def print_table(doc: dict[str, Any], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=title or (f"n={doc['n']}  m={doc['m']}  ε={doc['epsilon']:g} "
                              f"({doc['epsilon_scope']})  ε per record="
                              f"{doc['epsilon_per_record']:.4g}"))
    for c in ("mechanism", "estimator", "w", "subsets", "tvd", "max_abs", "mae", "mse",
              "seconds", "iterations", "converged"):
        t.add_column(c, justify="left" if c in ("mechanism", "estimator") else "right")
    for r in doc["results"]:
        mt = r["metrics"]
        se = r.get("stderr")
        cell = (lambda k: f"{mt[k]:.4g}" + (f" ±{se[k]:.2g}" if se else ""))
        t.add_row(r["mechanism"], r["estimator"], str(r["w"]), str(r["subsets"]),
                  cell("tvd"), cell("max_abs"), f"{mt['mae']:.3g}", f"{mt['mse']:.3g}",
                  f"{r['seconds']:.3f}",
                  f"{r['iterations']:.0f}" if "iterations" in r else "",
                  f"{r['converged_fraction']:.0%}" if "converged_fraction" in r else "")
    console = Console()
    if not console.is_terminal:  # piped: do not squeeze the table into 80 columns
        console = Console(width=160)
    console.print(t)


def main(args: Any) -> int:
    plan = plan_from_args(args)
    doc = run_with_progress(plan)
    if args.json:
        print(json.dumps(doc))
    else:
        print_table(doc)
    return 0
