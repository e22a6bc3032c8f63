"""``ldpstream simulate --mechanism rrba``: offline RRBA runs ([RRBA] §4–5, Figures 5–6, Tables 5–6).

Per run (``numpy.random.Generator([seed, run, block_size])``) the records are shuffled and split
evenly over the views (each client answers one view). Every view runs the block loop on its own
clients: a block of B clients randomizes with the view's current tables (floored at γ), the server
applies eq. 4 with T̃, and the view stops at the first block where the §5 confidence-interval rule
holds (or when its clients run out; a last partial block is still counted for its version).
"Reports until convergence" is the number of clients asked before every view stopped.

Estimates per combination: ``last-two`` (the paper: average of the last two block tables) and
``pooled`` (eq. 4 pooled over every version's reports). Both go through the least-squares
consistency across views (§4.3). w-way marginals: projected from a combination that contains
them, else (e.g. 3- and 4-way with k = 2) the maximum-entropy (IPF) table matching the consistent
tables' marginals on the subset (``derivation: maxent``). Metrics (MECHANISMS.md §7): l2_counts
(n = the dataset size), jsd (nats), tvd against the dataset's own marginal.

ε: the corrected per-record ε (sum over a view's combinations of ln(1 + p·|Ω_S|/((1−p)·γ)), max
over views) — not the paper's ln(1/(1−p)), which is printed beside it for reference. ε follows
from p and γ, so at most two of ``--epsilon``, ``--p``, ``--gamma`` may be given: without ``--p``,
p is solved so that the per-record ε equals ``--epsilon`` (default 1.0) at γ (default 0.05); with
``--p`` and ``--epsilon``, γ is solved instead; all three are rejected.

JSON: ``epsilon`` and ``epsilon_per_record`` are the computed per-record ε; ``epsilon_target`` the
``--epsilon`` that p or γ was solved from (``null`` if none); one ``results`` row per (block size,
estimator, w) with a ``metrics`` object (and ``stderr`` with ``--runs`` > 1) plus the block-size
fields (``reports_until_convergence`` …).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..cli import CliError
from ..datasets import Dataset
from ..estimators import metrics as M
from ..estimators.rrba import (RRBA, block_step, floor_table, last_two_estimate, paper_epsilon,
                               pooled_estimate, randomize_cells, solve_gamma, solve_p)
from ..estimators.proper import clip_rescale
from ..estimators.rrba_consistency import consistent_tables
from . import check_epsilon
from .rr import draw_subsets, load_dataset, parse_ways

DEFAULT_BLOCK_SIZES = (18, 50, 150, 250)
DEFAULT_EPSILON = 1.0
DEFAULT_GAMMA = 0.05
METRICS = ("l2_counts", "jsd", "tvd")
ESTIMATORS = ("last-two", "pooled")


@dataclass
class ViewRun:
    """One view's block loop: counts and floored tables per version, per combination."""

    counts: list[np.ndarray]      # per combination: (versions, cells)
    tildes: list[np.ndarray]      # per combination: (versions, cells) — T̃ each version used
    reports: int
    blocks: int
    converged: bool


def run_view(cells: np.ndarray, sizes: Sequence[int], p: float, gamma: float, block_size: int,
             alpha: float, rng: np.random.Generator, stop_at_convergence: bool = True) -> ViewRun:
    """The block loop of one view on its clients' true cells ``(n_v, C)``."""
    n, C = cells.shape
    tables = [np.full(s, 1.0 / s) for s in sizes]
    counts: list[list[np.ndarray]] = [[] for _ in range(C)]
    tildes: list[list[np.ndarray]] = [[] for _ in range(C)]
    start, blocks, converged = 0, 0, False
    while start < n:
        stop = min(start + block_size, n)
        block_counts = []
        for j in range(C):
            Tt = floor_table(tables[j], gamma)
            rep = randomize_cells(cells[start:stop, j], Tt, p, rng)
            o = np.bincount(rep, minlength=sizes[j])
            counts[j].append(o)
            tildes[j].append(Tt)
            block_counts.append(o)
        partial = stop - start < block_size
        start = stop
        if partial:
            break  # a last partial block: valid data for its version, no update
        res = block_step(block_counts, tables, p, gamma, alpha, is_estimate=blocks >= 1)
        tables = res.tables
        blocks += 1
        if res.converged and stop_at_convergence:
            converged = True
            break
    return ViewRun([np.array(c) for c in counts], [np.array(t) for t in tildes], start, blocks,
                   converged)


