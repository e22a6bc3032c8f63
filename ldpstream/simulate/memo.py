"""``ldpstream simulate --memoize`` (docs/simulate.md "Memoization"): accuracy and privacy of
memoized against fresh randomization when every device reports its (unchanging) record R times
a day, at equal ε per device per day.

Every device holds one dataset record and reports it R times within one rotation period:

* **fresh** — each report randomized afresh at ε/R, so R reports cost the day's budget ε
  (sequential composition, R × the ε per report computed from the channels);
* **memoized** — one permanent response per (memo unit, value) per period, then the
  instantaneous layer (if any) on each of the R reports; the configured ε is scaled so that the
  mechanism's own :meth:`~ldpstream.estimators.mechanism.Mechanism.guarantee` states
  ``epsilon_per_day`` = the day's budget (with a daily rotation a 24 h window meets two periods,
  so the permanent channels get ε/2).

Both are estimated from all n·R reports as a collection counts them (``tvd``; the
mechanism's first ``simulate`` estimator), against the dataset's own 2-way marginals (1-way
for ``spl``; mean TVD of the clipped estimate), over ``--runs`` seeds. Without an
instantaneous layer the R copies of a memoized report are counted as R × the counts of one
(exactly what counting them gives).
Memoized rows add ``tvd_devices``: the estimate from each device's latest report only (what an
estimate that counts devices, not reports, sees): R copies of one response carry no more
information, but counted as reports they make a family's variance-weighted post-processing
(partitioned's ``consistent``) trust them R times too much.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any, Mapping, Sequence

import numpy as np
import yaml

from ldpstream.cli import CliError
from ldpstream.estimators.families.partitioned import Partitioned
from ldpstream.estimators.kernels import metrics as M
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.proper import clip_rescale
from ldpstream.estimators.mechanism import DEFAULT_MECHANISM, Mechanism, ParamError, mechanism_class, mechanism_names
from ldpstream.simulate.driver import check_epsilon, load_dataset

__all__ = ["MemoRow", "at_day_budget", "run_memo", "main"]

#: reports per device per day compared by default (the issue's benchmark)
DEFAULT_REPORTS = (1, 10, 100)
#: mechanisms compared by default
DEFAULT_MECHANISMS = (Partitioned.name, DEFAULT_MECHANISM)
#: reports randomized per block in fresh runs (bounds memory at R × n reports)
BLOCK = 200_000


@dataclass(frozen=True)
class MemoRow:
    """One (mechanism, mode, reports per device) cell: ε as the mechanism states it, and the
    mean TVD over the 2-way marginals (mean over runs, its standard error)."""

    mechanism: str
    mode: str
    reports_per_device: int
    epsilon_per_report: float
    epsilon_per_rotation: float | None
    epsilon_per_day: float
    tvd: float
    tvd_stderr: float | None
    runs: int
    tvd_devices: float | None = None


def at_day_budget(name: str, domain: Domain, budget: float, params: Mapping[str, Any],
                  memoize: Mapping[str, Any] | None, reports: int) -> tuple[Mechanism, float]:
    """The mechanism ``name`` whose device spends ``budget`` per day with ``reports`` reports,
    and that ε per day computed from its channels: fresh at ``budget / reports`` per report
    (record scope); memoized with the ε that makes its guarantee's ``per_day`` the budget."""
    cls = mechanism_class(name)
    try:
        if memoize is None:
            mech = cls.from_config(domain, dict(params), epsilon=budget / reports,
                                   epsilon_scope="record")
            return mech, reports * float(mech.epsilon)
        full = {**params, "memoize": dict(memoize)}
        probe = cls.from_config(domain, full, epsilon=budget, epsilon_scope="record")
    except ParamError as exc:
        if exc.field.startswith("memoize"):
            raise CliError(f"--memoize: {name} cannot memoize ({exc})") from None
        raise CliError(f"--param: {name}: {exc}") from None
    per_day = probe.guarantee().per_day
    if probe.memoization() is None or per_day is None:
        raise CliError(f"--memoize: {name} states no ε per day when memoized")
    mech = cls.from_config(domain, full, epsilon=budget * budget / per_day,
                           epsilon_scope="record")
    got = mech.guarantee().per_day
    assert got is not None and math.isclose(got, budget, rel_tol=1e-6), (name, got, budget)
    return mech, got


