"""``ldpstream simulate --mechanism lopub``: randomize a dataset with LoPub, estimate k-way joints
with EM JD, Lasso JD, Lasso+EM and the bit co-occurrence estimator, report their tvd (LoPub's
AVD) and ε; optionally publish a synthetic dataset (LoPub Algs. 4 and 6).

ε: LoPub's ε follows from ``--f`` and the Bloom filters, so ``--epsilon`` is rejected (validated
first, then refused with the ε that ``--f`` gives). JSON: ``epsilon`` = ``epsilon_per_record`` =
the exact ε per record computed from the filters (Σ_j ln((2−f)/f)·max_{u≠v} H(B_u, B_v));
``epsilon_eq8`` is the paper's eq. 8 bound (2h·ln((2−f)/f) per attribute, summed) and
``epsilon_attribute_eq8`` its per-attribute value. One ``results`` row per (w, estimator) with a
``metrics`` object (``tvd``; ``stderr`` with ``--runs`` > 1), ``seconds`` (per estimate),
``em_iterations`` and ``subsets``.

Example::

    ldpstream simulate --mechanism lopub --f 0.5 --estimator em --estimator cooccurrence \\
        --ways 2,3 --subsets 5 --synthesize synthetic.csv
"""
from __future__ import annotations

import csv
import json
import sys
import time
from itertools import combinations
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..cli import CliError
from ..datasets import Dataset, DatasetError, load_csv
from ..estimators.junction_tree import dependency_graph, junction_tree, mi_threshold
from ..estimators.lopub import LoPub
from ..estimators.metrics import tvd
from ..estimators.proper import project_simplex
from ..estimators.synthesis import synthesize

ESTIMATORS = LoPub.estimators
DEFAULT_F = 0.5
#: Cramér's-V-style threshold φ of Alg. 4's mutual-information test
DEFAULT_PHI = 0.2
#: largest clique (cells) the synthesis estimates a joint for
MAX_CLIQUE_CELLS = 20_000


def true_joint(ds: Dataset, attrs: Sequence[str]) -> np.ndarray:
    """Empirical joint of ``attrs`` (axes in the order given)."""
    shape = ds.domain.project(attrs).shape
    flat = np.ravel_multi_index(tuple(ds.column(a).astype(np.intp) for a in attrs), shape)
    return np.bincount(flat, minlength=int(np.prod(shape))).reshape(shape) / ds.n


def pick_subsets(attrs: Sequence[str], w: int, count: int, seed: int) -> list[tuple[str, ...]]:
    """All w-subsets when there are at most ``count``, else ``count`` of them drawn (seeded)."""
    combos = list(combinations(attrs, w))
    if len(combos) <= count:
        return combos
    rng = np.random.default_rng([int(seed), 7919, int(w)])
    idx = np.sort(rng.choice(len(combos), size=count, replace=False))
    return [combos[i] for i in idx]


def make_mechanism(ds: Dataset, f: float, bits: int | None, hashes: int | None,
                   seed: int) -> LoPub:
    try:
        return LoPub(ds.domain, f=f, bits=bits, hashes=hashes, seed=seed)
    except ValueError as exc:
        raise CliError(f"--bloom-bits/--hashes: {exc}") from None


