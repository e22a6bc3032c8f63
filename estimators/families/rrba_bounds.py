"""The calibrated bound of RRBA's pooled eq.-4 estimate (docs/estimators.md "Error bounds").

Block t of a combination's reports goes through P_t[u, v] = p·1[u=v] + (1−p)·T̃_t[v]
(:func:`~.rrba.channel_matrix`); the pooled estimate (:func:`~.rrba.pooled_estimate`) is the
inverse of the count-weighted mean channel M = p·I + (1−p)·1·T̄ᵀ, T̄ = Σ_t n_t·T̃_t / N, on the
summed counts: (o/N − (1−p)·T̄)/p. Its bound is the parametric bootstrap of
estimators/kernels/bounds.py through M (:func:`~.bounds.affine_bound`: every draw inverted in
closed form, no |Ω_S|² matrix): one multinomial of the summed counts from p·ref + (1−p)·T̄,
whose covariance is at least that of the sum of the blocks' multinomials
(Σ_t n_t·λ_tλ_tᵀ ≥ N·λ̄λ̄ᵀ), so the bound errs, if at all, towards covering more.

>>> import numpy as np
>>> c = np.array([[30, 50, 20], [10, 25, 15]])
>>> Tt = np.array([[0.3, 0.3, 0.4], [0.2, 0.5, 0.3]])
>>> b = pooled_bound(c, Tt, 0.6)
>>> 0 < b.tvd < 1, b.low.shape
(True, (3,))
"""
from __future__ import annotations

import numpy as np

from ldpstream.estimators.kernels.bounds import LEVEL, Bound, affine_bound

__all__ = ["pooled_bound"]


def pooled_bound(counts: np.ndarray, T_tildes: np.ndarray, p: float, *,
                 level: float = LEVEL) -> Bound:
    """The bootstrap bound of :func:`~.rrba.pooled_estimate` from the blocks' ``counts`` and
    floored tables ``T_tildes`` (rows: blocks; cells raveled): :func:`~.bounds.affine_bound`
    of M = p·I + (1−p)·1·T̄ᵀ."""
    c = np.asarray(counts, dtype=float)
    t_bar = c.sum(axis=1) @ np.asarray(T_tildes, dtype=float) / c.sum()
    return affine_bound(c.sum(axis=0), p, (1.0 - p) * t_bar, level=level)
