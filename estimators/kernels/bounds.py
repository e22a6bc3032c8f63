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
   (exact, or its normal approximation once every expected count is at least 50); for OLH the
   fleet simulated report by report at small n, a normal approximation with the oracle's covariance
   ([Wang17] eq. 4 plus the sampling of users) at large n;
3. each draw is estimated as the raw estimate was; the bound is the ⌈level·(S+1)⌉-th smallest
   TVD(draw, ref), the cell interval the raw estimate minus the (1±level)/2 quantiles of
   (draw − ref) (the basic bootstrap interval), clipped to [0, 1].

The same bound is served with the estimate projected onto the simplex: projection removes
noise, and its measured coverage is at least the raw one's (it is conservative there).

A biased estimate e (a product of marginals, IBU, EM, lasso, …) of a marginal that an unbiased
estimate u also estimates gets :func:`triangle`: TVD(e, truth) ≤ TVD(e, u) + TVD(u, truth), so
TVD(e, u) plus u's bound covers at least as often as u's bound does (``coverage``
:data:`AT_LEAST`). A weighted mean of independent unbiased estimates gets :func:`mixture`.

The bootstrap is seeded by :data:`SEED` and the table itself (:func:`stream`): the same counts
give the same bound, and different tables draw from different streams. One stream for every
table would make the coverage conditional on that stream: with a fixed seed, the bootstrap's
own Monte Carlo error does not average out over the tables a deployment serves (measured:
89–91 % instead of 95 % for one table shape at n = 20,000).

>>> from ldpstream.estimators.kernels.channels import grr
>>> b = product_channel_bound(np.array([[1, 0], [0, 0]]), [grr(1.0, 2)] * 2)
>>> b.tvd > 0.5      # one report: a wide bound, not ≈ 0
True
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ldpstream.estimators.kernels.batched import batch_modes, inverses
from ldpstream.estimators.kernels.castell import check_inputs
from ldpstream.estimators.kernels.proper import project_simplex
from ldpstream.estimators.oracles.frequency_oracles import GRR, Oracle

__all__ = ["LEVEL", "DRAWS", "SEED", "SIMULATE_MAX", "CALIBRATED", "AT_LEAST", "CHANNEL",
           "TRIANGLE", "NO_REPORTS", "MIXTURE", "Bound", "normal_estimates",
           "reference", "stream", "multinomial", "bootstrap_bound", "product_channel_bound",
           "product_channel_bounds", "oracle_bound", "affine_bound", "coarsened", "triangle",
           "unbounded", "split_level", "mixture"]

#: the coverage every ``error_bound`` states: Pr[TVD(estimate, truth) ≤ bound] ≈ LEVEL
LEVEL = 0.95
#: ``Bound.coverage`` of the bootstrap's own quantile: Pr[TVD ≤ bound] ≈ LEVEL (measured)
CALIBRATED = "calibrated"
#: ``Bound.coverage`` of a bound that covers at least LEVEL (by construction, or a proxy
#: measured to over-cover)
AT_LEAST = "at least"
#: bootstrap draws per bound
DRAWS = 100
#: ``Bound.method`` (the API's ``error_bound_method``) of each way a bound is obtained
CHANNEL = (f"bootstrap of the unbiased estimate: {DRAWS} draws through the mechanism's channel "
           f"from the projected estimate")
TRIANGLE = "the unbiased estimate's bound plus this estimate's distance to it"
NO_REPORTS = ("none from the reports: 1, the largest distance between two distributions, plus "
              "the estimate's distance to the simplex")
MIXTURE = "union bound: the weighted sum of the combined estimates' bounds"
#: the bootstrap's seed (bounds are a function of the counts)
SEED = 20_231
#: largest draws × cells held at once for the per-cell quantiles (float64: 64 MB)
_CELLS_MAX = 1 << 23
#: largest table whose castell inverse is applied as one Kronecker matrix
_KRON_MAX = 512
#: smallest expected count per cell for drawing the reports' counts by a normal approximation
_NORMAL_FROM = 50.0
#: largest draws × reports × values simulated report by report (OLH at small n)
SIMULATE_MAX = 1 << 23