def run_once(ds: Dataset, mech: RRBA, rng: np.random.Generator,
             stop_at_convergence: bool = True) -> tuple[dict[str, list], dict[str, Any]]:
    """Randomize and aggregate every view; returns ({estimator: [(attrs, table), …]}, info);
    ``info["raw"][combination]`` holds its (counts, T̃) per version."""
    V = len(mech.views)
    perm = rng.permutation(ds.n)
    per_est: dict[str, list] = {e: [] for e in ESTIMATORS}
    reports, conv, blocks = 0, 0, 0
    raw: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}
    for v, view in enumerate(mech.views):
        idx = perm[v::V]
        cells = np.stack([np.ravel_multi_index(
            tuple(ds.records[idx, c].astype(np.intp) for c in ds.domain.axes(comb)), mech.dims[v][j])
            for j, comb in enumerate(view)], axis=1)
        run = run_view(cells, mech.sizes[v], mech.p, mech.gamma, mech.block_size, mech.alpha, rng,
                       stop_at_convergence)
        reports += run.reports
        conv += run.converged
        blocks += run.blocks
        for j, comb in enumerate(view):
            lt, _ = last_two_estimate(run.counts[j], run.tildes[j], mech.p, mech.block_size)
            pl = clip_rescale(pooled_estimate(run.counts[j], run.tildes[j], mech.p))
            per_est["last-two"].append((comb, lt.reshape(mech.dims[v][j])))
            per_est["pooled"].append((comb, pl.reshape(mech.dims[v][j])))
            raw[comb] = (run.counts[j], run.tildes[j])
    for e in ESTIMATORS:
        cons = consistent_tables(per_est[e])
        per_est[e] = [(a, t) for (a, _), t in zip(per_est[e], cons)]
    return per_est, {"reports": reports, "views_converged": conv, "views": V, "blocks": blocks,
                     "raw": raw}


def true_marginal(ds: Dataset, attrs: Sequence[str]) -> np.ndarray:
    ax = ds.domain.axes(attrs)
    shape = tuple(ds.domain.shape[a] for a in ax)
    flat = np.ravel_multi_index(tuple(ds.records[:, a].astype(np.intp) for a in ax), shape)
    return np.bincount(flat, minlength=int(np.prod(shape))).reshape(shape) / ds.n


def evaluate(ds: Dataset, mech: RRBA, tables: list, subsets: dict[int, list[tuple[str, ...]]],
             truths: dict[tuple[str, ...], np.ndarray]) -> dict[int, dict[str, Any]]:
    out = {}
    for w, subs in subsets.items():
        vals = {k: [] for k in METRICS}
        how = {"direct": 0, "maxent": 0}
        for s in subs:
            est, h = mech.marginal(tables, s)
            how[h] += 1
            t = truths[s]
            vals["l2_counts"].append(M.l2_counts(est, t, ds.n))
            vals["jsd"].append(M.jsd(np.clip(est, 0, None), t))
            vals["tvd"].append(M.tvd(est, t))
        out[w] = {k: float(np.mean(v)) for k, v in vals.items()} | {"derivation": how}
    return out


