"""Turning an inverse-matrix estimate into a proper probability distribution (docs/mechanisms.md §1).

Two different repairs, named apart:

* :func:`clip_rescale` — the [MDRR §6.4] repair: negatives to 0, then rescale to sum 1.
* :func:`project_simplex` — the Euclidean projection onto the probability simplex
  (sort-and-threshold; Held, Wolfe & Crowder 1974, Duchi et al. 2008): the closest proper
  distribution in L2, ``max(p − θ, 0)`` with the θ that makes it sum to 1.

Both accept any shape and return the same shape.

>>> clip_rescale(np.array([0.6, 0.6, -0.2])).tolist()
[0.5, 0.5, 0.0]
>>> project_simplex(np.array([0.6, 0.6, -0.2])).tolist()
[0.5, 0.5, 0.0]
>>> clip_rescale(np.array([0.9, 0.3, -0.2])).round(4).tolist()
[0.75, 0.25, 0.0]
>>> project_simplex(np.array([0.9, 0.3, -0.2])).round(4).tolist()
[0.8, 0.2, 0.0]
"""
from __future__ import annotations

import numpy as np

__all__ = ["clip_rescale", "project_simplex", "project_simplex_rows"]


def clip_rescale(p: np.ndarray) -> np.ndarray:
    """[MDRR §6.4]: ``max(p, 0) / Σ max(p, 0)``. If no cell is positive, the uniform
    distribution (the repair has nothing to rescale)."""
    p = np.asarray(p, dtype=float)
    if not np.all(np.isfinite(p)):
        raise ValueError("clip_rescale: estimate has non-finite cells")
    q = np.maximum(p, 0.0)
    s = q.sum()
    if s <= 0:
        return np.full(p.shape, 1.0 / max(p.size, 1))
    return q / s


def project_simplex(p: np.ndarray) -> np.ndarray:
    """Euclidean projection of ``p`` (flattened) onto {x ≥ 0, Σx = 1}, by sort-and-threshold:
    with u sorted decreasingly, ρ = max{j : u_j − (Σ_{i≤j} u_i − 1)/j > 0},
    θ = (Σ_{i≤ρ} u_i − 1)/ρ, result max(p − θ, 0)."""
    p = np.asarray(p, dtype=float)
    if p.size == 0:
        return p.copy()
    return project_simplex_rows(p.reshape(1, -1)).reshape(p.shape)


def project_simplex_rows(rows: np.ndarray) -> np.ndarray:
    """:func:`project_simplex` of every row of a 2-d array at once."""
    v = np.asarray(rows, dtype=float)
    if not np.all(np.isfinite(v)):
        raise ValueError("project_simplex: estimate has non-finite cells")
    u = np.sort(v, axis=1)[:, ::-1]
    css = np.cumsum(u, axis=1) - 1.0
    j = np.arange(1, u.shape[1] + 1)
    # the last j with u_j − (Σ_{i≤j} u_i − 1)/j > 0 (j = 1 always qualifies)
    rho = u.shape[1] - 1 - np.argmax((u - css / j > 0)[:, ::-1], axis=1)
    theta = css[np.arange(len(v)), rho] / (rho + 1)
    return np.maximum(v - theta[:, None], 0.0)


def repair(values: np.ndarray, proper: object) -> np.ndarray:
    """The ``proper=`` option of every estimator: falsy → unchanged; ``True`` or ``"clip"`` →
    :func:`clip_rescale` [MDRR §6.4]; ``"simplex"`` → :func:`project_simplex`.

    >>> repair(np.array([0.6, -0.2, 0.6]), "clip").tolist()
    [0.5, 0.0, 0.5]
    """
    if not proper:
        return values
    if proper is True or proper == "clip":
        return clip_rescale(values)
    if proper == "simplex":
        return project_simplex(values)
    raise ValueError(f"proper must be 'clip' or 'simplex', got {proper!r}")
