"""``ldpstream simulate``: one driver for every mechanism family — the loop the streaming worker
runs, offline.

Per run (seeded ``numpy.random.Generator([seed, run])``) the records arrive in a random order;
the mechanism built from the same ``from_config`` as a collection's (``epsilon``,
``epsilon_scope``, ``params``) and planned for the n devices (:meth:`Mechanism.planned_for`)
randomizes them block by block: randomize → count (per version) → adapt → randomize the next
block with the new version, until every record has reported once or the mechanism stops
collecting (RRBA once every view has converged). Then for each w, ``--subsets`` attribute subsets
(seeded by ``[seed, w]``, the same in every run) are estimated with every estimator through
:meth:`Mechanism.estimate_versions` — exactly what the worker computes from the same counts —
or, for simulate-only estimators that need whole reports (LoPub's EM, RR's
``rr-adjustment-full``), :meth:`Mechanism.estimate_reports` on the accepted versions' reports.

Metrics against the dataset's own marginal (docs/mechanisms.md §7): tvd, max_abs, mae, mse,
l2_counts, jsd (on the clipped estimate); averaged over subsets, then runs (``stderr`` with
``--runs`` > 1). With w = 1 over every attribute, ``mse`` is [Corr-RR] eq. 5.

ε: ``--epsilon`` with ``--epsilon-scope attribute`` (default) gives every attribute ε, so a
record costs m·ε; ``record`` gives the whole record ε. Every row states the ε per record
computed from the channels of the versions the devices used (the largest). With rr-ind's
``--param 'memoize={rotation_s: 86400, instantaneous_epsilon: 2}'`` each record is one device's
report in one rotation period: its permanent (memoized) response followed by the instantaneous
randomization, estimated through the composed channel exactly as the collection does.

JSON: ``n``, ``m``, ``mechanism``, ``epsilon``, ``epsilon_scope``, ``epsilon_per_record``,
``parameters`` (the mechanism's scalar parameters, version 0), ``longitudinal`` (what a device's
reports cost over time, as ``/collections`` states it: ε per report, per rotation period and
per day, from :meth:`Mechanism.guarantee`), ``over_time`` (ε one device spends per default window
and per day, as ``/collections`` states it without a declared rate: bounded only when memoized;
ldpstream/privacy_windows.py) and ``results``: one row per
(variant, estimator, w) with ``metrics``, ``seconds`` (estimation, per run), ``reports``
(randomized), ``versions`` and the variant's parameters (e.g. ``block_size``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations
from math import comb
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import yaml

from ldpstream.cli import CliError
from ldpstream.datasets import ADULT_COLUMNS, Dataset, DatasetError, load_csv
from ldpstream.estimators.kernels import metrics as M
from ldpstream.estimators.kernels.proper import clip_rescale
from ldpstream.estimators.mechanism import (
    DEFAULT_MECHANISM,
    CountBook,
    Estimate,
    Mechanism,
    ParamError,
    histogram,
    mechanism_class,
    mechanism_names,
)
from ldpstream.names import DEFAULT_WINDOWS
from ldpstream.privacy_windows import window_fields
from ldpstream.suggest import did_you_mean
from ldpstream.windows import parse_window

__all__ = ["Plan", "Run", "drive", "run_of_reports", "estimate_run", "simulate", "build",
           "load_dataset", "parse_ways", "draw_subsets", "run_with_progress", "print_table", "METRICS"]

METRICS = ("tvd", "max_abs", "mae", "mse", "l2_counts", "jsd")


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
    #: None: the family's parameters fix ε (RRBA p and γ, LoPub f), else 1.0
    epsilon: float | None = 1.0
    scope: str = "attribute"
    #: the family's ``params`` (as in a collection's config)
    params: dict[str, Any] = field(default_factory=dict)
    #: parameter sets run side by side (e.g. RRBA block sizes), merged over ``params``
    variants: tuple[dict[str, Any], ...] = ({},)
    proper: bool = False
    #: options per estimator (e.g. {"ibu": {"tol": 1e-8}})
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: metric names to compute (``l2`` = Euclidean distance ‖P − Q‖₂ is available for benches)
    metrics: tuple[str, ...] = METRICS
    #: estimators whose clip-rescaled output is also scored, as rows named ``<estimator>+clip``
    also_clipped: tuple[str, ...] = ()


# --- the loop ------------------------------------------------------------------------------------

@dataclass
class Run:
    """One run of the loop: the last version, the counts per version, every version in order and
    (when kept) the reports per version."""

    mechanism: Mechanism
    counts: CountBook
    versions: list[Mechanism]
    reports: dict[int, list[np.ndarray]]
    randomized: int

    @cached_property
    def accepted_reports(self) -> np.ndarray:
        """The reports of the versions the last state accepts, concatenated."""
        parts = [r for v in self.mechanism.accepted_versions() for r in self.reports.get(v, [])]
        return np.concatenate(parts) if parts else np.zeros((0, self.mechanism.report_width))

    @property
    def epsilon(self) -> float:
        """ε per record: the largest of the versions devices reported with."""
        return max(m.epsilon for m in self.versions)


def drive(mech: Mechanism, records: np.ndarray, rng: np.random.Generator,
          marginals: Sequence[Sequence[str]], keep_reports: bool = False) -> Run:
    """randomize → count → adapt over ``records`` in a random arrival order, each block as large
    as :meth:`Mechanism.reports_until_adapt` allows; stops early once the mechanism is no longer
    :meth:`collecting <Mechanism.collecting>`."""
    order = rng.permutation(len(records))
    counts = CountBook()
    reports: dict[int, list[np.ndarray]] = {}
    versions = [mech]
    i = 0
    while i < len(order) and mech.collecting():
        k = mech.reports_until_adapt(counts) or len(order) - i
        block = records[order[i:i + k]]
        i += len(block)
        rep = mech.randomize(block, rng)
        if keep_reports:
            reports.setdefault(mech.version, []).append(rep)
        counts.add(mech.version, mech.count(rep, mech.tensors(marginals)))
        new = mech.adapt(counts)
        if new is not None:
            mech = new
            versions.append(mech)
    return Run(mech, counts, versions, reports, i)


def run_of_reports(mech: Mechanism, reports: np.ndarray,
                   marginals: Sequence[Sequence[str]]) -> Run:
    """The :class:`Run` of reports randomized elsewhere (e.g. by devices with the SDK) with
    ``mech``: counted exactly as :func:`drive` counts its own, so :func:`estimate_run` gives what
    ``simulate`` computes from them."""
    counts = CountBook()
    counts.add(mech.version, mech.count(reports, mech.tensors(marginals)))
    return Run(mech, counts, [mech], {mech.version: [reports]}, len(reports))


def build(plan: Plan, variant: Mapping[str, Any] | None = None) -> Mechanism:
    """Version 0 of the plan's mechanism, planned for the dataset's n devices."""
    cls = mechanism_class(plan.mechanism)
    try:
        mech = cls.from_config(plan.dataset.domain, {**plan.params, **(variant or {})},
                               epsilon=plan.epsilon, epsilon_scope=plan.scope)
    except ParamError as exc:
        flag = next((f for f, n in PARAM_FLAGS.items() if n == exc.field), None)
        where = f"--{flag.replace('_', '-')}" if flag else f"--param {exc.field}"
        raise CliError(f"{where}: {str(exc).split(': ', 1)[1]}") from None
    except ValueError as exc:
        raise CliError(f"--mechanism {plan.mechanism}: {exc}") from None
    return mech.planned_for(plan.dataset.n)


# --- metrics -------------------------------------------------------------------------------------

def _metric(name: str, est: np.ndarray, truth: np.ndarray, n: int) -> float:
    if name == "l2_counts":
        return M.l2_counts(est, truth, n)
    if name == "jsd":
        return M.jsd(np.clip(est, 0, None), truth)
    if name == "l2":
        return float(np.sqrt(np.square(np.asarray(est) - np.asarray(truth)).sum()))
    return {"tvd": M.tvd, "max_abs": M.max_abs, "mae": M.mae, "mse": M.mse}[name](est, truth)


def _metrics(est: np.ndarray, truth: np.ndarray, names: Sequence[str], n: int) -> dict[str, float]:
    return {k: _metric(k, est, truth, n) for k in names}


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


def _from_reports(mech: Mechanism, method: str) -> bool:
    """Whether ``method`` can be run from whole reports where counts do not serve it."""
    return method in mech.report_estimators or type(mech).estimate_reports is not \
        Mechanism.estimate_reports


def estimate_run(run: Run, attrs: tuple[str, ...], method: str,
                 options: Mapping[str, Any]) -> Estimate:
    """``simulate``'s estimate of ``attrs`` from a run: from the counts per version when the
    method serves the marginal, else from the accepted versions' whole reports."""
    mech = run.mechanism
    if mech.check_marginal(attrs, method) is None:
        return mech.estimate_versions(run.counts, attrs, method, **options)
    return mech.estimate_reports(run.accepted_reports, attrs, method, **options)