def _add(out: dict[str, np.ndarray], counts: Mapping[str, np.ndarray]) -> None:
    for k, v in counts.items():
        out[k] = out[k] + v if k in out else v


def _counts(mech: Mechanism, records: np.ndarray, reports: int, memoized: bool,
            rng: np.random.Generator, marginals: Sequence[Sequence[str]]
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """(counts of every report, counts of each device's latest report: memoized only)."""
    specs = mech.tensors(marginals)
    ids = np.arange(len(records), dtype=np.uint64)
    memo = mech.memoization() if memoized else None
    if memo is not None:
        perm = memo.responses(records, ids, 0, rng)
        if memo.rule.instantaneous_epsilon is None:   # R identical copies: R × one's counts
            one = mech.count(perm, specs)
            return {k: reports * v for k, v in one.items()}, one
        out: dict[str, np.ndarray] = {}
        latest: dict[str, np.ndarray] = {}
        step = max(1, BLOCK // reports)
        for i in range(0, len(perm), step):
            block = memo.instantaneous(np.repeat(perm[i:i + step], reports, axis=0), rng)
            _add(out, mech.count(block, specs))
            _add(latest, mech.count(block[reports - 1::reports], specs))
        return out, latest
    out = {}
    step = max(1, BLOCK // reports)
    for i in range(0, len(records), step):
        block = mech.randomize_device(np.repeat(records[i:i + step], reports, axis=0),
                                      np.repeat(ids[i:i + step], reports), rng)
        _add(out, mech.count(block, specs))
    return out, None


def _truth(records: np.ndarray, domain: Domain, w: int) -> dict[tuple[str, ...], np.ndarray]:
    """The data's own marginal of every w attributes."""
    out = {}
    for mg in combinations(domain.attrs, w):
        cols = domain.axes(mg)
        shape = tuple(domain.shape[c] for c in cols)
        flat = np.ravel_multi_index(tuple(records[:, c].astype(np.intp) for c in cols), shape)
        out[mg] = np.bincount(flat, minlength=math.prod(shape)).reshape(shape) / len(records)
    return out


def run_memo(records: np.ndarray, domain: Domain, mechanisms: Sequence[str], budget: float,
             reports: Sequence[int], runs: int, seed: int, params: Mapping[str, Mapping[str, Any]],
             memoize: Mapping[str, Any]) -> list[MemoRow]:
    """Every (mechanism, fresh | memoized, R) at ``budget`` ε per device per day: the mean TVD
    over every 2-way marginal (1-way for families that estimate nothing else)."""
    ways = {}
    for name in mechanisms:   # every family checked before any work
        mech, _ = at_day_budget(name, domain, budget, params.get(name, {}), memoize, max(reports))
        method = mechanism_class(name).simulate_estimators()[0]
        ways[name] = 2 if len(domain) >= 2 and mech.check_marginal(domain.attrs[:2],
                                                                   method) is None else 1
    truth = {w: _truth(records, domain, w) for w in set(ways.values())}
    rows = []
    for name in mechanisms:
        method = mechanism_class(name).simulate_estimators()[0]
        for r in reports:
            for mode in ("fresh", "memoized"):
                mech, per_day = at_day_budget(name, domain, budget, params.get(name, {}),
                                              memoize if mode == "memoized" else None, r)
                g = mech.guarantee()
                tvds, per_device = [], []
                for run in range(runs):
                    rng = np.random.default_rng([seed, run])   # the same draws for every R
                    counts, latest = _counts(mech, records, r, mode == "memoized", rng,
                                             list(truth[ways[name]]))
                    tvds.append(_mean_tvd(mech, counts, method, truth[ways[name]]))
                    if latest is not None:
                        per_device.append(_mean_tvd(mech, latest, method, truth[ways[name]]))
                rows.append(MemoRow(name, mode, int(r), float(mech.epsilon), g.per_rotation,
                                    per_day, float(np.mean(tvds)),
                                    float(np.std(tvds, ddof=1) / math.sqrt(runs))
                                    if runs > 1 else None, runs,
                                    float(np.mean(per_device)) if per_device else None))
    return rows


def _mean_tvd(mech: Mechanism, counts: Mapping[str, np.ndarray], method: str,
              truth: Mapping[tuple[str, ...], np.ndarray]) -> float:
    return float(np.mean([M.tvd(clip_rescale(mech.estimate(counts, mg, method).factor.values),
                                t) for mg, t in truth.items()]))


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise CliError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise CliError(f"{flag}: every value must be ≥ 1, got {text!r}")
    return out


def main(args: Any) -> int:
    """``simulate --memoize``: the comparison table (or JSON)."""
    names = tuple(dict.fromkeys(m.strip() for m in (args.memo_mechanisms
                                                    or ",".join(DEFAULT_MECHANISMS)).split(",")))
    for n in names:
        if n not in mechanism_names():
            raise CliError(f"--memo-mechanisms: unknown mechanism {n!r}; choose from "
                           f"{', '.join(mechanism_names())}")
    reports = _ints(args.reports_per_device, "--reports-per-device")
    budget = check_epsilon(args.epsilon if args.epsilon is not None else 1.0)
    memoize: dict[str, Any] = {"rotation_s": float(args.rotation_s)}
    if args.instantaneous_epsilon is not None:
        memoize["instantaneous_epsilon"] = check_epsilon(args.instantaneous_epsilon)
    params: dict[str, dict[str, Any]] = {}
    for text in getattr(args, "param", None) or ():   # NAME=VALUE, or FAMILY:NAME=VALUE
        name, eq, value = text.partition("=")
        family, colon, name = name.strip().rpartition(":") if ":" in name else ("", "", name)
        if not eq or not name.strip() or (colon and family not in names):
            raise CliError(f"--param: expected NAME=VALUE or FAMILY:NAME=VALUE with FAMILY one "
                           f"of {', '.join(names)}, got {text!r}")
        for n in ([family] if colon else names):
            params.setdefault(n, {})[name.strip()] = yaml.safe_load(value)
    ds = load_dataset(args.data, args.columns, getattr(args, "generator", None), int(args.seed))
    rows = run_memo(ds.records, ds.domain, names, budget, reports, int(args.runs),
                    int(args.seed), params, memoize)
    if args.json:
        print(json.dumps({"n": ds.n, "m": len(ds.domain), "epsilon_per_day": budget,
                          "memoize": memoize, "rows": [asdict(r) for r in rows]}))
        return 0
    print(f"n={ds.n} devices, m={len(ds.domain)}; ε per device per day = {budget:g}; memoize "
          f"{memoize}; mean TVD over every 2-way marginal (1-way where a family estimates "
          f"nothing else), {args.runs} run(s)")
    print(f"{'mechanism':<12} {'mode':<9} {'R/day':>5} {'ε/report':>9} {'ε/rotation':>10} "
          f"{'ε/day':>7} {'tvd':>8} {'± se':>8} {'tvd/dev':>8}")
    for r in rows:
        rot = "-" if r.epsilon_per_rotation is None else f"{r.epsilon_per_rotation:.4g}"
        se = "-" if r.tvd_stderr is None else f"{r.tvd_stderr:.4f}"
        dev = "-" if r.tvd_devices is None else f"{r.tvd_devices:.4f}"
        print(f"{r.mechanism:<12} {r.mode:<9} {r.reports_per_device:>5} "
              f"{r.epsilon_per_report:>9.4g} {rot:>10} {r.epsilon_per_day:>7.4g} "
              f"{r.tvd:>8.4f} {se:>8} {dev:>8}")
    return 0
