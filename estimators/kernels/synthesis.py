"""Synthesis [LoPub Alg. 6; docs/mechanisms.md §6]: sample a dataset from the clusters' estimated joints
in junction-tree order.

The first clique of every tree is sampled from its joint; each next clique (breadth-first) is
sampled from its conditional given its separator with the already sampled part, which by the
running intersection property is exactly the set of its attributes sampled before. Conditionals
come from the clique's own joint (a separator value it gives no mass falls back to the clique's
marginal of the remaining attributes). Sampling is vectorized by inverse CDF in chunks of records.

>>> import networkx as nx
>>> from ldpstream.estimators.kernels.domain import Domain
>>> from ldpstream.estimators.kernels.junction_tree import junction_tree
>>> dom = Domain(("a", "b", "c"), (2, 2, 3))
>>> jt = junction_tree(nx.Graph([("a", "b"), ("b", "c")]))
>>> joints = [np.array([[0.5, 0.0], [0.0, 0.5]]), np.array([[0.5, 0.0, 0.0], [0.0, 0.25, 0.25]])]
>>> x = synthesize(dom, jt, joints, 1000, np.random.default_rng(0))
>>> x.shape, bool((x[:, 0] == x[:, 1]).all()), bool(((x[:, 1] == 0) == (x[:, 2] == 0)).all())
((1000, 3), True, True)
"""
from __future__ import annotations

from typing import Sequence

import networkx as nx
import numpy as np

from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.junction_tree import JunctionTree

__all__ = ["synthesize", "sample_table"]

_CHUNK = 8192


def _proper(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=float), 0.0, None)
    s = p.sum()
    return p / s if s > 0 else np.full(p.shape, 1.0 / p.size)


def sample_table(cond: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For every entry r of ``rows``, one column index drawn from row ``cond[r]`` (rows sum to 1)
    by inverse CDF, vectorized in chunks."""
    cum = np.cumsum(cond, axis=1)
    cum[:, -1] = 1.0
    u = rng.random(rows.shape[0])
    out = np.empty(rows.shape[0], dtype=np.intp)
    for s in range(0, rows.shape[0], _CHUNK):
        c = cum[rows[s:s + _CHUNK]]
        out[s:s + _CHUNK] = (u[s:s + _CHUNK, None] >= c[:, :-1]).sum(axis=1)
    return out


def synthesize(domain: Domain, jt: JunctionTree, joints: Sequence[np.ndarray], n: int,
               rng: np.random.Generator) -> np.ndarray:
    """[LoPub Alg. 6]: ``n`` synthetic records ``(n, len(domain))`` (category indices in domain
    order) from the joint of every clique (``joints[i]`` has axes ``jt.cliques[i]``)."""
    if len(joints) != len(jt.cliques):
        raise ValueError(f"{len(joints)} joints for {len(jt.cliques)} cliques")
    n = int(n)
    out = np.zeros((n, len(domain)), dtype=np.int64)
    done: set[str] = set()
    for root in sorted(min(c) for c in nx.connected_components(jt.tree)):
        for i in [root] + [v for _, v in nx.bfs_edges(jt.tree, root)]:
            clique = jt.cliques[i]
            joint = _proper(joints[i])
            if joint.shape != domain.project(clique).shape:
                raise ValueError(f"joint of {clique} has shape {joint.shape}")
            sep = tuple(a for a in clique if a in done)
            rest = tuple(a for a in clique if a not in done)
            if not rest:
                continue
            perm = [clique.index(a) for a in sep + rest]
            t = np.transpose(joint, perm)
            d_sep = int(np.prod([domain[a] for a in sep])) if sep else 1
            t = t.reshape(d_sep, -1)
            mass = t.sum(axis=1, keepdims=True)
            fallback = t.sum(axis=0, keepdims=True) / t.sum()
            cond = np.where(mass > 0, t / np.where(mass > 0, mass, 1.0), fallback)
            if sep:
                cols = [out[:, domain.axes((a,))[0]] for a in sep]
                rows = np.ravel_multi_index(tuple(cols), tuple(domain[a] for a in sep))
            else:
                rows = np.zeros(n, dtype=np.intp)
            flat = sample_table(cond, rows, rng)
            values = np.unravel_index(flat, tuple(domain[a] for a in rest))
            for a, v in zip(rest, values):
                out[:, domain.axes((a,))[0]] = v
            done.update(rest)
    missing = [a for a in domain.attrs if a not in done]
    if missing:
        raise ValueError(f"attributes {missing} are in no clique")
    dtype = np.uint8 if max(domain.shape) < 256 else np.uint16 if max(domain.shape) < 65536 \
        else np.uint32
    return out.astype(dtype)
