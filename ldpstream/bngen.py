"""Seeded random Bayesian networks for benchmarks and tests (docs/benchmarks.md "Generated
networks"): varied structure, domain sizes and skew, so accuracy is not measured on one dataset.

A network of m attributes: a random topological order; attribute i draws its parents among the
earlier ones (``structure``: ``chain`` — the previous one; ``tree`` — one earlier attribute;
``dag`` — up to ``max_parents`` earlier attributes); its size is uniform in ``sizes``; every CPT
row is Dirichlet(α·1) with α drawn log-uniformly in ``alpha`` (small α: skewed rows, strong
dependence; large α: near-uniform rows, weak dependence). The result is a
:class:`~ldpstream.bn.BayesNet` (sample it with :meth:`~ldpstream.bn.BayesNet.sample`).

>>> net = random_network(7, np.random.default_rng(0))
>>> len(net.variables), all(2 <= len(s) <= 6 for s in net.states.values())
(7, True)
>>> net.sample(5, np.random.default_rng(1)).shape
(5, 7)
"""
from __future__ import annotations

import numpy as np

from ldpstream.bn import BayesNet

__all__ = ["random_network", "STRUCTURES", "SHAPES", "HELDOUT_KINDS", "shape_network"]

STRUCTURES = ("chain", "tree", "dag")


def random_network(m: int, rng: np.random.Generator, *, structure: str = "dag",
                   sizes: tuple[int, int] = (2, 6), max_parents: int = 2,
                   alpha: tuple[float, float] = (0.2, 2.0)) -> BayesNet:
    """A random network of ``m`` attributes named ``x0``…; see the module docstring."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {', '.join(STRUCTURES)} (got {structure!r})")
    if m < 1 or sizes[0] < 2 or sizes[1] < sizes[0] or max_parents < 0:
        raise ValueError(f"bad network shape: m={m}, sizes={sizes}, max_parents={max_parents}")
    names = [f"x{i}" for i in range(m)]
    order = [names[i] for i in rng.permutation(m)]
    size = {v: int(rng.integers(sizes[0], sizes[1] + 1)) for v in names}
    parents: dict[str, tuple[str, ...]] = {}
    for i, v in enumerate(order):
        earlier = order[:i]
        if not earlier:
            chosen: list[str] = []
        elif structure == "chain":
            chosen = [earlier[-1]]
        elif structure == "tree":
            chosen = [earlier[int(rng.integers(len(earlier)))]]
        else:
            k = int(rng.integers(0, min(max_parents, len(earlier)) + 1))
            chosen = [earlier[j] for j in sorted(rng.choice(len(earlier), k, replace=False))]
        parents[v] = tuple(chosen)
    cpt = {}
    lo, hi = np.log(alpha[0]), np.log(alpha[1])
    for v in names:
        a = float(np.exp(rng.uniform(lo, hi)))
        shape = tuple(size[p] for p in parents[v]) + (size[v],)
        rows = rng.dirichlet(np.full(size[v], a), size=int(np.prod(shape[:-1], dtype=int)))
        cpt[v] = rows.reshape(shape)
    return BayesNet(tuple(names), {v: tuple(f"s{j}" for j in range(size[v])) for v in names},
                    parents, cpt)


#: named shapes for the benchmark: (structure, sizes, max_parents, alpha range)
SHAPES = {
    "chain-skewed": ("chain", (2, 6), 1, (0.1, 0.5)),
    "tree-mixed": ("tree", (2, 6), 1, (0.2, 2.0)),
    "dag-dense": ("dag", (2, 6), 3, (0.3, 1.0)),
    "dag-weak": ("dag", (3, 6), 2, (1.0, 5.0)),
    # the held-out kinds (bench marginals --generate): skewed rows, near-deterministic rows
    # (most of a row's mass on one value), dense CPTs (three parents, flatter rows)
    "skewed": ("dag", (2, 5), 2, (0.05, 0.3)),
    "near-deterministic": ("dag", (2, 5), 2, (0.01, 0.1)),
    "dense": ("dag", (3, 5), 3, (0.5, 3.0)),
}
#: the shapes ``bench marginals --generate`` cycles through (docs/benchmarks.md "Held-out
#: accuracy")
HELDOUT_KINDS = ("skewed", "near-deterministic", "dense")


def shape_network(name: str, m: int, seed: int) -> BayesNet:
    """The network of shape ``name`` (:data:`SHAPES`) with ``m`` attributes from ``seed``."""
    structure, sizes, parents, alpha = SHAPES[name]
    rng = np.random.default_rng([seed, list(SHAPES).index(name), 7919])
    return random_network(m, rng, structure=structure,
                          sizes=sizes, max_parents=parents, alpha=alpha)
