"""Held-out runs of ``ldpstream bench marginals`` (docs/benchmarks.md "Held-out accuracy"): the
``partitioned`` mechanism's default estimator against Private-PGM (``mbi``, when installed) fed
the same noisy measurements, on data the estimator was not tuned on — a CSV, a BIF network, or
freshly generated random networks (:data:`~ldpstream.bngen.HELDOUT_KINDS`: skewed,
near-deterministic and dense CPTs) from seeds of the caller's choosing.

Every choice of the mechanism is frozen before the data is seen: ``ways: auto`` with
``expected_reports`` = n picks the declared tables and the marginals per report from n, the
attribute sizes and ε only (:meth:`~ldpstream.estimators.families.partitioned.Partitioned`),
the estimator is the family's default, and nothing is refitted per dataset. Each dataset is a
sample from a population (the network's exact joint, or the CSV's records resampled with
replacement) and every TVD is measured against the population's marginals: every pair and up to
:data:`TRIPLES` seeded triples, per ε, mean over ``runs`` randomizations.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ldpstream.bn import BayesNet, read_bif
from ldpstream.bngen import HELDOUT_KINDS, shape_network
from ldpstream.datasets import load_csv
from ldpstream.estimators.families.partitioned import Partitioned
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.global_fit import MAX_CELLS
from ldpstream.estimators.kernels.metrics import tvd
from ldpstream.estimators.mechanism import histogram

__all__ = ["Source", "csv_source", "bif_source", "generated_sources", "run_heldout",
           "summarize", "truths", "TRIPLES", "N", "M"]

#: triples measured per dataset (seeded; all of them when there are fewer)
TRIPLES = 20
#: records sampled from a network
N = 50_000
#: attributes of a generated network
M = 7
#: the largest domain whose exact joint (the truth) is formed
MAX_JOINT_CELLS = 5_000_000


@dataclass(frozen=True)
class Source:
    """A dataset: its name, kind (the generator's shape, ``csv`` or ``bif``), domain, records
    and the population's joint distribution (the truth)."""

    name: str
    kind: str
    domain: Domain
    records: np.ndarray
    population: np.ndarray


def csv_source(path: str, columns: Sequence[str] | None = None, seed: int = 0) -> Source:
    """A CSV's records as the population, resampled with replacement (seeded) as the sample."""
    data = load_csv(path, columns)
    if data.domain.size() > MAX_JOINT_CELLS:
        raise ValueError(f"{path}: the domain has {data.domain.size():,} cells, more than the "
                         f"{MAX_JOINT_CELLS:,} this benchmark forms; pass fewer --columns")
    pop = histogram(data.records, tuple(range(len(data.domain))), data.domain.shape)
    pop = pop.astype(float) / pop.sum()
    sample = data.records[np.random.default_rng([seed, 11]).integers(0, data.n, data.n)]
    return Source(str(path), "csv", data.domain, sample, pop)


def _net_source(name: str, kind: str, net: BayesNet, n: int, seed: int) -> Source:
    if net.domain.size() > MAX_JOINT_CELLS:
        raise ValueError(f"{name}: the network's domain has {net.domain.size():,} cells, more "
                         f"than the {MAX_JOINT_CELLS:,} this benchmark forms")
    return Source(name, kind, net.domain, net.sample(n, np.random.default_rng([seed, 13])),
                  net.joint())


def bif_source(path: str, n: int = N, seed: int = 0) -> Source:
    """``n`` records sampled from a BIF network; the truth is its exact joint."""
    return _net_source(str(path), "bif", read_bif(path), n, seed)


def generated_sources(count: int, seed: int, n: int = N, m: int = M) -> list[Source]:
    """``count`` fresh networks of ``m`` attributes, cycling through
    :data:`~ldpstream.bngen.HELDOUT_KINDS`, network i from seed ``seed + i``."""
    out = []
    for i in range(count):
        kind = HELDOUT_KINDS[i % len(HELDOUT_KINDS)]
        out.append(_net_source(f"{kind}-{seed + i}", kind, shape_network(kind, m, seed + i),
                               n, seed + i))
    return out


def _sets(domain: Domain) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    pairs = list(itertools.combinations(domain.attrs, 2))
    triples = list(itertools.combinations(domain.attrs, 3))
    if len(triples) > TRIPLES:
        rng = np.random.default_rng([0, 3])
        triples = [triples[i] for i in sorted(rng.choice(len(triples), TRIPLES, replace=False))]
    return pairs, triples


def truths(src: Source) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]],
                                 dict[tuple[str, ...], np.ndarray]]:
    """The pairs and triples measured on ``src`` (:func:`_sets`) and the population's marginal
    of each."""
    pairs, triples = _sets(src.domain)
    pop = Factor(src.domain, src.population)
    return pairs, triples, {a: pop.project(a).values for a in pairs + triples}