def simulate(ds: Dataset, p: float, gamma: float, k: int, block_sizes: Sequence[int],
             ways: Sequence[int], n_subsets: int, seed: int = 0, runs: int = 1,
             alpha: float = 0.05, stop_at_convergence: bool = True,
             epsilon_target: float | None = None) -> dict[str, Any]:
    """The whole experiment as a JSON-able dict (see the module docstring)."""
    attrs = ds.domain.attrs
    subsets = {w: [tuple(attrs[i] for i in s) for s in draw_subsets(len(attrs), w, n_subsets, seed)]
               for w in ways}
    truths = {s: true_marginal(ds, s) for subs in subsets.values() for s in subs}
    base = RRBA(ds.domain, p, gamma, k)
    results = []
    for B in block_sizes:
        mech = RRBA(ds.domain, p, gamma, k, base.views, block_size=B, alpha=alpha,
                    max_versions=max(2, -(-ds.n // B) + 2))
        per_run, infos, secs = [], [], []
        for r in range(runs):
            t0 = time.perf_counter()
            rng = np.random.default_rng([seed, r, B])
            tables, info = run_once(ds, mech, rng, stop_at_convergence)
            per_run.append({e: evaluate(ds, mech, tables[e], subsets, truths) for e in ESTIMATORS})
            infos.append(info)
            secs.append(time.perf_counter() - t0)
        rep = [i["reports"] for i in infos]
        block = {
            "reports_until_convergence": float(np.mean(rep)),
            "reports_stderr": float(np.std(rep, ddof=1) / np.sqrt(runs)) if runs > 1 else None,
            "views_converged": float(np.mean([i["views_converged"] for i in infos])),
            "views": infos[0]["views"],
            "blocks": float(np.mean([i["blocks"] for i in infos])),
        }
        for e in ESTIMATORS:
            for w in ways:
                vals = {m: [pr[e][w][m] for pr in per_run] for m in METRICS}
                row = {"mechanism": "rrba", "block_size": B, "estimator": e, "w": w,
                       "subsets": len(subsets[w]),
                       "metrics": {m: float(np.mean(v)) for m, v in vals.items()}}
                if runs > 1:
                    row["stderr"] = {m: float(np.std(v, ddof=1) / np.sqrt(runs))
                                     for m, v in vals.items()}
                # seconds: one whole run at this block size (every estimator and w)
                row.update(seconds=float(np.mean(secs)),
                           derivation=per_run[0][e][w]["derivation"], **block)
                results.append(row)
    return {
        "mechanism": "rrba", "n": ds.n, "m": len(attrs), "attributes": list(attrs), "k": k,
        "p": p, "gamma": gamma, "alpha": alpha, "views": len(base.views),
        "combinations_per_view": [len(v) for v in base.views],
        "epsilon": base.epsilon, "epsilon_per_record": base.epsilon, "epsilon_scope": "record",
        "epsilon_target": epsilon_target,
        "epsilon_per_view": [base.view_epsilon(v) for v in range(len(base.views))],
        "paper_epsilon_claim": paper_epsilon(p),
        "seed": seed, "runs": runs, "ways": list(ways),
        "higher_way": "direct projection where a combination contains the subset, else "
                      "maximum-entropy (IPF) from the consistent combination tables",
        "results": results,
    }


def one_blas_thread():
    """Single-threaded BLAS for the small dense solves (the machine's cores are shared;
    multi-threaded OpenBLAS is several times slower under contention here)."""
    try:
        from threadpoolctl import threadpool_limits
        return threadpool_limits(1)
    except ImportError:  # pragma: no cover
        import contextlib
        return contextlib.nullcontext()


def _params(args: Any, ds: Dataset
            ) -> tuple[float, float, int, tuple[int, ...], tuple[int, ...], float | None]:
    """(p, γ, k, block sizes, ways, the target ε p or γ was solved from, or None)."""
    m = len(ds.domain)
    k = int(args.k)
    if not 2 <= k <= m:
        raise CliError(f"--k: must be between 2 and the {m} columns, got {k}")
    gamma = DEFAULT_GAMMA if args.gamma is None else float(args.gamma)
    if not (np.isfinite(gamma) and 0 < gamma <= 1):
        raise CliError(f"--gamma: must be in (0, 1], got {args.gamma}")
    sizes = args.block_size or list(DEFAULT_BLOCK_SIZES)
    if any(int(b) < 1 for b in sizes):
        raise CliError(f"--block-size: must be ≥ 1, got {min(sizes)}")
    eps = None if args.epsilon is None else check_epsilon(args.epsilon)
    probe = RRBA(ds.domain, 0.5, gamma, k)
    view_sizes = [probe.sizes[v] for v in range(len(probe.views))]
    if args.p is not None:
        p = float(args.p)
        if not (np.isfinite(p) and 0 < p < 1):
            raise CliError(f"--p: must be in (0, 1), got {args.p}")
        if eps is not None:
            if args.gamma is not None:
                have = RRBA(ds.domain, p, gamma, k).epsilon
                raise CliError(f"--epsilon: rrba's ε follows from --p and --gamma (here "
                               f"{have:.4g} per record); give at most two of --epsilon, --p, "
                               "--gamma")
            try:  # the largest γ whose ε is ≤ the target in every view (= in the largest)
                gamma = max(solve_gamma(eps, p, s) for s in view_sizes)
            except ValueError as exc:
                raise CliError(f"--epsilon: {exc}") from None
    else:
        if eps is None:
            eps = DEFAULT_EPSILON
        p = min(solve_p(eps, gamma, s) for s in view_sizes)
    ways = (2, 3, 4) if args.ways == "2,3" else parse_ways(args.ways, m)  # rrba default: 2,3,4
    ways = tuple(w for w in ways if w <= m) or (2,)
    if any(w < 2 for w in ways):
        raise CliError("--ways: RRBA estimates 2-way and larger tables")
    return p, gamma, k, tuple(int(b) for b in dict.fromkeys(sizes)), ways, eps


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=(f"RRBA  n={doc['n']} m={doc['m']} k={doc['k']} p={doc['p']:.4g} "
                     f"γ={doc['gamma']:g}  views={doc['views']}  ε per record="
                     f"{doc['epsilon_per_record']:.4g} (paper's claim ln(1/(1−p))="
                     f"{doc['paper_epsilon_claim']:.3g})"))
    for c in ("B", "reports", "conv. views", "estimator", "w", "derivation", "l2_counts", "jsd",
              "tvd", "s"):
        t.add_column(c, justify="left" if c in ("estimator", "derivation") else "right")
    for row in doc["results"]:
        mt, se = row["metrics"], row.get("stderr")
        cell = (lambda k, mt=mt, se=se: f"{mt[k]:.4g}" + (f" ±{se[k]:.2g}" if se else ""))
        d = row["derivation"]
        t.add_row(str(row["block_size"]), f"{row['reports_until_convergence']:.0f}",
                  f"{row['views_converged']:.1f}/{row['views']}", row["estimator"], str(row["w"]),
                  "direct" if not d["maxent"] else ("maxent" if not d["direct"] else "mixed"),
                  cell("l2_counts"), cell("jsd"), cell("tvd"), f"{row['seconds']:.2f}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(t)


def main(args: Any) -> int:
    if getattr(args, "generator", None):
        raise CliError(f"--generator: rrba reads CSV data (--data); got --generator {args.generator!r}")
    if int(args.subsets) < 1:
        raise CliError(f"--subsets: must be ≥ 1, got {args.subsets}")
    if int(args.runs) < 1:
        raise CliError(f"--runs: must be ≥ 1, got {args.runs}")
    ds = load_dataset(args.data, args.columns)
    p, gamma, k, sizes, ways, eps = _params(args, ds)
    with one_blas_thread():
        doc = simulate(ds, p, gamma, k, sizes, ways, int(args.subsets), int(args.seed),
                       int(args.runs), epsilon_target=eps)
    if args.json:
        print(json.dumps(doc))
    else:
        print_table(doc)
    return 0
