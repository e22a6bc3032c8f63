"""``ldpstream bench marginals --bounds`` (docs/partitioned.md "Bootstrap bounds"): the
measured coverage and width of the error bounds ``partitioned`` serves with its default
estimator, the proxy (the unbiased table's bound) beside the bootstrap of the served estimator
(``params.bounds: bootstrap``), on the held-out datasets of bench/heldout.py.

Every randomization draws a fresh sample of n records from the population (the network's joint,
or the CSV's records) and a fresh randomization of it, since both bounds are for the population's
marginal; per dataset and ε, over ``runs`` of them and every pair and triple of
:func:`~.heldout.truths`: the share of marginals whose TVD to the population is within the bound
(target 95 %), the median bound ÷ TVD, the share of cells inside their 95 % intervals, and the
bootstrap's CPU time ÷ the estimate's own (every marginal asked once, memo cold).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from ldpstream.bench.heldout import Source, truths
from ldpstream.estimators.families.partitioned import Partitioned
from ldpstream.estimators.kernels.metrics import tvd

__all__ = ["run_bounds", "print_bounds"]


def _sample(src: Source, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` records drawn from the population's joint."""
    p = np.asarray(src.population, dtype=float).reshape(-1)
    cells = rng.choice(p.size, size=n, p=p / p.sum())
    return np.stack(np.unravel_index(cells, src.domain.shape), axis=1).astype(
        src.records.dtype)


def run_bounds(sources: Sequence[Source], epsilons: Sequence[float], runs: int = 20,
               advance: Callable[[int], None] | None = None, verbose: bool = True
               ) -> list[dict[str, Any]]:
    """One row per (dataset, ε): for pairs (``2way_*``) and triples (``3way_*``) the coverage
    and median bound ÷ TVD of the proxy and the bootstrap bounds, the bootstrap's per-cell
    coverage, which coverage the bootstrap states (``calibrated`` inside a collected marginal,
    ``noise only`` for a derived one), and its cost ÷ the estimate's."""
    default = Partitioned.default_estimators[0]
    rows = []
    for src in sources:
        pairs, triples, truth = truths(src)
        n = len(src.records)
        for eps in epsilons:
            base = Partitioned(src.domain, eps, ways="auto", expected_reports=n)
            acc: dict[str, list[float]] = {}
            stated: dict[str, set[str]] = {"2way": set(), "3way": set()}
            for r in range(runs):
                rng = np.random.default_rng([r, 21, int(eps * 1000)])
                counts = base.count(base.randomize(_sample(src, n, rng), rng), base.tensors())
                proxy = Partitioned.from_state(base.state())
                boot = Partitioned.from_state({**base.state(), "bounds": "bootstrap"})
                t0 = time.process_time()
                est = {a: proxy.estimate(counts, a, default) for a in pairs + triples}
                t1 = time.process_time()
                bst = {a: boot.estimate(counts, a, default) for a in pairs + triples}
                t2 = time.process_time()
                acc.setdefault("cost", []).append((t2 - t1) / max(t1 - t0, 1e-9))
                for w, sets in (("2way", pairs), ("3way", triples)):
                    for a in sets:
                        e = tvd(est[a].factor.values, truth[a])
                        for name, x in (("proxy", est[a]), ("bootstrap", bst[a])):
                            b = float(x.error_bound if x.error_bound is not None else 1.0)
                            acc.setdefault(f"{w}_{name}_covered", []).append(float(e <= b))
                            acc.setdefault(f"{w}_{name}_ratio", []).append(b / max(e, 1e-12))
                        bb = bst[a].bound
                        assert bb is not None
                        inside = (bb.low <= truth[a]) & (truth[a] <= bb.high)
                        acc.setdefault(f"{w}_cells", []).append(float(np.mean(inside)))
                        stated[w].add(bb.coverage)
            row: dict[str, Any] = {"dataset": src.name, "epsilon": float(eps), "n": n,
                                   "ways": base.ways, "runs": runs, "default": default,
                                   "cost_over_estimate": float(np.median(acc["cost"]))}
            for w in ("2way", "3way"):
                for name in ("proxy", "bootstrap"):
                    row[f"{w}_{name}_coverage"] = float(np.mean(acc[f"{w}_{name}_covered"]))
                    row[f"{w}_{name}_median_ratio"] = float(np.median(acc[f"{w}_{name}_ratio"]))
                row[f"{w}_cell_coverage"] = float(np.mean(acc[f"{w}_cells"]))
                row[f"{w}_stated"] = sorted(stated[w])
            rows.append(row)
            if advance is not None:
                advance(1)
            if verbose:
                print(f"{src.name} ε={eps:g} " + " | ".join(
                    f"{w}: proxy {row[f'{w}_proxy_coverage']:.1%} ×"
                    f"{row[f'{w}_proxy_median_ratio']:.2f}, bootstrap "
                    f"{row[f'{w}_bootstrap_coverage']:.1%} ×"
                    f"{row[f'{w}_bootstrap_median_ratio']:.2f} cells "
                    f"{row[f'{w}_cell_coverage']:.1%} ({', '.join(row[f'{w}_stated'])})"
                    for w in ("2way", "3way"))
                    + f" | cost ×{row['cost_over_estimate']:.1f}", flush=True)
    return rows


def print_bounds(rows: Sequence[dict[str, Any]]) -> None:
    """The rows as a table (rich)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="error bounds of the default estimator: coverage (target 95 %) and median "
                    "bound ÷ TVD, proxy → bootstrap")
    for col in ("dataset", "ε", "ways", "2-way coverage", "2-way bound ÷ TVD", "2-way cells",
                "3-way coverage", "3-way bound ÷ TVD", "3-way cells", "3-way stated",
                "cost ÷ estimate"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["dataset"], f"{r['epsilon']:g}", str(r["ways"]),
                  *(c for w in ("2way", "3way") for c in (
                      f"{r[f'{w}_proxy_coverage']:.1%} → {r[f'{w}_bootstrap_coverage']:.1%}",
                      f"{r[f'{w}_proxy_median_ratio']:.2f} → "
                      f"{r[f'{w}_bootstrap_median_ratio']:.2f}",
                      f"{r[f'{w}_cell_coverage']:.1%}")),
                  ", ".join(r["3way_stated"]), f"{r['cost_over_estimate']:.1f}")
    console = Console()
    (console if console.is_terminal else Console(width=180)).print(t)
