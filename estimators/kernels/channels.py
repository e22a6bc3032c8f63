"""Randomization channels (docs/mechanisms.md §1): GRR, Warner-style, validated user matrices.

A channel is a row-stochastic matrix ``P[u, v] = Pr(Y = v | X = u)``. Its ε is computed from the
matrix, never assumed [MDRR eq. 4].

>>> P = grr(np.log(3), 2)
>>> P.round(3).tolist()
[[0.75, 0.25], [0.25, 0.75]]
>>> bool(abs(epsilon(P) - np.log(3)) < 1e-12)
True
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

_TOL = 1e-9


def grr(eps: float, d: int) -> np.ndarray:
    """Generalized randomized response (direct encoding): keep with e^ε/(e^ε+d−1)."""
    p, q = grr_pq(eps, d)
    P = np.full((int(d), int(d)), q)
    np.fill_diagonal(P, p)
    return P


def grr_pq(eps: float, d: int) -> tuple[float, float]:
    """(p, q) of GRR(ε, d) without its d × d matrix."""
    eps = float(eps)
    if not np.isfinite(eps) or eps <= 0:
        raise ValueError(f"epsilon must be a finite number > 0, got {eps!r}")
    if int(d) < 2:
        raise ValueError(f"domain size must be ≥ 2, got {d!r}")
    d = int(d)
    # e^ε/(e^ε+d−1) written to stay finite for large ε
    q = float(1.0 / (np.exp(eps) + d - 1)) if eps < 700 else 0.0
    return 1.0 - (d - 1) * q, q


def warner(p: float, d: int) -> np.ndarray:
    """Warner-style matrix [MDRR §6.3]: keep with p, else uniform over all d values."""
    p = float(p)
    if not 0 < p <= 1:
        raise ValueError(f"Warner keep probability must be in (0, 1], got {p!r}")
    d = int(d)
    if d < 2:
        raise ValueError(f"domain size must be ≥ 2, got {d!r}")
    return p * np.eye(d) + (1 - p) / d * np.ones((d, d))


def validate(P: np.ndarray, d: int | None = None) -> np.ndarray:
    """Return ``P`` as a float array if it is square, row-stochastic, non-negative, non-singular."""
    P = np.asarray(P, dtype=float)
    if P.ndim != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"channel must be a square matrix, got shape {P.shape}")
    if d is not None and P.shape[0] != d:
        raise ValueError(f"channel is {P.shape[0]}×{P.shape[0]} but the attribute has {d} values")
    if P.shape[0] < 2:
        raise ValueError("channel needs at least 2 values")
    if not np.all(np.isfinite(P)) or np.any(P < -_TOL):
        raise ValueError("channel entries must be finite and non-negative")
    if not np.allclose(P.sum(axis=1), 1.0, atol=1e-9):
        raise ValueError("channel rows must sum to 1 (P[u, v] = Pr(Y=v | X=u))")
    if np.linalg.cond(P) > 1e12:
        raise ValueError("channel matrix is singular (not invertible)")
    return np.clip(P, 0.0, None)


def epsilon(P: np.ndarray) -> float:
    """ε(P) = max_v ln(max_u P[u,v] / min_u P[u,v]) [MDRR eq. 4]; ``inf`` if a column has a 0
    next to a positive entry."""
    P = np.asarray(P, dtype=float)
    hi, lo = P.max(axis=0), P.min(axis=0)
    used = hi > 0
    if np.any(lo[used] <= 0):
        return float("inf")
    return float(np.max(np.log(hi[used] / lo[used])))


def epsilon_of_report(channels: Iterable[np.ndarray]) -> float:
    """ε of one report that applies independent channels to disjoint attributes of a record:
    the sum (sequential composition)."""
    return float(sum(epsilon(P) for P in channels))


def randomize(x: np.ndarray, P: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Pass every value of the integer array ``x`` through channel ``P`` (vectorized).

    Exactly GRR-shaped channels (every diagonal entry within 1e-15 relative of P[0,0], every
    off-diagonal one within 1e-15 relative of P[0,1]) use keep-or-shift sampling (two draws per
    value); any other channel — a near-GRR user matrix included — uses inverse-CDF sampling on its
    rows.
    """
    x = np.asarray(x)
    d = P.shape[0]
    p, q = P[0, 0], P[0, 1] if d > 1 else 0.0
    off = ~np.eye(d, dtype=bool)
    if (np.abs(np.diag(P) - p).max() <= 1e-15 * abs(p)
            and np.abs(P[off] - q).max(initial=0.0) <= 1e-15 * abs(q)):
        keep = rng.random(x.shape) < p
        other = rng.integers(0, d - 1, size=x.shape, dtype=x.dtype if x.dtype.kind in "iu" else np.int64)
        other = other + (other >= x)
        return np.where(keep, x, other).astype(x.dtype, copy=False)
    cum = np.cumsum(P, axis=1)
    cum[:, -1] = 1.0
    u = rng.random(x.shape)
    out = (u[..., None] >= cum[x][..., :-1]).sum(axis=-1)
    return out.astype(x.dtype if x.dtype.kind in "iu" else np.int64, copy=False)
