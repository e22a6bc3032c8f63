"""Seeded Monte Carlo of memoized reporting (tests/test_memo_*.py): devices holding fixed
records, each reporting R times in one rotation period (one permanent response, R instantaneous
draws), and the check that an estimate's mean over seeds is unbiased."""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from ldpstream.estimators.kernels import numeric as nm
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.mechanism import Mechanism, mechanism_class

#: a (firmware, battery) record: battery numeric on [0, 100], a grid of NUMERIC_GRID points
NUMERIC_GRID = 257
NUMERIC_DOMAIN = Domain(("fw", "battery"), (3, NUMERIC_GRID),
                        (("a", "b", "c"), nm.numeric_labels(0, 100, NUMERIC_GRID)),
                        (None, (0.0, 100.0)))


def memoized_numeric(eps: float = 1.0, version: int = 0, **params) -> Mechanism:
    """`sw-hm` over :data:`NUMERIC_DOMAIN`, memoized for a day (``params`` added)."""
    return mechanism_class("sw-hm").from_config(
        NUMERIC_DOMAIN, {"memoize": {"rotation_s": 86400}, **params}, epsilon=eps,
        version=version)


def memoized_estimates(mech: Mechanism, pop: np.ndarray, reports: int, seeds: int, seed: int,
                       estimate: Callable[[Mapping[str, np.ndarray]], np.ndarray],
                       marginals: Sequence[Sequence[str]] = ()) -> np.ndarray:
    """``estimate(counts)`` for every seed; each seed's devices get new ids (a new
    assignment where the family assigns by device)."""
    memo = mech.memoization()
    assert memo is not None
    n = len(pop)
    out = []
    for s in range(seeds):
        rng = np.random.default_rng([seed, s])
        perm = memo.responses(pop, np.arange(n) + s * n, 0, rng)
        rep = memo.instantaneous(np.repeat(perm, reports, axis=0), rng)
        out.append(np.ravel(estimate(mech.count(rep, mech.tensors(marginals)))))
    return np.array(out)


def assert_unbiased(ests: np.ndarray, truth: np.ndarray, k: float = 4.0) -> None:
    """The mean over seeds within ``k`` standard errors (of that mean) of ``truth``, cell by
    cell."""
    se = ests.std(axis=0, ddof=1) / math.sqrt(len(ests))
    gap = np.abs(ests.mean(axis=0) - np.ravel(truth))
    assert np.all(gap <= k * se + 1e-12), gap / se
