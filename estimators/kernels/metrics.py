"""Distances between an estimated and a true distribution, named exactly as docs/mechanisms.md §7.

* ``tvd`` — ½·Σ|P−Q| (total variation; LoPub's AVD, eq. 32).
* ``max_abs`` — max over cells |P−Q| ([Castell] §III-G's sup; reports average it over subsets).
* ``mae`` / ``mse`` — mean absolute / squared error over cells.
* ``l2_counts`` — ‖n·P − n·Q‖₂ and ``jsd`` — Jensen–Shannon divergence ([RRBA] Tables 5–6).

All take arrays of the same shape (any number of axes).

>>> p, q = np.array([0.5, 0.5, 0.0]), np.array([0.25, 0.25, 0.5])
>>> tvd(p, q), max_abs(p, q), l2_counts(p, q, 4)
(0.5, 0.5, 2.449489742783178)
"""
from __future__ import annotations

import numpy as np

__all__ = ["tvd", "max_abs", "mae", "mse", "jsd", "l2_counts", "METRICS"]


def _pair(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=float)
    q = np.asarray(q, dtype=float)
    if p.shape != q.shape:
        raise ValueError(f"metric: shapes differ: {p.shape} vs {q.shape}")
    if p.size == 0:
        raise ValueError("metric: empty distributions")
    return p, q


def tvd(p: np.ndarray, q: np.ndarray) -> float:
    """Total variation distance ½·Σ|p − q|."""
    p, q = _pair(p, q)
    return float(0.5 * np.abs(p - q).sum())


def max_abs(p: np.ndarray, q: np.ndarray) -> float:
    """Largest absolute cell error max|p − q|."""
    p, q = _pair(p, q)
    return float(np.abs(p - q).max())


def mae(p: np.ndarray, q: np.ndarray) -> float:
    """Mean absolute error over cells."""
    p, q = _pair(p, q)
    return float(np.abs(p - q).mean())


def mse(p: np.ndarray, q: np.ndarray) -> float:
    """Mean squared error over cells."""
    p, q = _pair(p, q)
    return float(np.square(p - q).mean())


def l2_counts(p: np.ndarray, q: np.ndarray, n: float) -> float:
    """‖n·p − n·q‖₂: the L2 distance between the two count tables of n records."""
    p, q = _pair(p, q)
    return float(np.linalg.norm((float(n) * (p - q)).reshape(-1)))


def _kl_to(p: np.ndarray, m: np.ndarray) -> float:
    pos = p > 0  # 0·log(0/m) = 0; m ≥ p/2 > 0 wherever p > 0 ...
    # ... except where p is subnormal and p/2 underflows to 0: there p·log(p/m) → p·ln 2 (m = p/2)
    ratio = np.where(m[pos] > 0, p[pos] / np.where(m[pos] > 0, m[pos], 1.0), 2.0)
    return float(np.sum(p[pos] * np.log(ratio)))


def jsd(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen–Shannon divergence ½·KL(p‖m) + ½·KL(q‖m), m = (p+q)/2, in **nats** (natural log;
    maximum ln 2). Zero cells contribute 0. Both inputs must be non-negative (repair an
    inverse-matrix estimate first, e.g. with :func:`~ldpstream.estimators.kernels.proper.clip_rescale`);
    they are not renormalised."""
    p, q = _pair(p, q)
    if np.any(p < 0) or np.any(q < 0):
        raise ValueError("jsd: distributions must be non-negative (repair the estimate first)")
    m = 0.5 * (p + q)
    return float(max(0.5 * _kl_to(p, m) + 0.5 * _kl_to(q, m), 0.0))


#: metric name → function of (estimate, truth); ``l2_counts`` needs ``n`` and is not listed
METRICS = {"tvd": tvd, "max_abs": max_abs, "mae": mae, "mse": mse, "jsd": jsd}
