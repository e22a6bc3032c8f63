"""Synthetic datasets from randomized reports ([LoPub] Algs. 4 and 6): ``ldpstream simulate
--synthesize OUT.csv`` for any mechanism whose estimates of 2-way and clique joints come from
whole reports (LoPub's EM by default)."""
from __future__ import annotations

import csv
from itertools import combinations
from pathlib import Path
from typing import Sequence

import numpy as np

from ldpstream.cli import CliError
from ldpstream.datasets import Dataset
from ldpstream.estimators.kernels.junction_tree import dependency_graph, junction_tree, mi_threshold
from ldpstream.estimators.kernels.metrics import tvd
from ldpstream.estimators.kernels.proper import project_simplex
from ldpstream.estimators.kernels.synthesis import synthesize
from ldpstream.estimators.mechanism import Mechanism

#: Cramér's-V-style threshold φ of Alg. 4's mutual-information test
DEFAULT_PHI = 0.2
#: largest clique (cells) the synthesis estimates a joint for
MAX_CLIQUE_CELLS = 20_000


def true_joint(ds: Dataset, attrs: Sequence[str]) -> np.ndarray:
    """Empirical joint of ``attrs`` (axes in the order given)."""
    shape = ds.domain.project(attrs).shape
    flat = np.ravel_multi_index(tuple(ds.column(a).astype(np.intp) for a in attrs), shape)
    return np.bincount(flat, minlength=int(np.prod(shape))).reshape(shape) / ds.n


def synthesize_dataset(ds: Dataset, mech: Mechanism, reports: np.ndarray, estimator: str,
                       rng: np.random.Generator, phi: float = DEFAULT_PHI,
                       max_clique_cells: int = MAX_CLIQUE_CELLS) -> tuple[np.ndarray, dict]:
    """[LoPub] Algs. 4 and 6 with any mechanism's estimates from whole reports
    (:meth:`Mechanism.estimate_reports`): 2-way joints of all pairs → MI graph → junction tree →
    clique joints → synthetic records. Clusters are kept within ``max_clique_cells`` by
    raising φ as far as needed (``info['phi_used']``)."""
    def joint(attrs: tuple[str, ...]) -> np.ndarray:
        return project_simplex(mech.estimate_reports(reports, attrs, estimator, proper=True)
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


