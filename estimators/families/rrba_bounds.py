"""The calibrated bound of RRBA's pooled eq.-4 estimate (docs/estimators.md "Error bounds").

Block t of a combination's reports goes through P_t[u, v] = p·1[u=v] + (1−p)·T̃_t[v]
(:func:`~.rrba.channel_matrix`); the pooled estimate (:func:`~.rrba.pooled_estimate`) is the
inverse of the count-weighted mean channel M = Σ_t n_t·P_t / N applied to the summed counts
(M = p·I + (1−p)·1·T̄ᵀ with T̄ = Σ_t n_t·T̃_t / N). Its bound is the parametric bootstrap of
estimators/kernels/bounds.py through M: one multinomial of the summed counts, whose covariance
is at least that of the sum of the blocks' multinomials (Σ_t n_t·λ_tλ_tᵀ ≥ N·λ̄λ̄ᵀ), so the
bound errs, if at all, towards covering more.

>>> import numpy as np
>>> from ldpstream.estimators.families.rrba import pooled_estimate
>>> from ldpstream.estimators.kernels.castell import castell
>>> c = np.array([[30., 50., 20.], [10., 25., 15.]])
>>> Tt = np.array([[0.3, 0.3, 0.4], [0.2, 0.5, 0.3]])
>>> bool(np.allclose(castell(c.sum(axis=0), [mean_channel(c, Tt, 0.6)]),
...                  pooled_estimate(c, Tt, 0.6)))
True
"""
from __future__ import annotations

import numpy as np

from ldpstream.estimators.kernels.bounds import Bound, product_channel_bound

__all__ = ["mean_channel", "pooled_bound"]


def mean_channel(counts: np.ndarray, T_tildes: np.ndarray, p: float) -> np.ndarray:
    """M = p·I + (1−p)·1·T̄ᵀ, T̄ the mean of the blocks' floored tables ``T_tildes`` (rows)
    weighted by their reports (rows of ``counts``)."""
    n_t = np.asarray(counts, dtype=float).sum(axis=1)
    t_bar = n_t @ np.asarray(T_tildes, dtype=float) / n_t.sum()
    return p * np.eye(t_bar.size) + (1.0 - p) * np.tile(t_bar, (t_bar.size, 1))


def pooled_bound(counts: np.ndarray, T_tildes: np.ndarray, p: float) -> Bound:
    """The bootstrap bound of :func:`~.rrba.pooled_estimate` (cells raveled, as the counts)."""
    c = np.asarray(counts, dtype=float)
    return product_channel_bound(c.sum(axis=0), [mean_channel(c, T_tildes, p)])
