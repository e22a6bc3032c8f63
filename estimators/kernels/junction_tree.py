"""Dimension reduction [LoPub Alg. 4; docs/mechanisms.md §6]: a mutual-information dependency graph
on the attributes, triangulated into a junction tree whose cliques are the attribute clusters.

An edge joins attributes m and n when the mutual information of their estimated 2-way joint is at
least τ = min(d_m−1, d_n−1)·φ²/2 (since 2N·I ≈ χ², this is Cramér's V ≥ φ). The graph is made
chordal (networkx ``complete_to_chordal_graph``), its maximal cliques are the clusters, and a
maximum-weight spanning tree of the clique graph weighted by separator size is a junction tree
(running intersection property); zero-weight edges join disconnected parts (independent clusters).
Entropy-based pruning (Alg. 5) is not implemented.

>>> import networkx as nx
>>> g = nx.Graph([("a", "b"), ("b", "c"), ("c", "d"), ("d", "a"), ("e", "f")]); g.add_node("x")
>>> jt = junction_tree(g)
>>> sorted(len(c) for c in jt.cliques), is_junction_tree(jt)
([1, 2, 3, 3], True)
>>> bool(abs(mutual_information(np.array([[0.5, 0.0], [0.0, 0.5]])) - np.log(2)) < 1e-12)
True
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Mapping, Sequence

import networkx as nx
import numpy as np

__all__ = ["mutual_information", "mi_threshold", "dependency_graph", "JunctionTree",
           "junction_tree", "is_junction_tree"]


def mutual_information(joint: np.ndarray) -> float:
    """I(X;Y) in nats of a 2-way table (negative cells clipped, then normalised)."""
    p = np.clip(np.asarray(joint, dtype=float), 0.0, None)
    total = p.sum()
    if total <= 0:
        return 0.0
    p = p / total
    px, py = p.sum(axis=1, keepdims=True), p.sum(axis=0, keepdims=True)
    nz = p > 0
    return float(max(0.0, np.sum(p[nz] * np.log(p[nz] / (px @ py)[nz]))))


def mi_threshold(d_m: int, d_n: int, phi: float) -> float:
    """[LoPub Alg. 4] τ = min(d_m − 1, d_n − 1)·φ²/2."""
    return float(min(int(d_m) - 1, int(d_n) - 1) * float(phi) ** 2 / 2)


def dependency_graph(attrs: Sequence[str], sizes: Sequence[int],
                     pair_joints: Mapping[tuple[str, str], np.ndarray], phi: float) -> nx.Graph:
    """Attributes as nodes; an edge (with its ``mi``) wherever I ≥ τ. ``pair_joints`` maps
    ``(a, b)`` (in ``attrs`` order) to the estimated ``d_a × d_b`` joint."""
    g = nx.Graph()
    g.add_nodes_from(attrs)
    size = dict(zip(attrs, sizes))
    for a, b in combinations(attrs, 2):
        joint = pair_joints.get((a, b))
        if joint is None:
            joint = pair_joints.get((b, a))
            if joint is None:
                raise KeyError(f"no 2-way joint for ({a!r}, {b!r})")
            joint = np.asarray(joint).T
        mi = mutual_information(joint)
        if mi >= mi_threshold(size[a], size[b], phi):
            g.add_edge(a, b, mi=mi)
    return g


@dataclass(frozen=True)
class JunctionTree:
    """``cliques`` (attribute tuples, in the graph's node order) and ``tree`` over their indices;
    tree edges carry ``sep`` (the shared attributes)."""

    cliques: tuple[tuple[str, ...], ...]
    tree: nx.Graph

    def separator(self, i: int, j: int) -> tuple[str, ...]:
        return tuple(a for a in self.cliques[i] if a in self.cliques[j])


def junction_tree(graph: nx.Graph) -> JunctionTree:
    """Triangulate ``graph`` and join its maximal cliques into a junction tree."""
    order = {a: i for i, a in enumerate(graph.nodes)}
    if graph.number_of_nodes() == 0:
        raise ValueError("junction tree of an empty graph")
    chordal = graph.copy()
    if not nx.is_chordal(chordal):
        chordal, _ = nx.complete_to_chordal_graph(graph)
    cliques = sorted((tuple(sorted(c, key=order.__getitem__))
                      for c in nx.chordal_graph_cliques(chordal)),
                     key=lambda c: [order[a] for a in c])
    cg = nx.Graph()
    cg.add_nodes_from(range(len(cliques)))
    for i, j in combinations(range(len(cliques)), 2):
        sep = set(cliques[i]) & set(cliques[j])
        cg.add_edge(i, j, weight=len(sep))
    tree = nx.maximum_spanning_tree(cg, weight="weight") if len(cliques) > 1 else cg
    for i, j in tree.edges:
        tree.edges[i, j]["sep"] = tuple(a for a in cliques[i] if a in cliques[j])
    return JunctionTree(tuple(cliques), tree)


def is_junction_tree(jt: JunctionTree) -> bool:
    """A tree over all cliques with the running intersection property: for every attribute, the
    cliques containing it induce a connected subtree."""
    tree = jt.tree
    if set(tree.nodes) != set(range(len(jt.cliques))) or not nx.is_tree(tree):
        return False
    attrs = {a for c in jt.cliques for a in c}
    for a in attrs:
        holding = [i for i, c in enumerate(jt.cliques) if a in c]
        if not nx.is_connected(tree.subgraph(holding)):
            return False
    return True