def _mean_tvd(get: Callable[[tuple[str, ...]], np.ndarray], sets: Sequence[tuple[str, ...]],
              truth: dict[tuple[str, ...], np.ndarray]) -> float:
    return float(np.mean([tvd(get(a), truth[a]) for a in sets]))


def run_heldout(sources: Sequence[Source], epsilons: Sequence[float], runs: int = 3,
                pgm: bool = False, advance: Callable[[int], None] | None = None,
                verbose: bool = True) -> list[dict[str, Any]]:
    """One row per (dataset, ε): mean TVD of the default estimator, of ``consistent`` and (with
    ``pgm``) of Private-PGM on the same counts, for pairs (``2way_*``) and triples
    (``3way_*``); ``pgm_over_default`` (≥ 1: the default matches or beats Private-PGM);
    CPU seconds of this process per refresh (every pair and triple asked once, memo cold) of
    both estimators: other processes on a shared machine do not inflate them, wall time
    would."""
    from ldpstream.bench.pgm import pgm_marginals
    default = Partitioned.default_estimators[0]
    rows = []
    for src in sources:
        pairs, triples, truth = truths(src)
        n = len(src.records)
        for eps in epsilons:
            acc: dict[str, list[float]] = {}
            chosen: list[str] = []
            mech = Partitioned(src.domain, eps, ways="auto", expected_reports=n)
            for r in range(runs):
                counts = mech.count(mech.randomize(src.records, np.random.default_rng([r, 1])),
                                    mech.tensors())
                for method in dict.fromkeys((default, "consistent")):
                    fresh = Partitioned.from_state(mech.state())   # a cold memo per estimator
                    t0 = time.process_time()
                    est = {a: fresh.estimate(counts, a, method) for a in pairs + triples}
                    acc.setdefault(f"seconds_{method}", []).append(time.process_time() - t0)
                    for w, sets in (("2way", pairs), ("3way", triples)):
                        acc.setdefault(f"{w}_{method}", []).append(
                            _mean_tvd(lambda a: est[a].factor.values, sets, truth))
                    if method == default and "chosen" in est[pairs[0]].extra:
                        chosen.append(str(est[pairs[0]].extra["chosen"]))
                if pgm and src.domain.size() <= MAX_CELLS:
                    got = pgm_marginals(mech, counts, pairs + triples)
                    for w, sets in (("2way", pairs), ("3way", triples)):
                        acc.setdefault(f"{w}_pgm", []).append(
                            _mean_tvd(lambda a: got[a], sets, truth))
            row: dict[str, Any] = {"dataset": src.name, "kind": src.kind, "n": n,
                                   "epsilon": float(eps), "ways": mech.ways,
                                   "per_report": mech.per_report, "cells": src.domain.size(),
                                   "runs": runs, "default": default, "chosen": chosen}
            row.update({k: float(np.mean(v)) for k, v in acc.items()})
            if "2way_pgm" in row:
                for w in ("2way", "3way"):
                    row[f"{w}_pgm_over_default"] = row[f"{w}_pgm"] / row[f"{w}_{default}"]
            row["cost_over_consistent"] = row[f"seconds_{default}"] / row["seconds_consistent"]
            rows.append(row)
            if advance is not None:
                advance(1)
            if verbose:
                print(f"{src.name} ε={eps:g} ways={mech.ways} r={mech.per_report} "
                      + " | ".join(f"{w}: {default} {row[f'{w}_{default}']:.4f} consistent "
                                   f"{row[f'{w}_consistent']:.4f}"
                                   + (f" pgm {row[f'{w}_pgm']:.4f} pgm÷{default} "
                                      f"{row[f'{w}_pgm_over_default']:.2f}"
                                      if f"{w}_pgm" in row else "")
                                   for w in ("2way", "3way"))
                      + f" | cost ×{row['cost_over_consistent']:.2f} "
                      f"({row[f'seconds_{default}']:.2f} ÷ {row['seconds_consistent']:.2f} CPU "
                      f"s a refresh) chosen {chosen}",
                      flush=True)
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per ε and marginal size: the smallest and the geometric mean of Private-PGM ÷ default
    over the datasets, the cells below 1 (where Private-PGM is more accurate), and the cost
    ratio to ``consistent`` (median and largest)."""
    out: dict[str, Any] = {"per_epsilon": {}, "below_1": []}
    for eps in sorted({r["epsilon"] for r in rows}):
        mine = [r for r in rows if r["epsilon"] == eps]
        cell: dict[str, Any] = {"cost_median": float(np.median(
            [r["cost_over_consistent"] for r in mine])),
            "cost_max": float(max(r["cost_over_consistent"] for r in mine))}
        for w in ("2way", "3way"):
            ratios = [r[f"{w}_pgm_over_default"] for r in mine if f"{w}_pgm_over_default" in r]
            if ratios:
                cell[f"{w}_min"] = float(min(ratios))
                cell[f"{w}_geomean"] = float(np.exp(np.mean(np.log(ratios))))
                out["below_1"] += [(r["dataset"], eps, w, round(r[f"{w}_pgm_over_default"], 3))
                                   for r in mine if r.get(f"{w}_pgm_over_default", 1.0) < 1.0]
        out["per_epsilon"][eps] = cell
    return out


def print_summary(rows: Sequence[dict[str, Any]], summary: dict[str, Any]) -> None:
    """The rows and the summary as tables (rich)."""
    from rich.console import Console
    from rich.table import Table

    default = rows[0]["default"] if rows else "default"
    t = Table(title=f"held-out: Private-PGM ÷ {default} (≥ 1: {default} as accurate or better)")
    for col in ("dataset", "ε", "ways / r", f"2-way {default}", "2-way PGM ÷", f"3-way {default}",
                "3-way PGM ÷", f"CPU s {default}", "CPU s consistent",
                "cost ÷ consistent"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["dataset"], f"{r['epsilon']:g}", f"{r['ways']} / {r['per_report']}",
                  f"{r[f'2way_{default}']:.4f}",
                  f"{r['2way_pgm_over_default']:.2f}" if "2way_pgm_over_default" in r else "—",
                  f"{r[f'3way_{default}']:.4f}",
                  f"{r['3way_pgm_over_default']:.2f}" if "3way_pgm_over_default" in r else "—",
                  f"{r[f'seconds_{default}']:.2f}", f"{r['seconds_consistent']:.2f}",
                  f"{r['cost_over_consistent']:.2f}")
    s = Table(title="per ε: Private-PGM ÷ default over the datasets (min / geometric mean)")
    for col in ("ε", "2-way", "3-way", "cost ÷ consistent (median / max)"):
        s.add_column(col)
    for eps, c in summary["per_epsilon"].items():
        s.add_row(f"{eps:g}", *(f"{c[f'{w}_min']:.2f} / {c[f'{w}_geomean']:.2f}"
                                if f"{w}_min" in c else "—" for w in ("2way", "3way")),
                  f"{c['cost_median']:.2f} / {c['cost_max']:.2f}")
    console = Console()
    out = console if console.is_terminal else Console(width=160)
    out.print(t)
    out.print(s)
