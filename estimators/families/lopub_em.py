"""EM joint distribution estimation, EM JD [LoPub Alg. 1; docs/mechanisms.md §6].

The likelihood of a flipped report ŝ (restricted to the bits of the attributes S) under a candidate
joint value ω is Π_j Π_b Pr(ŝ_j[b] | B_{j,ω_j}[b]): a bit agrees with the candidate's filter with
1−f/2 and disagrees with f/2. With L = ln((2−f)/f) and Hamming(ŝ_j, B_v) = |ŝ_j| + |B_v| −
2·ŝ_j·B_v,

    ln Pr(ŝ_j | v) = const(ŝ_j) + L·(2·ŝ_j·B_v − |B_v|),

so a report enters the posterior only through its **match vectors** t_j = (ŝ_j·B_v)_v ∈ {0..h}^{d_j}.
We therefore reduce the reports to the table of distinct match-vector tuples with their counts
(:func:`distinct_reports`; ``np.unique``, a sufficient statistic coarser than the packed bits)
and run EM on it: π_{t+1}(ω) = π_t(ω)·(1/N) Σ_k w_k Π_j P_j[k, ω_j] / Σ_ω' π_t(ω') Π_j P_j[k, ω'_j],
from the uniform start (Alg. 1) or a given one (Alg. 3), until ‖π_{t+1} − π_t‖₁ ≤ δ (Alg. 1 leaves
the norm open; L1 does not depend on the number of cells) or ``max_iter``.
The likelihood is a product over attributes, so both sums are two matmuls of Khatri–Rao halves
(no loop over reports).

>>> from ldpstream.estimators.families.lopub_bloom import filters, encode, flip
>>> rng = np.random.default_rng(1)
>>> Ba, Bb = filters(3, 24, 2, 11), filters(2, 16, 2, 12)
>>> x = np.stack([rng.integers(0, 3, 4000), rng.integers(0, 2, 4000)], axis=1)
>>> x[:, 1] = np.where(rng.random(4000) < 0.8, x[:, 0] % 2, x[:, 1])
>>> s = flip(encode(x, [Ba, Bb]), 0.1, rng)
>>> res = em_jd(distinct_reports([s[:, :24], s[:, 24:]], [Ba, Bb]), [Ba, Bb], 0.1)
>>> truth = np.histogram2d(x[:, 0], x[:, 1], bins=[3, 2], range=[[0, 3], [0, 2]])[0] / 4000
>>> bool(0.5 * np.abs(res.joint - truth).sum() < 0.03), res.converged
(True, True)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ldpstream.estimators.families.lopub_bloom import _check_f
from ldpstream.estimators.families.lopub_cooccurrence import kr_product, split_axes

__all__ = ["DistinctReports", "EMResult", "distinct_reports", "match_likelihoods", "em_jd"]

_PRECOMPUTE_LIMIT = 1 << 23      # floats kept for the Khatri–Rao halves (64 MB)
_CHUNK = 4096


@dataclass(frozen=True)
class DistinctReports:
    """Reports restricted to the attributes of S, reduced to distinct match-vector tuples.

    ``tables[j]`` is ``(K_j, d_j)`` (distinct match vectors of attribute j), ``codes`` ``(K, w)``
    rows of indices into them, ``weights`` ``(K,)`` how many reports share each tuple, ``n`` the
    number of reports.
    """

    tables: tuple[np.ndarray, ...]
    codes: np.ndarray
    weights: np.ndarray
    n: int

    @property
    def k(self) -> int:
        return int(self.codes.shape[0])


def distinct_reports(parts: Sequence[np.ndarray], blooms: Sequence[np.ndarray]) -> DistinctReports:
    """Reduce the bit blocks ``parts[j]`` ``(n, m_j)`` of S's attributes to distinct match-vector
    tuples (vectorized: one matmul and one ``np.unique`` per attribute, one for the tuples)."""
    if len(parts) != len(blooms) or not parts:
        raise ValueError("need one bit block per Bloom filter matrix")
    n = parts[0].shape[0]
    tables, inverse = [], []
    for p, B in zip(parts, blooms):
        if p.shape != (n, B.shape[1]):
            raise ValueError(f"bit block of shape {p.shape} does not match filters {B.shape}")
        match = np.rint(p.astype(np.float32) @ B.T.astype(np.float32)).astype(np.int16)
        table, inv = np.unique(match, axis=0, return_inverse=True)
        tables.append(table)
        inverse.append(inv.reshape(-1))
    codes, weights = np.unique(np.stack(inverse, axis=1), axis=0, return_counts=True)
    return DistinctReports(tuple(tables), codes.astype(np.intp), weights.astype(float), int(n))


def match_likelihoods(table: np.ndarray, B: np.ndarray, f: float) -> np.ndarray:
    """Relative likelihoods Pr(ŝ | v) of distinct match vectors ``table`` ``(K_j, d_j)``, scaled
    so that each row's maximum is 1 (the posterior does not depend on a row factor)."""
    f = _check_f(f)
    L = np.log((2 - f) / f)
    ll = L * (2.0 * table - B.sum(axis=1)[None, :])
    return np.exp(ll - ll.max(axis=1, keepdims=True))


@dataclass(frozen=True)
class EMResult:
    joint: np.ndarray
    iterations: int
    converged: bool
    delta: float


def em_jd(reports: DistinctReports, blooms: Sequence[np.ndarray], f: float, *,
          init: np.ndarray | None = None, tol: float = 1e-4, max_iter: int = 1000) -> EMResult:
    """[LoPub Alg. 1] EM over the joint of S from its distinct reports. ``init`` (e.g. Lasso's
    estimate, Alg. 3) fixes the start; its zero cells stay zero."""
    if reports.n <= 0:
        raise ValueError("no reports (n = 0)")
    shape = tuple(int(B.shape[0]) for B in blooms)
    like = [match_likelihoods(t, B, f) for t, B in zip(reports.tables, blooms)]
    w = len(shape)
    split = split_axes(shape)
    DL, DR = int(np.prod(shape[:split])), int(np.prod(shape[split:]))
    if init is None:
        pi = np.full((DL, DR), 1.0 / (DL * DR))
    else:
        pi = np.asarray(init, dtype=float).reshape(DL, DR).clip(0.0, None)
        if pi.sum() <= 0:
            raise ValueError("EM start has no positive cell")
        pi = pi / pi.sum()
    K = reports.k

    def halves(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        c = reports.codes[lo:hi]
        rows = [like[j][c[:, j]] for j in range(w)]
        left = kr_product(rows[:split])
        right = kr_product(rows[split:]) if split < w else np.ones((hi - lo, 1))
        return left, right

    cache = halves(0, K) if K * (DL + DR) <= _PRECOMPUTE_LIMIT else None
    weights = reports.weights
    n = float(reports.n)
    delta, it, converged = np.inf, 0, False
    while it < max_iter:
        it += 1
        num = np.zeros_like(pi)
        for lo in range(0, K, K if cache is not None else _CHUNK):
            hi = min(K, lo + (K if cache is not None else _CHUNK))
            left, right = cache if cache is not None else halves(lo, hi)
            den = np.einsum("kr,kr->k", left @ pi, right)
            num += left.T @ (right * (weights[lo:hi] / np.maximum(den, 1e-300))[:, None])
        new = pi * num / n
        new /= new.sum()
        delta = float(np.abs(new - pi).sum())
        pi = new
        if delta <= tol:
            converged = True
            break
    return EMResult(pi.reshape(shape), it, converged, delta)