def simulate(plan: Plan, advance: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run ``plan``; returns the JSON document of ``--json``. ``advance(k)`` reports progress
    (k estimates done)."""
    ds = plan.dataset
    dom, recs = ds.domain, ds.records
    m, n = len(dom), ds.n
    subsets = {w: [tuple(dom.attrs[c] for c in s) for s in draw_subsets(m, w, plan.subsets,
                                                                         plan.seed)]
               for w in plan.ways}
    truths = {s: histogram(recs, dom.axes(s), dom.project(s).shape) / n
              for w in plan.ways for s in subsets[w]}
    marginals = sorted({s for subs in subsets.values() for s in subs})
    names = list(plan.estimators) + [f"{e}+clip" for e in plan.also_clipped
                                      if e in plan.estimators]
    results: list[dict[str, Any]] = []
    first: Mechanism | None = None
    eps_record = 0.0
    for variant in plan.variants:
        mech0 = build(plan, variant)
        first = first or mech0
        keep = any(mech0.check_marginal(s, e) is not None for e in plan.estimators
                   for s in marginals)
        acc: dict[tuple[str, int], dict[str, list[Any]]] = {
            (e, w): {"metrics": [], "seconds": [], "iterations": [], "converged": []}
            for e in names for w in plan.ways}
        reports, versions = [], []
        for r in range(plan.runs):
            run = drive(mech0, recs, np.random.default_rng([plan.seed, r]), marginals, keep)
            eps_record = max(eps_record, run.epsilon)
            reports.append(run.randomized)
            versions.append(len(run.versions))
            for w in plan.ways:
                per: dict[str, dict[str, Any]] = {e: {"metrics": [], "seconds": 0.0} for e in names}
                for s in subsets[w]:
                    for e in plan.estimators:
                        t0 = time.perf_counter()
                        opts = {"proper": plan.proper, **plan.options.get(e, {})}
                        est = estimate_run(run, s, e, opts)
                        values = est.factor.values
                        per[e]["seconds"] += time.perf_counter() - t0
                        per[e]["metrics"].append(_metrics(values, truths[s], plan.metrics, n))
                        if est.iterations is not None:
                            acc[(e, w)]["iterations"].append(est.iterations)
                        if est.converged is not None:
                            acc[(e, w)]["converged"].append(bool(est.converged))
                        if f"{e}+clip" in per:
                            per[f"{e}+clip"]["seconds"] += time.perf_counter() - t0
                            per[f"{e}+clip"]["metrics"].append(
                                _metrics(clip_rescale(values), truths[s], plan.metrics, n))
                        if advance is not None:
                            advance(1)
                for e in names:
                    a = acc[(e, w)]
                    a["metrics"].append({k: float(np.mean([x[k] for x in per[e]["metrics"]]))
                                         for k in plan.metrics})
                    a["seconds"].append(per[e]["seconds"])
        for e in names:
            for w in plan.ways:
                a = acc[(e, w)]
                row: dict[str, Any] = {
                    "mechanism": plan.mechanism, **variant, "estimator": e, "w": w,
                    "subsets": len(subsets[w]),
                    "metrics": {k: float(np.mean([x[k] for x in a["metrics"]]))
                                for k in plan.metrics},
                    "seconds": float(np.mean(a["seconds"])),
                    "reports": float(np.mean(reports)), "versions": float(np.mean(versions)),
                }
                if plan.runs > 1:
                    row["stderr"] = {k: float(np.std([x[k] for x in a["metrics"]], ddof=1)
                                              / np.sqrt(plan.runs)) for k in plan.metrics}
                if a["iterations"]:
                    row["iterations"] = float(np.mean(a["iterations"]))
                if a["converged"]:
                    row["converged_fraction"] = float(np.mean(a["converged"]))
                    if row["converged_fraction"] < 1.0:
                        row["warning"] = (
                            f"{e} did not converge on {1 - row['converged_fraction']:.0%} of "
                            f"the {w}-way estimates (their numbers are where the fit stopped)")
                results.append(row)
    assert first is not None
    params = {k: v for k, v in first.state().items()
              if isinstance(v, (int, float, str, bool)) and k not in ("mechanism", "version")}
    return {"mechanism": plan.mechanism, "n": n, "m": m, "epsilon": plan.epsilon,
            "epsilon_scope": plan.scope, "epsilon_per_record": float(eps_record),
            "parameters": params, "longitudinal": first.guarantee().to_dict(),
            "over_time": simulated_windows(first),
            "seed": plan.seed, "runs": plan.runs, "results": results}


def simulated_windows(mechanism: Mechanism) -> dict[str, Any]:
    """ε per device per default window and per day (no declared rate: docs/privacy-over-time.md)."""
    windows = [parse_window(w) for w in DEFAULT_WINDOWS]
    return window_fields(None, None, [(w.name, w.seconds) for w in windows], mechanism)


# --- command line --------------------------------------------------------------------------------

#: simulate flags that set a family parameter (flag attribute → params name)
PARAM_FLAGS = {"k": "k", "p": "p", "gamma": "gamma", "phase1_fraction": "phase1_fraction",
               "f": "f", "bloom_bits": "bits", "hashes": "hashes", "block_size": "block_size"}


def check_epsilon(value: Any) -> float:
    """``--epsilon`` as a float, or a one-line :class:`CliError` unless it is finite and > 0."""
    try:
        e = float(value)
    except (TypeError, ValueError):
        raise CliError(f"--epsilon: must be a finite number > 0, got {value!r}") from None
    if not np.isfinite(e) or e <= 0:
        raise CliError(f"--epsilon: must be a finite number > 0, got {value}")
    return e


def parse_ways(text: str, m: int) -> tuple[int, ...]:
    try:
        ways = tuple(dict.fromkeys(int(w) for w in str(text).split(",") if w.strip()))
    except ValueError:
        raise CliError(f"--ways: expected comma-separated integers, got {text!r}") from None
    if not ways:
        raise CliError("--ways: give at least one marginal size")
    bad = [w for w in ways if not 1 <= w <= m]
    if bad:
        raise CliError(f"--ways: {bad[0]} is not between 1 and the {m} columns")
    return ways


def load_dataset(data: str | None, columns: str | None, generator: str | None = None,
                 seed: int = 0) -> Dataset:
    """The records: a CSV (default: the bundled Adult and its 8 attributes) or ``--generator``."""
    if generator:
        from ldpstream.producers.synthetic import SpecError, generate, parse_spec
        if data:
            raise CliError("--generator and --data are exclusive")
        try:
            spec = parse_spec(generator)
        except SpecError as exc:
            raise CliError(f"--generator: {exc}") from None
        return generate(spec, np.random.default_rng(seed))
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
    if args.mechanism is None:
        args.mechanism = DEFAULT_MECHANISM
    if args.mechanism not in mechanism_names():
        raise CliError(f"--mechanism: unknown mechanism {args.mechanism!r}; choose one of "
                       + ", ".join(mechanism_names()))
    cls = mechanism_class(args.mechanism)
    eps = None if args.epsilon is None else check_epsilon(args.epsilon)
    if int(args.subsets) < 1:
        raise CliError(f"--subsets: must be ≥ 1, got {args.subsets}")
    if int(args.runs) < 1:
        raise CliError(f"--runs: must be ≥ 1, got {args.runs}")
    allowed = cls.estimators + cls.report_estimators
    ests = tuple(dict.fromkeys(args.estimator or cls.simulate_estimators()))
    for e in ests:
        if e not in allowed:
            raise CliError(f"--estimator: {e!r} does not apply to --mechanism {args.mechanism} "
                           f"(choose from {', '.join(allowed)}){did_you_mean(e, allowed)}")
    params = {name: getattr(args, flag) for flag, name in PARAM_FLAGS.items()
              if flag != "block_size" and getattr(args, flag, None) is not None}
    for text in getattr(args, "param", None) or ():
        name, eq, value = text.partition("=")
        if not eq or not name.strip():
            raise CliError(f"--param: expected NAME=VALUE, got {text!r}")
        params[name.strip()] = yaml.safe_load(value)
    variants = tuple({"block_size": int(b)} for b in dict.fromkeys(args.block_size or ())) or ({},)
    ds = load_dataset(args.data, args.columns, getattr(args, "generator", None), int(args.seed))
    plan = Plan(ds, args.mechanism, ests, (), int(args.subsets), int(args.seed), int(args.runs),
                eps, args.epsilon_scope, params, variants, bool(args.proper))
    mech = build(plan, variants[0])  # parameters checked before any work
    m = len(ds.domain)
    if args.ways is not None:
        plan.ways = parse_ways(args.ways, m)
        for w in plan.ways:
            for e in ests:
                why = mech.check_marginal(ds.domain.attrs[:w], e)
                if why is not None and not _from_reports(mech, e):
                    raise CliError(f"--ways: {why}")
    else:   # default: 2- and 3-way tables, one-way for families that estimate nothing else
        two = ds.domain.attrs[:2]
        plan.ways = (1,) if m < 2 or mech.check_marginal(two, ests[0]) else \
            tuple(w for w in (2, 3) if w <= m)
    return plan


def _progress_total(plan: Plan) -> int:
    m = len(plan.dataset.domain)
    return (len(plan.variants) * plan.runs * len(plan.estimators)
            * sum(min(comb(m, w), plan.subsets) for w in plan.ways))


def run_with_progress(plan: Plan, label: str = "simulate") -> dict[str, Any]:
    """:func:`simulate` with a progress bar on stderr (ldpstream/progress.py)."""
    from ldpstream.progress import progress

    with progress(label, _progress_total(plan)) as advance:
        return simulate(plan, advance)


def print_table(doc: dict[str, Any], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table
    asked = "from the parameters" if doc["epsilon"] is None else \
        f"{doc['epsilon']:g} ({doc['epsilon_scope']})"
    lon = doc.get("longitudinal") or {}
    per_window = (doc.get("over_time") or {}).get("epsilon_per_window") or {}
    memo = (f"  memoized: ε per rotation={lon['epsilon_per_rotation']:.4g}, per day="
            f"{lon['epsilon_per_day']:.4g}, per window " + ", ".join(
                f"{w}={e:.4g}" for w, e in per_window.items() if e is not None)
            ) if lon.get("memoized") else ""
    t = Table(title=title or (f"{doc['mechanism']}  n={doc['n']}  m={doc['m']}  ε={asked}  "
                              f"ε per record={doc['epsilon_per_record']:.4g}{memo}"))
    variant_keys = [k for k in doc["results"][0] if k not in (
        "mechanism", "estimator", "w", "subsets", "metrics", "seconds", "stderr", "reports",
        "versions", "iterations", "converged_fraction", "warning")] if doc["results"] else []
    cols = variant_keys + ["estimator", "w", "subsets", "tvd", "max_abs", "mae", "mse",
                           "reports", "versions", "seconds", "iterations", "converged"]
    for c in cols:
        t.add_column(c, justify="left" if c == "estimator" else "right")
    for r in doc["results"]:
        mt, se = r["metrics"], r.get("stderr")

        def cell(k: str) -> str:
            if k not in mt:
                return ""
            return f"{mt[k]:.4g}" + (f" ±{se[k]:.2g}" if se else "")
        t.add_row(*[str(r[k]) for k in variant_keys], r["estimator"], str(r["w"]),
                  str(r["subsets"]), cell("tvd"), cell("max_abs"), cell("mae"), cell("mse"),
                  f"{r['reports']:.0f}", f"{r['versions']:.0f}", f"{r['seconds']:.3f}",
                  f"{r['iterations']:.0f}" if "iterations" in r else "",
                  f"{r['converged_fraction']:.0%}" if "converged_fraction" in r else "")
    console = Console()
    if not console.is_terminal:  # piped: do not squeeze the table into 80 columns
        console = Console(width=160)
    console.print(t)
    for r in doc["results"]:
        if r.get("warning"):
            console.print(f"warning: {r['warning']}", style="yellow", markup=False)