@dataclass(frozen=True)
class Bound:
    """``tvd``: the upper ``level`` quantile of the TVD; ``low``/``high``: per-cell ``level``
    intervals (the estimate's shape); ``coverage``: :data:`CALIBRATED` or :data:`AT_LEAST`
    (``tvd`` covers at least ``level``); ``method``: how it was obtained, in words."""

    tvd: float
    low: np.ndarray
    high: np.ndarray
    level: float = LEVEL
    coverage: str = CALIBRATED
    method: str = CHANNEL


def stream(seed: int, table: np.ndarray) -> np.random.Generator:
    """The bootstrap's generator for one table: seeded by ``seed`` and a hash of the table's
    values (deterministic: a function of the counts)."""
    h = hashlib.blake2b(np.ascontiguousarray(table, dtype=float).tobytes(), digest_size=8)
    return np.random.default_rng([int(seed), int.from_bytes(h.digest(), "little")])


def _order_stat(t: np.ndarray, level: float) -> float:
    k = min(len(t), math.ceil(level * (len(t) + 1)))
    return float(np.partition(t, k - 1)[k - 1])


def _bounds(raws: np.ndarray, refs: np.ndarray, draws: np.ndarray, level: float
            ) -> list[Bound]:
    """:func:`bootstrap_bound` of B tables at once: ``raws``/``refs`` ``(B, k)``, ``draws``
    ``(B, S, k)``."""
    dev = draws - refs[:, None, :]
    S = dev.shape[1]
    k = min(S, math.ceil(level * (S + 1))) - 1
    tvd = np.partition(0.5 * np.abs(dev).sum(axis=2), k, axis=1)[:, k]
    if dev[0].size <= _CELLS_MAX:
        lo, hi = int((S - 1) * (1.0 - level) / 2), int(math.ceil((S - 1) * (1.0 + level) / 2))
        s = np.partition(dev, [lo, hi], axis=1)
        low, high = raws - s[:, hi], raws - s[:, lo]
    else:   # too many cells to keep every draw: |p_c − q_c| ≤ TVD for distributions
        low, high = raws - tvd[:, None], raws + tvd[:, None]
    low, high = np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)
    return [Bound(float(tvd[i]), low[i], high[i], level) for i in range(len(raws))]


def bootstrap_bound(raw: np.ndarray, ref: np.ndarray, draws: np.ndarray,
                    level: float = LEVEL) -> Bound:
    """The bound of the unbiased estimate ``raw`` from unbiased bootstrap ``draws``
    (``(S, cells)``) around ``ref``: the ⌈level·(S+1)⌉-th smallest TVD(draw, ref), and per cell
    the basic bootstrap interval raw − (the (1±level)/2 quantiles of draw − ref), clipped to
    [0, 1] (the truth's range)."""
    raw = np.asarray(raw, dtype=float)
    b = _bounds(raw.reshape(1, -1), np.asarray(ref, dtype=float).reshape(1, -1),
                np.asarray(draws, dtype=float)[None], level)[0]
    return Bound(b.tvd, b.low.reshape(raw.shape), b.high.reshape(raw.shape), level)


def reference(raw: np.ndarray, n: float) -> np.ndarray:
    """The bootstrap's distribution: the projected estimate with half a report added to every
    cell (Jeffreys' prior, as a uniform mixture of weight ½k/(n + ½k) for k cells): at small n a
    sparse projection would under-state the spread of the reports; at large n it is the
    projection."""
    proj = project_simplex(np.asarray(raw, dtype=float))
    k = 0.5 * proj.size
    return (float(n) * proj + k / proj.size) / (float(n) + k)


