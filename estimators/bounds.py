"""Error bounds with a stated coverage (docs/estimators.md "Error bounds").

``error_bound`` is the upper :data:`LEVEL` (95 %) quantile of the total variation distance
between the unbiased (raw) estimate and the true distribution, and every cell gets a two-sided
95 % interval for its true value. Both come from a parametric bootstrap through the mechanism's
own channel, so they hold at small n too (a plug-in variance of one report is 0; the
bootstrap's is not):

1. the reference distribution ``ref`` is the estimate projected onto the simplex
   (:func:`~.proper.project_simplex`) with half a report added to every cell
   (:func:`reference`);
2. :data:`DRAWS` report tables are drawn from it through the channel: a multinomial of the
   randomized values' distribution ``ref ×₁ P₁ … ×_w P_w`` for product channels and GRR
   (exact, or its normal approximation once every expected count is at least 50); for OLH the fleet simulated report by report at small n, a normal approximation with
   the oracle's covariance ([Wang17] eq. 4 plus the sampling of users) at large n;
3. each draw is estimated as the raw estimate was; the bound is the ⌈level·(S+1)⌉-th smallest
   TVD(draw, ref), the cell interval the raw estimate minus the (1±level)/2 quantiles of
   (draw − ref) (the basic bootstrap interval), clipped to [0, 1].

The same bound is served with the estimate projected onto the simplex: projection removes
noise, and its measured coverage is at least the raw one's (it is conservative there).

The bootstrap is seeded (:data:`SEED`): the same counts give the same bound.

>>> from ldpstream.estimators.channels import grr
>>> b = product_channel_bound(np.array([[1, 0], [0, 0]]), [grr(1.0, 2)] * 2)
>>> b.tvd > 0.5      # one report: a wide bound, not ≈ 0
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .batched import castell_batch, inverses
from .castell import apply_modes, castell, check_inputs
from .frequency_oracles import GRR, Oracle
from .proper import project_simplex

__all__ = ["LEVEL", "DRAWS", "SEED", "Bound", "reference", "bootstrap_bound", "product_channel_bound",
           "oracle_bound", "coarsened"]

#: the coverage every ``error_bound`` states: Pr[TVD(estimate, truth) ≤ bound] ≈ LEVEL
LEVEL = 0.95
#: bootstrap draws per bound
DRAWS = 400
#: the bootstrap's seed (bounds are a function of the counts)
SEED = 20_231
#: largest draws × cells held at once for the per-cell quantiles (float64: 64 MB)
_CELLS_MAX = 1 << 23
#: smallest expected count per cell for drawing the reports' counts by a normal approximation
_NORMAL_FROM = 50.0
#: largest draws × reports × values simulated report by report (OLH at small n)
_SIMULATE_MAX = 1 << 23


@dataclass(frozen=True)
class Bound:
    """``tvd``: the upper ``level`` quantile of the TVD; ``low``/``high``: per-cell ``level``
    intervals (the estimate's shape)."""

    tvd: float
    low: np.ndarray
    high: np.ndarray
    level: float = LEVEL


def _order_stat(t: np.ndarray, level: float) -> float:
    k = min(len(t), math.ceil(level * (len(t) + 1)))
    return float(np.partition(t, k - 1)[k - 1])


def bootstrap_bound(raw: np.ndarray, ref: np.ndarray, draws: np.ndarray,
                    level: float = LEVEL) -> Bound:
    """The bound of the unbiased estimate ``raw`` from unbiased bootstrap ``draws``
    (``(S, cells)``) around ``ref``: the ⌈level·(S+1)⌉-th smallest TVD(draw, ref), and per cell
    the basic bootstrap interval raw − (the (1±level)/2 quantiles of draw − ref), clipped to
    [0, 1] (the truth's range)."""
    raw = np.asarray(raw, dtype=float)
    dev = draws - np.asarray(ref, dtype=float).reshape(1, -1)
    tvd = _order_stat(0.5 * np.abs(dev).sum(axis=1), level)
    flat = raw.reshape(-1)
    if dev.size <= _CELLS_MAX:
        s = np.sort(dev, axis=0)
        lo_q = s[int((len(s) - 1) * (1.0 - level) / 2)]
        hi_q = s[int(math.ceil((len(s) - 1) * (1.0 + level) / 2))]
        low, high = flat - hi_q, flat - lo_q
    else:   # too many cells to keep every draw: |p_c − q_c| ≤ TVD for distributions
        low, high = flat - tvd, flat + tvd
    return Bound(tvd, np.clip(low, 0.0, 1.0).reshape(raw.shape),
                 np.clip(high, 0.0, 1.0).reshape(raw.shape), level)


def reference(raw: np.ndarray, n: float) -> np.ndarray:
    """The bootstrap's distribution: the projected estimate with half a report added to every
    cell (Jeffreys' prior, as a uniform mixture of weight ½k/(n + ½k) for k cells): at small n a
    sparse projection would under-state the spread of the reports; at large n it is the
    projection."""
    proj = project_simplex(np.asarray(raw, dtype=float))
    k = 0.5 * proj.size
    return (float(n) * proj + k / proj.size) / (float(n) + k)


def _multinomial(rng: np.random.Generator, n: int, lam: np.ndarray, draws: int) -> np.ndarray:
    """``draws`` multinomial count vectors of n trials; by their normal approximation (mean nλ,
    covariance n(diag λ − λλᵀ)) once every expected count is at least :data:`_NORMAL_FROM`
    (a tenth of the cost; the bound's coverage is unchanged, tests/test_bounds.py)."""
    lam = np.maximum(lam.reshape(-1), 0.0)
    lam = lam / lam.sum()
    if n * float(lam.min()) < _NORMAL_FROM:
        return rng.multinomial(n, lam, size=draws)
    z = rng.standard_normal((draws, lam.size)) * np.sqrt(lam)
    return n * lam + math.sqrt(n) * (z - np.outer(z.sum(axis=1), lam))


def product_channel_bound(counts: np.ndarray, channels: Sequence[np.ndarray], *,
                          level: float = LEVEL, draws: int = DRAWS, seed: int = SEED) -> Bound:
    """Bound of the Castell estimate of ``counts`` (randomized w-way table, one channel per
    axis; [Castell Alg. 3]): exact multinomial draws of n reports from
    ``ref ×₁ P₁ … ×_w P_w``, ``ref`` the projected estimate."""
    counts, channels = check_inputs(counts, channels)
    n = int(round(float(counts.sum())))
    raw = castell(counts, channels)
    ref = reference(raw, n)
    rng = np.random.default_rng(seed)
    C = _multinomial(rng, max(n, 1), apply_modes(ref, channels), draws)
    est = castell_batch(C.reshape((draws,) + counts.shape), inverses(channels))
    return bootstrap_bound(raw, ref, est.reshape(draws, -1), level)


def _simulated(oracle: Oracle, ref: np.ndarray, n: int, draws: int,
               rng: np.random.Generator) -> np.ndarray:
    """Support counts of ``draws`` simulated fleets of n users drawn from ``ref``."""
    x = rng.choice(ref.size, size=(draws, n), p=ref / ref.sum())
    return np.stack([oracle.supports(oracle.randomize(row, rng)) for row in x])


def oracle_bound(oracle: Oracle, raw: np.ndarray, n: int, *, level: float = LEVEL,
                 draws: int = DRAWS, seed: int = SEED) -> Bound:
    """Bound of a frequency oracle's unbiased estimate ``raw`` ([Wang17] eq. 3) from ``n``
    reports of users drawn from the population (the target is the population's distribution).
    GRR: exact multinomial draws through its channel; other oracles: the fleet simulated
    report by report while draws·n·d ≤ :data:`_SIMULATE_MAX`, else normal draws with covariance
    (diag(v) + diag(f) − ffᵀ)/n, v = (f·p*(1−p*) + (1−f)·q*(1−q*))/(p*−q*)² ([Wang17] eq. 4;
    a report's supports are independent given its value under a random hash)."""
    raw = np.asarray(raw, dtype=float).reshape(-1)
    n = max(int(n), 1)
    ref = reference(raw, n)
    rng = np.random.default_rng(seed)
    p, q = oracle.p_star, oracle.q_star
    if isinstance(oracle, GRR) or draws * n * ref.size <= _SIMULATE_MAX:
        C = (_multinomial(rng, n, ref @ oracle.channel(), draws) if isinstance(oracle, GRR)
             else _simulated(oracle, ref, n, draws, rng))
        est = (C / n - q) / (p - q)
    else:
        v = (ref * p * (1 - p) + (1 - ref) * q * (1 - q)) / (p - q) ** 2
        z1 = rng.standard_normal((draws, ref.size))
        z2 = rng.standard_normal((draws, ref.size)) * np.sqrt(ref)
        sample = z2 - np.outer(z2.sum(axis=1), ref)
        est = ref + (np.sqrt(v) * z1 + sample) / math.sqrt(n)
    return bootstrap_bound(raw, ref, est, level)


def coarsened(bound: Bound, cells: np.ndarray) -> Bound:
    """The bound of a sub-marginal (``cells``: its summed estimate): the TVD bound carries over
    (summing never increases the L1 distance) and, since |p_c − q_c| ≤ TVD for distributions,
    every cell's interval is the estimate ± the bound, clipped to [0, 1]."""
    cells = np.asarray(cells, dtype=float)
    return Bound(bound.tvd, np.clip(cells - bound.tvd, 0.0, 1.0),
                 np.clip(cells + bound.tvd, 0.0, 1.0), bound.level)
