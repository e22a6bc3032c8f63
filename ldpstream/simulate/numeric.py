"""``ldpstream simulate --numeric COLS`` (docs/numeric.md "Offline: simulate"): numeric CSV columns as they
are (no binning) through a numeric family (default :data:`DEFAULT_NUMERIC_MECHANISM`), every
record one device's report; per attribute the estimated mean (with its interval), distribution,
median, p90 and p99 (with intervals) against the true data's, and the Wasserstein-1 distance
between the estimated and the true distribution.

A column is ``NAME`` (its range: the data's own min and max, which an offline run may use; a
live collection states it) or ``NAME=MIN:MAX``. ``--columns`` adds categorical columns beside
them, for a family that takes both in one report (``partitioned``: docs/numeric.md "In
partitioned marginals"; its numeric attributes' points chosen for the run's n unless
``--param bins=...``; the estimator ``--estimator``, default ``global``).

JSON: ``n``, ``mechanism``, ``epsilon`` (per attribute, as asked), ``epsilon_per_record``
(from the channels), ``runs`` and ``attributes``: per attribute ``range``, ``clipped``,
``mean_mechanism``, ``bins``, ``true`` (mean and quantiles) and the metrics averaged over runs:
``mean_error`` (|estimate − truth|, in the attribute's units), ``mean_covered`` (share of runs
whose interval held the truth), ``w1`` and ``w1_range`` (W1 divided by the range),
``w1_bound``, ``quantile_error`` (per quantile) and ``quantile_covered``; a family whose
numeric estimate is binned adds ``resolution`` (the points' spacing).
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ldpstream.cli import CliError
from ldpstream.datasets import DatasetError, adult_path, load_csv
from ldpstream.estimators.kernels import numeric as nm
from ldpstream.estimators.mechanism import (
    DEFAULT_NUMERIC_MECHANISM,
    Mechanism,
    ParamError,
    mechanism_class,
    mechanism_names,
)

__all__ = ["parse_numeric", "simulate_numeric", "main"]


def parse_numeric(text: str) -> dict[str, tuple[float, float] | None]:
    """``age,hours=0:100`` → {age: None, hours: (0, 100)}."""
    out: dict[str, tuple[float, float] | None] = {}
    for part in text.split(","):
        name, eq, rng = part.strip().partition("=")
        if not name:
            raise CliError(f"--numeric: empty column name in {text!r}")
        if not eq:
            out[name] = None
            continue
        lo, colon, hi = rng.partition(":")
        try:
            out[name] = (float(lo), float(hi))
        except ValueError:
            raise CliError(f"--numeric: {part!r}: expected NAME=MIN:MAX with numbers") from None
        if not colon or not out[name][0] < out[name][1]:  # type: ignore[index]  # set above
            raise CliError(f"--numeric: {part!r}: expected NAME=MIN:MAX with MIN < MAX")
    return out


def simulate_numeric(values: dict[str, np.ndarray], mech: Mechanism, records: np.ndarray,
                     clipped: dict[str, int], runs: int, seed: int,
                     method: str = "distribution") -> dict[str, Any]:
    """Randomize every record ``runs`` times (seeded ``[seed, run]``) and score the estimates of
    every numeric attribute (``method``; sw-hm's mean by ``mean``) against ``values`` (the
    columns as read). A memoized ``mech`` (``--param memoize=...``): each record is a device
    of a new fleet per run, its permanent response (α-point rounding with its own α) then the
    instantaneous layer, counted once as the worker counts it."""
    from ldpstream.estimators.families.numeric import QUANTILES
    attrs = mech.domain.numeric_attrs()
    per: dict[str, dict[str, list[Any]]] = {a: {} for a in attrs}
    info: dict[str, dict[str, Any]] = {}
    memo = mech.memoization()
    for run in range(runs):
        rng = np.random.default_rng([seed, run])
        if memo is None:
            reports = mech.randomize(records, rng)
        else:   # each record a device of a new fleet (its α, its assignment), counted once
            ids = np.arange(len(records), dtype=np.uint64) + np.uint64(run * len(records))
            reports = memo.instantaneous(memo.responses(records, ids, 0, rng), rng)
        counts = mech.count(reports, mech.tensors([(a,) for a in attrs]))
        for a in attrs:
            lo, hi = mech.domain.numeric_range(a) or (0.0, 1.0)
            x = np.clip(values[a], lo, hi)      # the estimand: the data clipped into the range
            truth_q = np.quantile(x, QUANTILES)
            got = per[a]
            if "mean" in mech.estimators:
                em = mech.estimate(counts, (a,), "mean")
                got.setdefault("mean_error", []).append(abs(em.extra["mean"] - x.mean()))
                got.setdefault("mean_covered", []).append(
                    em.extra["mean_low"] <= x.mean() <= em.extra["mean_high"])
                info.setdefault(a, {})["mean_mechanism"] = em.extra["mechanism"]
            ed = mech.estimate(counts, (a,), method)
            if "mean_low" in ed.extra:   # a distribution that carries its mean's interval
                got.setdefault("mean_error", []).append(abs(ed.extra["mean"] - x.mean()))
                got.setdefault("mean_covered", []).append(
                    ed.extra["mean_low"] <= x.mean() <= ed.extra["mean_high"])
            # the histogram's equal bins span the CDF's points (the range, or wider: binned)
            a0, a1 = ed.extra["cdf_at"][0], ed.extra["cdf_at"][-1]
            w1 = nm.w1_samples(np.asarray(ed.extra["histogram"]), (x - a0) / (a1 - a0)) \
                * (a1 - a0)
            got.setdefault("w1", []).append(w1)
            got.setdefault("w1_bound", []).append(ed.extra["w1_bound"])
            got.setdefault("w1_covered", []).append(w1 <= ed.extra["w1_bound"])
            qs = list(ed.extra["quantiles"].values())
            got.setdefault("quantile_error", []).append(
                [abs(q[0] - t) for q, t in zip(qs, truth_q)])
            got.setdefault("quantile_covered", []).append(
                [q[1] <= t <= q[2] for q, t in zip(qs, truth_q)])
            info.setdefault(a, {}).update(
                bins=ed.extra["bins"], range=[lo, hi], clipped=clipped.get(a, 0),
                **({"resolution": ed.extra["resolution"]} if "resolution" in ed.extra else {}),
                true={"mean": float(x.mean()),
                      **{f"q{p:g}": float(t) for p, t in zip(QUANTILES, truth_q)}})
    out = {}
    for a in attrs:
        doc = dict(info[a])
        for k, v in per[a].items():
            arr = np.asarray(v, dtype=float)
            doc[k] = arr.mean(axis=0).tolist() if arr.ndim > 1 else float(arr.mean())
        if "quantile_error" in doc:
            doc["quantile_error"] = dict(zip((f"q{p:g}" for p in QUANTILES),
                                             doc["quantile_error"]))
            doc["quantile_covered"] = dict(zip((f"q{p:g}" for p in QUANTILES),
                                               doc["quantile_covered"]))
        doc["w1_range"] = doc["w1"] / (doc["range"][1] - doc["range"][0])
        out[a] = doc
    return out


def main(args: Any) -> int:
    name = DEFAULT_NUMERIC_MECHANISM if args.mechanism is None else args.mechanism
    if name not in mechanism_names():
        raise CliError(f"--mechanism: unknown mechanism {name!r}")
    cls = mechanism_class(name)
    if not cls.numeric:
        raise CliError(f"--mechanism: {name} randomizes categories; --numeric needs a family "
                       f"for numeric attributes (e.g. {DEFAULT_NUMERIC_MECHANISM})")
    if int(args.runs) < 1:
        raise CliError(f"--runs: must be ≥ 1, got {args.runs}")
    if getattr(args, "memoize", False):
        raise CliError("--memoize compares categorical columns; with --numeric memoize the "
                       "collection itself: --param 'memoize={rotation_s: 86400}'")
    cols = parse_numeric(args.numeric)
    extra = [c.strip() for c in (args.columns or "").split(",") if c.strip()]
    if extra and "mean" in cls.estimators:
        raise CliError(f"--columns: {name} reports numeric columns alone here; categorical "
                       f"columns beside them need a family that reports them together "
                       f"(partitioned)")
    method = "distribution"
    if "distribution" not in cls.estimators:
        method = (args.estimator or cls.simulate_estimators())[0]
        if method not in cls.estimators:
            raise CliError(f"--estimator: {name} has no estimator {method!r} (known: "
                           f"{', '.join(cls.estimators)})")
    try:
        ds = load_csv(args.data or adult_path(), list(cols) + extra, numeric=cols)
    except DatasetError as exc:
        raise CliError(str(exc).replace("\n", " ")) from None
    params: dict[str, Any] = {}
    for text in getattr(args, "param", None) or ():
        k, eq, v = text.partition("=")
        if not eq or not k.strip():
            raise CliError(f"--param: expected NAME=VALUE, got {text!r}")
        import yaml
        params[k.strip()] = yaml.safe_load(v)
    try:
        mech = cls.from_config(ds.domain, params, epsilon=args.epsilon,  # None: the default
                               epsilon_scope=args.epsilon_scope).planned_for(ds.n)
    except ParamError as exc:
        raise CliError(f"--param {exc}") from None
    except ValueError as exc:   # a collection the family cannot build (e.g. its report codes)
        raise CliError(f"--mechanism {name}: {exc}") from None
    attrs = simulate_numeric(dict(ds.values), mech, np.asarray(ds.records, dtype=np.int64),
                             dict(ds.clipped), int(args.runs), int(args.seed), method)
    doc = {"n": ds.n, "mechanism": name, "estimator": method, "epsilon": args.epsilon,
           "epsilon_scope": args.epsilon_scope, "epsilon_per_record": mech.epsilon,
           "runs": int(args.runs), "attributes": attrs}
    if args.json:
        print(json.dumps(doc))
    else:
        print_numeric(doc)
    return 0


def print_numeric(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"{doc['mechanism']}: n={doc['n']:,}, ε per record "
                    f"{doc['epsilon_per_record']:.4g}, {doc['runs']} run(s)")
    for col in ("attribute", "range (clipped)", "mean: true / error (covered)", "W1 (÷ range)",
                "W1 bound", "median / p90 / p99 error (covered)", "bins"):
        t.add_column(col)
    for a, d in doc["attributes"].items():
        qe, qc = d["quantile_error"], d["quantile_covered"]
        t.add_row(a, f"{d['range'][0]:g}..{d['range'][1]:g} ({d['clipped']})",
                  f"{d['true']['mean']:.4g} / {d.get('mean_error', float('nan')):.3g} "
                  f"({d.get('mean_covered', float('nan')):.0%}, {d.get('mean_mechanism', '-')})",
                  f"{d['w1']:.3g} ({d['w1_range']:.4f})", f"{d['w1_bound']:.3g}",
                  " / ".join(f"{qe[k]:.3g}" for k in qe) + " ("
                  + " / ".join(f"{qc[k]:.0%}" for k in qc) + ")", str(d["bins"]))
    Console(width=200).print(t)