def multinomial(rng: np.random.Generator, n: int, lam: np.ndarray, draws: int) -> np.ndarray:
    """``draws`` multinomial count vectors of n trials; by their normal approximation (mean nλ,
    covariance n(diag λ − λλᵀ)) once every expected count is at least :data:`_NORMAL_FROM`
    (a tenth of the cost; the bound's coverage is unchanged, tests/test_bounds.py)."""
    lam = np.maximum(lam.reshape(-1), 0.0)
    lam = lam / lam.sum()
    if n * float(lam.min()) < _NORMAL_FROM:
        return rng.multinomial(n, lam, size=draws)
    z = rng.standard_normal((draws, lam.size)) * np.sqrt(lam)
    return n * lam + math.sqrt(n) * (z - np.outer(z.sum(axis=1), lam))


def _castell_shared(C: np.ndarray, invs: Sequence[np.ndarray]) -> np.ndarray:
    """:func:`~.batched.castell_batch` of a stack of tables sharing every channel: one matrix
    product over the whole stack — by the Kronecker product of the inverses for tables of at
    most :data:`_KRON_MAX` cells, else one per axis (many tiny products are slow)."""
    X = C / C.reshape(len(C), -1).sum(axis=1).reshape((-1,) + (1,) * (C.ndim - 1))
    if X[0].size <= _KRON_MAX:
        K = invs[0]
        for Q in invs[1:]:
            K = np.kron(K, Q)
        return (X.reshape(len(X), -1) @ K).reshape(X.shape)
    for ax, Q in enumerate(invs):
        X = np.moveaxis(np.tensordot(X, Q, axes=([ax + 1], [0])), -1, ax + 1)
    return X


