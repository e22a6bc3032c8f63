"""Lasso joint distribution estimation, Lasso JD [LoPub Alg. 2], and Lasso+EM [Alg. 3].

Alg. 2: de-noise the bit counts of every attribute of S, y_j[b] = (ŷ_j[b] − fN/2)/(1−f), divide by
N, and regress the concatenation y on the candidate matrix X whose column ω is the concatenation
of the Bloom filters B_{j,ω_j} (``Σ m_j × Π d_j``), with a non-negative Lasso (scikit-learn);
the coefficients, rescaled to sum 1, are the joint. As docs/mechanisms.md §6 notes, y is a function of
the one-way marginals only (E[y_j] = B_jᵀ·π_j), so Alg. 2 identifies the marginals and returns
*some* sparse joint consistent with them — measured beside the co-occurrence estimator, which does
identify 2-way joints.

Alg. 3: the cells Lasso sets to zero are pruned and EM (Alg. 1) starts from Lasso's estimate on the
rest (see :func:`~ldpstream.estimators.families.lopub_em.em_jd`'s ``init``).

>>> B1 = np.array([[1, 0, 0], [0, 1, 1]]); B2 = np.array([[1, 1, 0, 0], [0, 0, 1, 1]])
>>> design_matrix([B1, B2]).astype(int).tolist()
[[1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1], [1, 0, 1, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 1, 0, 1]]
>>> denoise_bits(np.array([30, 70]), 100, 0.2).tolist()
[25.0, 75.0]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ldpstream.estimators.families.lopub_bloom import _check_f

__all__ = ["design_matrix", "denoise_bits", "lasso_jd"]


def design_matrix(blooms: Sequence[np.ndarray]) -> np.ndarray:
    """``(Σ m_j, Π d_j)`` 0/1 matrix: column ω (C order over S) = concatenated filters of ω."""
    shape = tuple(int(B.shape[0]) for B in blooms)
    idx = np.indices(shape).reshape(len(shape), -1)               # (w, Π d_j)
    return np.concatenate([np.asarray(B, dtype=float).T[:, idx[j]] for j, B in enumerate(blooms)],
                          axis=0)


def denoise_bits(counts: np.ndarray, n: int, f: float) -> np.ndarray:
    """[LoPub §V-C]: y[b] = (ŷ[b] − f·N/2)/(1−f), the estimated count of true set bits."""
    f = _check_f(f)
    return (np.asarray(counts, dtype=float) - f * float(n) / 2) / (1 - f)


def lasso_jd(bit_counts: Sequence[np.ndarray], n: int, blooms: Sequence[np.ndarray], f: float, *,
             alpha: float = 1e-4, max_iter: int = 10000) -> np.ndarray:
    """[LoPub Alg. 2]: non-negative Lasso of the de-noised bit frequencies of S on the candidate
    matrix; returns the joint (shape ``(d_1, …, d_w)``), rescaled to sum 1 (uniform if Lasso
    keeps no cell)."""
    from sklearn.linear_model import Lasso

    if n <= 0:
        raise ValueError("no reports counted (n = 0)")
    shape = tuple(int(B.shape[0]) for B in blooms)
    y = np.concatenate([denoise_bits(c, n, f) for c in bit_counts]) / float(n)
    X = design_matrix(blooms)
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"{y.shape[0]} bit counts for {X.shape[0]} filter bits")
    model = Lasso(alpha=float(alpha), positive=True, fit_intercept=False, max_iter=int(max_iter),
                  selection="cyclic")
    model.fit(X, y)
    beta = np.clip(model.coef_, 0.0, None)
    total = beta.sum()
    if total <= 0:
        return np.full(shape, 1.0 / int(np.prod(shape)))
    return (beta / total).reshape(shape)