def evaluate(ds: Dataset, *, f: float, estimators: Sequence[str], ways: Sequence[int],
             subsets: int, seed: int = 0, runs: int = 1, bits: int | None = None,
             hashes: int | None = None, proper: bool = False,
             options: dict[str, Any] | None = None,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """tvd of every estimator on the same seeded w-way subsets, averaged over subsets, then over
    runs (mean and standard error across runs); seconds per estimate."""
    mech = make_mechanism(ds, f, bits, hashes, seed)
    if any(e in ("lasso", "lasso-em") for e in estimators):
        import sklearn.linear_model  # noqa: F401  (imported before timing, not inside it)
    chosen = {w: pick_subsets(ds.domain.attrs, w, subsets, seed) for w in ways}
    truths = {s: true_joint(ds, s) for w in ways for s in chosen[w]}
    per_run: dict[tuple[str, int], list[float]] = {}
    secs: dict[tuple[str, int], list[float]] = {}
    iters: dict[tuple[str, int], list[int]] = {}
    for r in range(runs):
        rng = np.random.default_rng([int(seed), int(r)])
        reports = mech.randomize(ds.records, rng)
        for w in ways:
            for est in estimators:
                vals, times = [], []
                for s in chosen[w]:
                    opts = dict(options or {})
                    if est == "cooccurrence" and proper:
                        opts["proper"] = "project"
                    t0 = time.perf_counter()
                    e = mech.estimate_reports(reports, s, est, **opts)
                    times.append(time.perf_counter() - t0)
                    vals.append(tvd(e.factor.values, truths[s]))
                    if e.iterations is not None:
                        iters.setdefault((est, w), []).append(e.iterations)
                per_run.setdefault((est, w), []).append(float(np.mean(vals)))
                secs.setdefault((est, w), []).extend(times)
                if progress:
                    progress(f"run {r + 1}/{runs}  w={w}  {est:<12} tvd {np.mean(vals):.4f}  "
                             f"({np.sum(times):.1f}s for {len(times)} subsets)")
    rows = []
    for w in ways:
        for est in estimators:
            v = np.array(per_run[(est, w)])
            row: dict[str, Any] = {
                "mechanism": "lopub",
                "estimator": est + ("+project" if est == "cooccurrence" and proper else ""),
                "w": int(w), "subsets": len(chosen[w]), "metrics": {"tvd": float(v.mean())}}
            if len(v) > 1:
                row["stderr"] = {"tvd": float(v.std(ddof=1) / np.sqrt(len(v)))}
            row["seconds"] = float(np.mean(secs[(est, w)]))
            row["em_iterations"] = (float(np.mean(iters[(est, w)])) if (est, w) in iters
                                    else None)
            rows.append(row)
    return {
        "mechanism": "lopub", "metric": "tvd", "n": ds.n, "m": len(ds.domain), "f": mech.f,
        "hashes": mech.hashes, "bits": dict(zip(ds.domain.attrs, mech.bits)),
        "epsilon": mech.epsilon_exact, "epsilon_per_record": mech.epsilon_exact,
        "epsilon_exact": mech.epsilon_exact,
        "epsilon_eq8": mech.epsilon_eq8, "epsilon_attribute_eq8": mech.epsilon_attribute,
        "epsilon_scope": "record",
        "seed": seed, "runs": runs, "subsets": {str(w): [list(s) for s in chosen[w]] for w in ways},
        "results": rows,
    }


def synthesize_dataset(ds: Dataset, mech: LoPub, reports: np.ndarray, estimator: str,
                       rng: np.random.Generator, phi: float = DEFAULT_PHI,
                       max_clique_cells: int = MAX_CLIQUE_CELLS) -> tuple[np.ndarray, dict]:
    """LoPub end to end: 2-way joints of all pairs → MI graph → junction tree (Alg. 4) → clique
    joints → synthetic records (Alg. 6). Clusters are kept within ``max_clique_cells`` by
    raising φ as far as needed (``info['phi_used']``)."""
    def joint(attrs: tuple[str, ...]) -> np.ndarray:
        opts = {"proper": "project"} if estimator == "cooccurrence" else {}
        return project_simplex(mech.estimate_reports(reports, attrs, estimator, **opts)
                               .factor.values)

    attrs = ds.domain.attrs
    pairs = {p: joint(p) for p in combinations(attrs, 2)}
    graph = dependency_graph(attrs, ds.domain.shape, pairs, phi)
    jt = junction_tree(graph)
    # a cluster too large to estimate: raise φ edge by edge (drop the weakest dependency, by
    # I/τ(φ=1), until every cluster fits); reported as the effective φ
    ratio = {e: graph.edges[e]["mi"] / mi_threshold(ds.domain[e[0]], ds.domain[e[1]], 1.0)
             for e in graph.edges}
    weakest = sorted(ratio, key=ratio.__getitem__)
    phi_used = phi
    while any(ds.domain.size(c) > max_clique_cells for c in jt.cliques):
        if not weakest:
            raise CliError(f"--synthesize: an attribute has more than {max_clique_cells} values")
        e = weakest.pop(0)
        graph.remove_edge(*e)
        phi_used = float(np.sqrt(ratio[e]))
        jt = junction_tree(graph)
    joints = [pairs[c] if len(c) == 2 else joint(c) for c in jt.cliques]
    records = synthesize(ds.domain, jt, joints, ds.n, rng)
    info = {"estimator": estimator, "phi": phi, "phi_used": phi_used, "edges": [list(e) for e in graph.edges],
            "clusters": [list(c) for c in jt.cliques]}
    return records, info


def write_csv(path: str | Path, ds: Dataset, records: np.ndarray) -> None:
    """Write records with the original column names and category labels."""
    labels = ds.domain.labels
    if labels is None:
        raise CliError("--synthesize: the dataset has no category labels")
    cols = [np.asarray(labels[j], dtype=object)[records[:, j].astype(np.intp)]
            for j in range(len(ds.domain))]
    try:
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(ds.domain.attrs)
            w.writerows(np.stack(cols, axis=1).tolist())
    except OSError as exc:
        raise CliError(f"--synthesize: cannot write {path} ({exc.strerror})") from None


def marginal_fidelity(ds: Dataset, records: np.ndarray) -> dict[str, float]:
    """Mean tvd of the 1-way and 2-way marginals of ``records`` against the original data."""
    synth = Dataset(ds.domain, records)
    out = {}
    for w in (1, 2):
        out[f"tvd_{w}way"] = float(np.mean([tvd(true_joint(synth, s), true_joint(ds, s))
                                            for s in combinations(ds.domain.attrs, w)]))
    return out


def _parse_ways(text: str, k: int) -> list[int]:
    try:
        ways = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise CliError(f"--ways: expected comma-separated integers, got {text!r}") from None
    if not ways or any(w < 1 or w > k for w in ways):
        raise CliError(f"--ways: each w must be between 1 and the {k} attributes, got {text!r}")
    return ways


def main(args) -> int:
    if getattr(args, "generator", None):
        raise CliError("--generator: not supported with --mechanism lopub (use --data)")
    f = DEFAULT_F if args.f is None else float(args.f)
    if not 0.0 < f < 1.0:
        raise CliError(f"--f: the bit-flip probability must be in (0, 1), got {args.f}")
    if args.bloom_bits is not None and args.bloom_bits < 1:
        raise CliError(f"--bloom-bits: must be ≥ 1, got {args.bloom_bits}")
    if args.hashes is not None and args.hashes < 1:
        raise CliError(f"--hashes: must be ≥ 1, got {args.hashes}")
    estimators = args.estimator or list(ESTIMATORS)
    bad = [e for e in estimators if e not in ESTIMATORS]
    if bad:
        raise CliError(f"--estimator: {bad[0]!r} is not a LoPub estimator; choose from "
                       + ", ".join(ESTIMATORS))
    if args.subsets < 1:
        raise CliError(f"--subsets: must be ≥ 1, got {args.subsets}")
    if args.runs < 1:
        raise CliError(f"--runs: must be ≥ 1, got {args.runs}")
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    try:
        ds = load_csv(args.data, columns)
    except DatasetError as exc:
        raise CliError(f"--data: {exc}") from None
    ways = _parse_ways(args.ways, len(ds.domain))
    if args.epsilon is not None:  # validated (finite > 0) by the dispatcher; not usable here
        mech = make_mechanism(ds, f, args.bloom_bits, args.hashes, args.seed)
        raise CliError(f"--epsilon: lopub derives ε from --f and the Bloom filters (--f {f:g} "
                       f"gives {mech.epsilon_exact:.4g} per record); set --f instead")

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):   # many small matmuls: one BLAS thread is faster on a busy machine
        return _run(args, ds, f, estimators, ways, progress)