def product_channel_bounds(tables: np.ndarray, channels: Sequence[np.ndarray], *,
                           level: float = LEVEL, draws: int = DRAWS, seed: int = SEED
                           ) -> list[Bound]:
    """Bounds of the Castell estimates of B randomized w-way tables ``(B, d₁, …, d_w)``
    sharing one channel per axis ([Castell Alg. 3]): per table, multinomial draws of its n
    reports from ``ref ×₁ P₁ … ×_w P_w`` (``ref``: :func:`reference`), each table's from its
    own generator (:func:`stream` of ``seed`` and its counts: a table's bound does not
    depend on the others), then every
    draw of every table estimated and ranked in a few array operations."""
    T = np.asarray(tables, dtype=float)
    B, shape = T.shape[0], T.shape[1:]
    invs = inverses(channels)
    n = np.rint(T.reshape(B, -1).sum(axis=1)).astype(np.int64)
    raws = _castell_shared(T, invs).reshape(B, -1)
    refs = np.stack([reference(r, k) for r, k in zip(raws, n)])
    lams = batch_modes(refs.reshape(T.shape), channels).reshape(B, -1)
    out: list[Bound] = []
    cells = raws.shape[1]
    if draws * cells > _CELLS_MAX:   # large tables: draws in chunks, TVD only
        return [_large_bound(raws[i], refs[i], lams[i], int(n[i]), shape, invs, level, draws,
                             stream(seed, T[i])) for i in range(B)]
    step = max(1, _CELLS_MAX // (draws * cells))
    for s0 in range(0, B, step):
        idx = range(s0, min(B, s0 + step))
        C = np.stack([multinomial(stream(seed, T[i]), max(int(n[i]), 1), lams[i],
                                   draws) for i in idx])
        est = _castell_shared(C.reshape((-1,) + shape), invs).reshape(len(idx), draws, -1)
        out += _bounds(raws[s0:s0 + len(idx)], refs[s0:s0 + len(idx)], est, level)
    return [Bound(b.tvd, b.low.reshape(shape), b.high.reshape(shape), level) for b in out]


def _large_bound(raw: np.ndarray, ref: np.ndarray, lam: np.ndarray, n: int,
                 shape: tuple[int, ...], invs: Sequence[np.ndarray], level: float, draws: int,
                 rng: np.random.Generator) -> Bound:
    """A table too large to hold every draw: the TVDs of chunks of draws, and per cell the
    estimate ± the TVD bound (|p_c − q_c| ≤ TVD for distributions)."""
    chunk = max(1, _CELLS_MAX // raw.size)
    tv = []
    for c0 in range(0, draws, chunk):
        m = min(chunk, draws - c0)
        est = _castell_shared(multinomial(rng, max(n, 1), lam, m).reshape((m,) + shape), invs)
        tv.append(0.5 * np.abs(est.reshape(m, -1) - ref).sum(axis=1))
    t = np.concatenate(tv)
    tvd = float(np.partition(t, min(draws, math.ceil(level * (draws + 1))) - 1)[
        min(draws, math.ceil(level * (draws + 1))) - 1])
    return Bound(tvd, np.clip(raw - tvd, 0.0, 1.0).reshape(shape),
                 np.clip(raw + tvd, 0.0, 1.0).reshape(shape), level)


def product_channel_bound(counts: np.ndarray, channels: Sequence[np.ndarray], *,
                          level: float = LEVEL, draws: int = DRAWS, seed: int = SEED) -> Bound:
    """:func:`product_channel_bounds` of one table."""
    counts, channels = check_inputs(counts, channels)
    return product_channel_bounds(counts[None], channels, level=level, draws=draws,
                                  seed=seed)[0]


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
    report by report while draws·n·d ≤ :data:`SIMULATE_MAX`, else normal draws with covariance
    (diag(v) + diag(f) − ffᵀ)/n, v = (f·p*(1−p*) + (1−f)·q*(1−q*))/(p*−q*)² ([Wang17] eq. 4;
    a report's supports are independent given its value under a random hash)."""
    raw = np.asarray(raw, dtype=float).reshape(-1)
    n = max(int(n), 1)
    ref = reference(raw, n)
    rng = stream(seed, np.concatenate([raw, [n]]))
    p, q = oracle.p_star, oracle.q_star
    if isinstance(oracle, GRR):   # the affine channel (p − q)·I + 1·qᵀ, no d × d matrix
        return _affine(rng, raw, ref, n, p - q, np.full(ref.shape, q), draws, level)
    if draws * n * ref.size <= SIMULATE_MAX:
        est = (_simulated(oracle, ref, n, draws, rng) / n - q) / (p - q)
    else:
        est = normal_estimates(oracle, ref, n, draws, rng)
    return bootstrap_bound(raw, ref, est, level)


def normal_estimates(oracle: Oracle, ref: np.ndarray, n: int, draws: int,
                     rng: np.random.Generator) -> np.ndarray:
    """``draws`` unbiased estimates ``(draws, cells)`` of ``oracle`` from ``n`` users drawn from
    ``ref``, by their normal approximation: covariance (diag(v) + diag(ref) − ref·refᵀ)/n,
    v = (ref·p*(1−p*) + (1−ref)·q*(1−q*))/(p*−q*)² ([Wang17] eq. 4 plus the sampling of users)."""
    p, q = oracle.p_star, oracle.q_star
    v = (ref * p * (1 - p) + (1 - ref) * q * (1 - q)) / (p - q) ** 2
    z1 = rng.standard_normal((draws, ref.size))
    z2 = rng.standard_normal((draws, ref.size)) * np.sqrt(ref)
    sample = z2 - np.outer(z2.sum(axis=1), ref)
    return ref + (np.sqrt(v) * z1 + sample) / math.sqrt(n)


def coarsened(bound: Bound, cells: np.ndarray) -> Bound:
    """The bound of a sub-marginal (``cells``: its summed estimate): the TVD bound carries over
    (summing never increases the L1 distance) and, since |p_c − q_c| ≤ TVD for distributions,
    every cell's interval is the estimate ± the bound, clipped to [0, 1]."""
    cells = np.asarray(cells, dtype=float)
    return Bound(bound.tvd, np.clip(cells - bound.tvd, 0.0, 1.0),
                 np.clip(cells + bound.tvd, 0.0, 1.0), bound.level, bound.coverage, bound.method)


def affine_bound(counts: np.ndarray, alpha: float, beta: np.ndarray, *, level: float = LEVEL,
                 draws: int = DRAWS, seed: int = SEED) -> Bound:
    """The bound of the inverse of a channel Q = α·I + 1·βᵀ (GRR: α = p − q, β = q; RRBA's
    mean channel; RS+FD's sampled-or-fake column) on ``counts``, a multinomial of f·Q = α·f + β:
    raw = (counts/n − β)/α, the draws inverted the same way (no d × d matrix)."""
    c = np.asarray(counts, dtype=float).reshape(-1)
    beta = np.broadcast_to(np.asarray(beta, dtype=float), c.shape)
    n = float(c.sum())
    raw = (c / n - beta) / alpha
    ref = reference(raw, n)
    return _affine(stream(seed, c), raw, ref, n, alpha, beta, draws, level)


def _affine(rng: np.random.Generator, raw: np.ndarray, ref: np.ndarray, n: float,
            alpha: float, beta: np.ndarray, draws: int, level: float) -> Bound:
    """The bootstrap of :func:`affine_bound`: ``draws`` multinomials of ref·Q = α·ref + β from
    ``rng``, inverted as ``raw`` was."""
    drawn = multinomial(rng, max(int(round(n)), 1), alpha * ref + beta, draws)
    return bootstrap_bound(raw, ref, (drawn / n - beta) / alpha, level)


def triangle(estimate: np.ndarray, unbiased: np.ndarray, bound: Bound) -> Bound:
    """The bound of a biased ``estimate`` of the marginal that ``unbiased`` (raw, same cells)
    estimates with ``bound``: TVD(estimate, truth) ≤ TVD(estimate, unbiased) + TVD(unbiased,
    truth), so ``bound.tvd`` + TVD(estimate, unbiased) covers at least as often as ``bound``
    (:data:`AT_LEAST`), capped at 1 when ``estimate`` is a distribution (so is the truth). The
    cells keep the unbiased estimate's intervals (they are for the true cells)."""
    e = np.asarray(estimate, dtype=float)
    u = np.asarray(unbiased, dtype=float).reshape(e.shape)
    tvd = bound.tvd + 0.5 * float(np.abs(e - u).sum())
    if np.all(e >= 0) and abs(float(e.sum()) - 1.0) <= 1e-9:
        tvd = min(tvd, 1.0)
    return Bound(tvd, bound.low.reshape(e.shape), bound.high.reshape(e.shape), bound.level,
                 AT_LEAST, TRIANGLE)


def unbounded(estimate: np.ndarray, level: float = LEVEL) -> Bound:
    """The bound of an estimate with no reports to bound it by: TVD(e, truth) ≤ TVD(e, Π(e)) +
    TVD(Π(e), truth) ≤ TVD(e, Π(e)) + 1 with Π the projection onto the simplex (always
    holds: :data:`AT_LEAST`); every cell in [0, 1]."""
    e = np.asarray(estimate, dtype=float)
    return replace(triangle(e, project_simplex(e.reshape(-1)),
                            Bound(1.0, np.zeros(e.shape), np.ones(e.shape), level, AT_LEAST)),
                   method=NO_REPORTS)


def split_level(k: int, level: float = LEVEL) -> float:
    """The level each of ``k`` bounds needs for all of them to hold together with probability
    at least ``level`` (the union bound): 1 − (1 − level)/k."""
    return 1.0 - (1.0 - level) / k


def mixture(weights: Sequence[float], bounds: Sequence[Bound], level: float = LEVEL) -> Bound:
    """The bound of Σ wᵢuᵢ (weights summing to 1) from bounds of the unbiased uᵢ at
    :func:`split_level` (k = len(bounds)): TVD(Σ wᵢuᵢ, truth) ≤ Σ wᵢ TVD(uᵢ, truth) ≤ Σ wᵢ·boundᵢ
    whenever every bound holds, which is at least ``level`` (:data:`AT_LEAST`); likewise the
    cells' Σ wᵢ·lowᵢ and Σ wᵢ·highᵢ."""
    w = np.asarray(weights, dtype=float)
    return Bound(float(w @ [b.tvd for b in bounds]),
                 np.tensordot(w, np.stack([b.low for b in bounds]), axes=1),
                 np.tensordot(w, np.stack([b.high for b in bounds]), axes=1), level, AT_LEAST,
                 MIXTURE)
