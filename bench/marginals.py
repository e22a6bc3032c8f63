"""``ldpstream bench marginals``: 2-way and 3-way marginal accuracy of the ``partitioned``
mechanism against RR-Independent with the per-record budget split over the attributes (rr-ind,
ε/m per attribute; castell and IBU), side by side in one run.

Datasets: UCI Adult (8 categorical attributes, 32,561 records), seeded 50,000-record samples
of the bundled Bayesian network (``survey.bif``, 6 attributes) and of three generated
7-attribute networks of different structure, domain sizes and skew
(:func:`~ldpstream.bngen.shape_network`: chain-skewed, dag-dense, dag-weak). Every dataset is
a sample from a population — the network's exact joint distribution, or Adult's 32,561 records
(resampled with replacement, seeded) — and every TVD is measured against the population's
marginal. ε per record ∈ {0.5, 1, 2, 4, 8}; mean TVD over every pair and over 20 triples (all
of them for the bundled network; 20 seeded ones otherwise); 3 seeds per cell (per seed, each
mechanism randomizes every record once).

Columns: ``split`` = best of castell / IBU on rr-ind (mean over pairs, per estimator, then the
better one); ``ways=2`` / ``ways=3`` = partitioned collecting every pair / every triple, its
``consistent`` estimate (consistency + shrinkage + Norm-Sub; a 3-way from pairs by maximum
entropy), with ``calm`` (no shrinkage) alongside; ``floor`` = the same at ε = 50 (noise below
1e-20: only the sampling of which users report which marginal); ``auto`` = partitioned with
``ways: auto`` (:func:`~ldpstream.estimators.families.partitioned.choose_ways` from n, the attribute
sizes and ε; its numbers are those of the column it picks, same seeds). ``×`` = split /
partitioned; the target is ≥ 1.3 at every ε ≤ 8, and partitioned within 1.2× of its floor at
ε = 8 (reported for the auto column). ``sampling`` = the non-private empirical marginals of the
same records (the sampling floor: no mechanism does better on average). ``pgm`` = Private-PGM
(``mbi``, optional: bench/pgm.py) fed the measurements of the auto column, on every network
(Adult's full domain of 1.8 million cells is too large for its dense junction tree here);
``pgm×`` = pgm / auto (≥ 1: we match or beat it). ``global`` = the ``global`` estimator on the
auto column's collection (one distribution fitted to every measured marginal, stopped by SURE,
or the consistent tables where their SURE is smaller; estimators/kernels/global_fit.py), with
its own ratios to split, the sampling floor and Private-PGM.

Held-out runs (bench/heldout.py; docs/benchmarks.md "Held-out accuracy"): ``--data CSV``
(``--columns``), ``--bif FILE`` or ``--generate K --seed S`` (K fresh random networks with
skewed, near-deterministic and dense conditional tables) measure the default estimator against
Private-PGM on the same counts, every choice frozen from the shape before the data is seen
(``ways: auto`` from n, the attribute sizes and ε), with its cost per refresh over
``consistent``'s; ``--epsilons`` and ``--runs`` set the grid. With ``--bounds`` the same
datasets measure the default estimator's error bounds instead, the proxy beside the bootstrap of
the served estimator: coverage, width and cost (bench/heldout_bounds.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from typing import Any, Callable

import numpy as np

from ldpstream.bn import BayesNet, read_bif, survey_path
from ldpstream.bngen import shape_network
from ldpstream.datasets import load_csv
from ldpstream.estimators.families.partitioned import Partitioned, choose_ways
from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels.castell import castell
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.ibu import ibu
from ldpstream.estimators.kernels.metrics import tvd
from ldpstream.estimators.mechanism import histogram
from ldpstream.progress import progress

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
FLOOR_EPSILON = 50.0
SEEDS = (0, 1, 2)
TRIPLES = 20
BN_N = 50_000
#: the generated networks (ldpstream/bngen.py SHAPES) and their number of attributes
GENERATED = ("chain-skewed", "dag-dense", "dag-weak")
GENERATED_M = 7
#: partitioned collects every pair, or every triple (the 3-way targets then come directly);
#: ``ways: auto`` may choose a larger size (up to the whole record), measured as its own column
WAYS = (2, 3)


def _truth(records: np.ndarray, domain: Domain, attrs: tuple[str, ...]) -> np.ndarray:
    cols = domain.axes(attrs)
    t = histogram(records, cols, [domain.shape[c] for c in cols]).astype(float)
    return t / t.sum()


def _triples(domain: Domain, k: int, seed: int = 0) -> list[tuple[str, ...]]:
    allt = list(itertools.combinations(domain.attrs, 3))
    if len(allt) <= k:
        return allt
    rng = np.random.default_rng([seed, 3])
    return [allt[i] for i in sorted(rng.choice(len(allt), size=k, replace=False))]


def true_structure_fit(net: BayesNet, mech: Partitioned, counts) -> Factor:
    """The network's own factorization Π_v P(v | parents(v)) with every family's marginal
    taken from the ``consistent`` estimate (projected from a collected table that holds it, else
    that estimator's reconstruction): what an estimator that knew the true structure could
    serve from the same reports. A reference, not an estimator: real data has no known
    network."""
    tables = mech.consistent_tables(counts)[0]
    cpt = {}
    for v in net.variables:
        fam = tuple(net.parents[v]) + (v,)   # the CPT's axis order: parents, then v
        held = [t for t in tables if set(fam) <= set(t.domain.attrs)]
        f = (held[0] if held else mech.estimate(counts, fam, "consistent").factor).project(fam)
        fv = np.clip(f.values, 1e-12, None)
        cpt[v] = fv / fv.sum(axis=-1, keepdims=True)
    p = dataclasses.replace(net, cpt=cpt).joint()
    return Factor(mech.domain, p / p.sum())


def _partitioned(domain: Domain, records: np.ndarray, eps: float, seed: int,
                 pairs, triples, truth, ways: int, pgm: bool = False,
                 glob: bool = False, net: BayesNet | None = None) -> dict[str, float]:
    mech = Partitioned(domain, eps, ways=ways)
    counts = mech.count(mech.randomize(records, np.random.default_rng([seed, 1])),
                        mech.tensors())

    def err(sets, method):
        return float(np.mean([tvd(mech.estimate(counts, a, method).factor.values, truth[a])
                              for a in sets]))

    out = {"2way": err(pairs, "consistent"), "3way": err(triples, "consistent"),
           "2way_calm": err(pairs, "calm"), "3way_calm": err(triples, "calm")}
    if net is not None:
        fit = true_structure_fit(net, mech, counts)
        for w, sets in (("2way", pairs), ("3way", triples)):
            out[f"{w}_oracle"] = float(np.mean([tvd(fit.project(a).values, truth[a])
                                                for a in sets]))
    if glob:
        out.update({"2way_global": err(pairs, "global"), "3way_global": err(triples, "global"),
                    "global_chosen": float(mech.global_table(counts)[1]["chosen"] == "global")})
    if pgm:
        from ldpstream.bench.pgm import pgm_marginals
        est = pgm_marginals(mech, counts, pairs + triples)
        for w, sets in (("2way", pairs), ("3way", triples)):
            out[f"{w}_pgm"] = float(np.mean([tvd(est[a], truth[a]) for a in sets]))
    return out


def _split(domain: Domain, records: np.ndarray, eps: float, seed: int, pairs, triples,
           truth) -> dict[str, float]:
    mech = RRIndependent(domain, epsilon=eps / len(domain))
    rep = mech.randomize(records, np.random.default_rng([seed, 2]))
    out: dict[str, float] = {}
    for w, sets in (("2way", pairs), ("3way", triples)):
        for est in ("castell", "ibu"):
            errs = []
            for a in sets:
                cols = domain.axes(a)
                c = histogram(rep, cols, [domain.shape[i] for i in cols]).astype(float)
                P = mech.channels_of(a)
                e = castell(c, P) if est == "castell" else ibu(c, P).estimate
                errs.append(tvd(e, truth[a]))
            out[f"{w}_{est}"] = float(np.mean(errs))
        out[w] = min(out[f"{w}_castell"], out[f"{w}_ibu"])
    return out


def run_dataset(name: str, domain: Domain, records: np.ndarray, epsilons=EPSILONS,
                seeds=SEEDS, verbose: bool = True, population: np.ndarray | None = None,
                pgm: bool = False, advance: Callable[[int], None] | None = None,
                net: BayesNet | None = None) -> list[dict[str, Any]]:
    """``population``: the joint distribution the records were drawn from (the truth; default:
    the records' own marginals, then the sampling floor is 0). ``pgm``: add the Private-PGM
    column (needs ``mbi``). ``advance``: called once per ε done (a progress bar). ``net``: the
    network the records were sampled from; adds the ``oracle`` column
    (:func:`true_structure_fit` on the auto column's collection)."""
    pairs = list(itertools.combinations(domain.attrs, 2))
    triples = _triples(domain, TRIPLES)
    empirical = {a: _truth(records, domain, a) for a in pairs + triples}
    truth = empirical if population is None else {
        a: Factor(domain, population).project(a).values for a in pairs + triples}
    sampling = {w: float(np.mean([tvd(empirical[a], truth[a]) for a in sets]))
                for w, sets in (("2way", pairs), ("3way", triples))}
    floors: dict[int, list[dict[str, float]]] = {}

    def floor(k: int) -> list[dict[str, float]]:
        if k not in floors:
            floors[k] = [_partitioned(domain, records, FLOOR_EPSILON, s, pairs, triples, truth, k)
                         for s in seeds]
        return floors[k]

    rows = []
    for eps in epsilons:
        t0 = time.perf_counter()
        split = [_split(domain, records, eps, s, pairs, triples, truth) for s in seeds]
        row: dict[str, Any] = {"dataset": name, "n": int(len(records)), "epsilon": eps,
                               "pairs": len(pairs), "triples": len(triples),
                               "seeds": len(seeds)}
        for w in ("2way", "3way"):
            for est in ("castell", "ibu"):
                row[f"{w}_split_{est}"] = float(np.mean([x[f"{w}_{est}"] for x in split]))
            row[f"{w}_split"] = min(row[f"{w}_split_castell"], row[f"{w}_split_ibu"])
        auto = choose_ways(domain.shape, len(records), eps)
        for k in sorted(set(WAYS) | {auto}):
            part = [_partitioned(domain, records, eps, s, pairs, triples, truth, k,
                                 pgm=pgm and k == auto, glob=k == auto,
                                 net=net if k == auto else None) for s in seeds]
            if k == auto:
                row["global_chosen_seeds"] = int(sum(x["global_chosen"] for x in part))
            for w in ("2way", "3way"):
                if k == auto:
                    row[f"{w}_global"] = float(np.mean([x[f"{w}_global"] for x in part]))
                if pgm and k == auto:
                    row[f"{w}_pgm"] = float(np.mean([x[f"{w}_pgm"] for x in part]))
                if net is not None and k == auto:
                    row[f"{w}_oracle"] = float(np.mean([x[f"{w}_oracle"] for x in part]))
                    row[f"{w}_oracle_vs_sampling"] = row[f"{w}_oracle"] / sampling[w]
                row[f"{w}_ways{k}"] = float(np.mean([x[w] for x in part]))
                row[f"{w}_ways{k}_calm"] = float(np.mean([x[f"{w}_calm"] for x in part]))
                row[f"{w}_ways{k}_floor"] = float(np.mean([x[w] for x in floor(k)]))
                row[f"{w}_ways{k}_ratio"] = row[f"{w}_split"] / row[f"{w}_ways{k}"]
        k = row["auto_ways"] = auto
        for w in ("2way", "3way"):
            for suffix in ("", "_calm", "_floor", "_ratio"):
                row[f"{w}_auto{suffix}"] = row[f"{w}_ways{k}{suffix}"]
            row[f"{w}_sampling"] = sampling[w]
            row[f"{w}_auto_vs_sampling"] = row[f"{w}_auto"] / sampling[w] if sampling[w] \
                else float("inf")
            row[f"{w}_global_ratio"] = row[f"{w}_split"] / row[f"{w}_global"]
            row[f"{w}_global_vs_sampling"] = row[f"{w}_global"] / sampling[w] if sampling[w] \
                else float("inf")
            if pgm:
                row[f"{w}_pgm_ratio"] = row[f"{w}_pgm"] / row[f"{w}_auto"]
                row[f"{w}_pgm_over_global"] = row[f"{w}_pgm"] / row[f"{w}_global"]
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        if advance is not None:
            advance(1)
        if verbose:
            print(f"{name:6s} ε={eps:<4g} " + " | ".join(
                f"{w}: split {row[f'{w}_split']:.3f} "
                + " ".join(f"ways={k} {row[f'{w}_ways{k}']:.3f} (calm "
                           f"{row[f'{w}_ways{k}_calm']:.3f}, floor "
                           f"{row[f'{w}_ways{k}_floor']:.3f}) ×{row[f'{w}_ways{k}_ratio']:.2f}"
                           for k in WAYS) + f" auto(ways={k}) ×{row[f'{w}_auto_ratio']:.2f}"
                + f" global {row[f'{w}_global']:.3f} ×{row[f'{w}_global_ratio']:.2f}"
                + f" sampling {row[f'{w}_sampling']:.3f}"
                + (f" pgm {row[f'{w}_pgm']:.3f} pgm× {row[f'{w}_pgm_ratio']:.2f}" if pgm else "")
                for w in ("2way", "3way")) + f"  [{row['seconds']}s]", flush=True)
    return rows


Source = tuple[str, Domain, np.ndarray, np.ndarray, BayesNet | None]


def _network(name: str, net: BayesNet, n: int, seed: int) -> Source:
    return (name, net.domain, net.sample(n, np.random.default_rng(seed)), net.joint(), net)


def datasets(quick: bool = False) -> list[Source]:
    """(name, domain, records, population joint, network or None) of every dataset."""
    adult = load_csv()
    cols = tuple(range(len(adult.domain)))
    population = histogram(adult.records, cols, adult.domain.shape).astype(float)
    population /= population.sum()
    resample = adult.records[np.random.default_rng(2018).integers(0, len(adult.records),
                                                                   len(adult.records))]
    n_bn = 5_000 if quick else BN_N
    out = [("adult", adult.domain, resample, population, None),
           _network("bn", read_bif(survey_path()), n_bn, 2018)]
    for i, shape in enumerate(GENERATED[:1] if quick else GENERATED):
        out.append(_network(shape, shape_network(shape, GENERATED_M, i), n_bn, 2018 + i))
    return out


def run(quick: bool = False, verbose: bool = True) -> dict[str, Any]:
    from ldpstream.bench.pgm import available
    eps = (1.0, 8.0) if quick else EPSILONS
    seeds = SEEDS[:1] if quick else SEEDS
    pgm = available()
    rows = []
    sets = datasets(quick)
    with progress("marginals", len(sets) * len(eps)) as advance:
        for name, dom, rec, pop, net in sets:
            rows += run_dataset(name, dom, rec, eps, seeds, verbose, population=pop,
                                pgm=pgm and name != "adult", advance=advance, net=net)
    targets: dict[str, Any] = {}
    for name in sorted({r["dataset"] for r in rows}):
        mine = [r for r in rows if r["dataset"] == name]
        targets[name] = {
            col.replace("ways", "ways="): {
                "ratio_ge_1.3_everywhere": all(r[f"{w}_{col}_ratio"] >= 1.3 for r in mine
                                               for w in ("2way", "3way")),
                "below_1.3": [(r["epsilon"], w, round(r[f"{w}_{col}_ratio"], 2)) for r in mine
                              for w in ("2way", "3way") if r[f"{w}_{col}_ratio"] < 1.3],
                "within_1.2_of_floor_at_eps8": all(
                    r[f"{w}_{col}"] <= 1.2 * r[f"{w}_{col}_floor"] for r in mine
                    if r["epsilon"] == 8.0 for w in ("2way", "3way"))}
            for col in [f"ways{k}" for k in WAYS] + ["auto"]}
        auto = targets[name]["auto"]
        auto["ways"] = {r["epsilon"]: r["auto_ways"] for r in mine}
        auto["over_sampling_floor_at_eps8"] = {
            w: round(r[f"{w}_auto_vs_sampling"], 2) for r in mine if r["epsilon"] == 8.0
            for w in ("2way", "3way")}
        if "2way_oracle" in mine[0]:
            auto["true_structure_over_sampling_at_eps8"] = {
                w: round(r[f"{w}_oracle_vs_sampling"], 2) for r in mine if r["epsilon"] == 8.0
                for w in ("2way", "3way")}
        targets[name]["global"] = _global_targets(mine)
        if "2way_pgm" in mine[0]:
            auto["pgm_over_ours_ge_1"] = all(r[f"{w}_pgm_ratio"] >= 1.0 for r in mine
                                             for w in ("2way", "3way"))
            auto["pgm_below_ours"] = [(r["epsilon"], w, round(r[f"{w}_pgm_ratio"], 2))
                                      for r in mine for w in ("2way", "3way")
                                      if r[f"{w}_pgm_ratio"] < 1.0]
    return {"rows": rows, "targets": targets}


def _global_targets(mine: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets for the ``global`` estimator (on the auto column's collection)."""
    ws = ("2way", "3way")
    out: dict[str, Any] = {
        "ratio_ge_1.3_everywhere": all(r[f"{w}_global_ratio"] >= 1.3 for r in mine for w in ws),
        "below_1.3": [(r["epsilon"], w, round(r[f"{w}_global_ratio"], 2)) for r in mine
                      for w in ws if r[f"{w}_global_ratio"] < 1.3],
        "within_1.2_of_floor_at_eps8": all(
            r[f"{w}_global"] <= 1.2 * r[f"{w}_auto_floor"] for r in mine
            if r["epsilon"] == 8.0 for w in ws),
        "over_sampling_floor_at_eps8": {w: round(r[f"{w}_global_vs_sampling"], 2)
                                        for r in mine if r["epsilon"] == 8.0 for w in ws}}
    if "2way_pgm" in mine[0]:
        out["pgm_over_ours_ge_1"] = all(r[f"{w}_pgm_over_global"] >= 1.0 for r in mine
                                        for w in ws)
        out["pgm_below_ours"] = [(r["epsilon"], w, round(r[f"{w}_pgm_over_global"], 2))
                                 for r in mine for w in ws if r[f"{w}_pgm_over_global"] < 1.0]
    return out


def heldout_sources(args: argparse.Namespace) -> list[Any]:
    """The held-out datasets the options name (bench/heldout.py): ``--data``, ``--bif``,
    ``--generate``."""
    from ldpstream.bench.heldout import bif_source, csv_source, generated_sources
    cols = args.columns.split(",") if args.columns else None
    return ([csv_source(p, cols, args.seed) for p in args.data]
            + [bif_source(p, seed=args.seed) for p in args.bif]
            + (generated_sources(args.generate, args.seed) if args.generate else []))


def main(args: argparse.Namespace) -> int:
    """The bench's datasets, or with ``--data``/``--bif``/``--generate`` the held-out run."""
    if args.data or args.bif or args.generate:
        return heldout_main(args)
    res = run(quick=args.quick, verbose=not args.json)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_targets(res["targets"])
    return 0


def heldout_main(args: argparse.Namespace) -> int:
    """``bench marginals --data/--bif/--generate``: the held-out run and its summary."""
    from ldpstream.bench.heldout import print_summary, run_heldout, summarize
    from ldpstream.bench.pgm import available
    try:
        eps = [float(e) for e in args.epsilons.split(",")]
        sources = heldout_sources(args)
    except ValueError as exc:
        print(f"bench marginals: {exc}", file=sys.stderr)
        return 2
    if args.bounds:
        from ldpstream.bench.heldout_bounds import print_bounds, run_bounds
        with progress("bounds", len(sources) * len(eps)) as advance:
            brows = run_bounds(sources, eps, args.runs, advance=advance, verbose=not args.json)
        if args.json:
            print(json.dumps({"rows": brows}, indent=2))
        else:
            print_bounds(brows)
        return 0
    with progress("held-out", len(sources) * len(eps)) as advance:
        rows = run_heldout(sources, eps, args.runs, pgm=available(), advance=advance,
                           verbose=not args.json)
    summary = summarize(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
    else:
        print_summary(rows, summary)
    return 0


def print_targets(targets: dict[str, Any]) -> None:
    """The targets as a table: per dataset and variant, ×1.3 over split everywhere?, where not,
    within 1.2 of the floor at ε = 8?"""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="targets: partitioned vs split (rr-ind) at the same ε per record")
    for col in ("dataset", "variant", "ratio ≥ 1.3 everywhere", "below 1.3 (ε, marginal, ratio)",
                "≤ 1.2 × floor at ε = 8", "÷ sampling floor at ε = 8", "ways chosen per ε"):
        t.add_column(col)
    yes = {True: "[green]yes[/]", False: "[red]no[/]"}
    for name, variants in targets.items():
        for variant, v in variants.items():
            below = ", ".join(f"{e:g} {w} ×{r:.2f}" for e, w, r in v["below_1.3"]) or "–"
            ways = ", ".join(f"ε={e:g}: {k}" for e, k in v.get("ways", {}).items()) or ""
            samp = v.get("over_sampling_floor_at_eps8") or {}
            over = " / ".join(f"{samp[w]:.2f}" for w in ("2way", "3way") if w in samp) or ""
            t.add_row(name, variant, yes[v["ratio_ge_1.3_everywhere"]], below,
                      yes[v["within_1.2_of_floor_at_eps8"]], over, ways)
    console = Console()   # piped: wide enough not to wrap the cells
    (console if console.is_terminal else Console(width=160)).print(t)


if __name__ == "__main__":  # pragma: no cover
    p = argparse.ArgumentParser()
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true")
    from ldpstream.cli import _heldout_options
    _heldout_options(p)
    raise SystemExit(main(p.parse_args()))