def _run(args, ds: Dataset, f: float, estimators: Sequence[str], ways: Sequence[int],
         progress: Callable[[str], None]) -> int:
    res = evaluate(ds, f=f, estimators=estimators, ways=ways, subsets=args.subsets,
                   seed=args.seed, runs=args.runs, bits=args.bloom_bits, hashes=args.hashes,
                   proper=args.proper, progress=progress)
    if args.synthesize:
        mech = make_mechanism(ds, f, args.bloom_bits, args.hashes, args.seed)
        rng = np.random.default_rng([int(args.seed), 104729])
        reports = mech.randomize(ds.records, rng)
        progress(f"synthesizing with {estimators[0]} …")
        t0 = time.perf_counter()
        records, info = synthesize_dataset(ds, mech, reports, estimators[0], rng)
        info["seconds"] = time.perf_counter() - t0
        write_csv(args.synthesize, ds, records)
        info.update(marginal_fidelity(ds, records))
        info["path"] = str(args.synthesize)
        res["synthesis"] = info
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    _print_table(res)
    return 0


def _print_table(res: dict[str, Any]) -> None:
    print(f"LoPub  n={res['n']}  f={res['f']}  h={res['hashes']}  bits={res['bits']}")
    print(f"ε per record (exact, from the filters) = {res['epsilon']:.3f}   "
          f"eq. 8 bound = {res['epsilon_eq8']:.3f}   "
          f"per attribute (eq. 8) = {res['epsilon_attribute_eq8']:.3f}")
    print(f"metric: tvd (LoPub AVD), mean over subsets; seed {res['seed']}, runs {res['runs']}")
    print(f"{'estimator':<22}{'w':>3}{'tvd':>9}{'± se':>9}{'s/estimate':>12}{'subsets':>9}")
    for r in res["results"]:
        se = f"{r['stderr']['tvd']:.4f}" if "stderr" in r else ""
        print(f"{r['estimator']:<22}{r['w']:>3}{r['metrics']['tvd']:>9.4f}{se:>9}"
              f"{r['seconds']:>12.3f}{r['subsets']:>9}")
    syn = res.get("synthesis")
    if syn:
        print(f"synthetic dataset → {syn['path']} ({syn['estimator']}, φ={syn['phi']}): clusters "
              f"{syn['clusters']} (effective φ {syn['phi_used']:.3f}); marginal tvd 1-way {syn['tvd_1way']:.4f}, "
              f"2-way {syn['tvd_2way']:.4f}; {syn['seconds']:.1f}s")
