"""RR-Adjustment [MDRR §5, Alg. 2] as raking (iterative proportional fitting) on the table of
distinct randomized patterns (docs/mechanisms.md §3).

Alg. 2 gives every randomized record the weight 1/n and, for each attribute j in turn, multiplies
the weight of every record with y_j = k by π̂ʲ_k / s_k (s_k = current weight sum of those records),
until the weighted marginals match the targets π̂ʲ (the proper RR-Independent marginal estimates).
Records with the same randomized values get the same weight, so the loop runs on the distinct
patterns with their counts (``np.unique``) — the cost is per pattern, not per record. A joint
estimate over any subset of attributes is the weight summed into the cells of the *randomized*
values of that subset (this is what Alg. 2 returns: weights on the randomized records).

Targets may also be joint tables over groups of columns (RR-Clusters: one target per cluster).

Worked check (a constructed stand-in for [MDRR] Example 1, not the paper's numbers; see
tests/test_rr_family.py): two binary attributes, randomized records
3 × (0,0) and 1 × (1,1), both attributes through P = [[0.9, 0.1], [0.6, 0.4]] (ε = ln 4), so the
RR-Independent marginal estimates are exactly (½, ½); Alg. 2 moves the weights from (¼·3, ¼) to
(½, ½) and the adjusted joint is [[½, 0], [0, ½]] after one sweep.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["distinct_patterns", "AdjustmentResult", "rr_adjustment", "adjusted_marginal",
           "rr_adjustment_table"]


def distinct_patterns(records: np.ndarray, shape: Sequence[int] | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(patterns, counts, inverse)`` of the distinct rows of an integer ``(n, m)`` array.

    With ``shape`` (the domain sizes) rows are encoded as one int64 first, which is much faster
    than ``np.unique(axis=0)``; patterns come out in C order of the encoded cell either way."""
    records = np.asarray(records)
    if shape is not None and float(np.prod([float(s) for s in shape])) < 2 ** 62:
        shape = tuple(int(s) for s in shape)
        codes = np.ravel_multi_index(tuple(records[:, j].astype(np.intp)
                                           for j in range(records.shape[1])), shape)
        uniq, inverse, counts = np.unique(codes, return_inverse=True, return_counts=True)
        patterns = np.stack(np.unravel_index(uniq, shape), axis=1).astype(records.dtype)
        return patterns, counts, inverse.reshape(-1)
    patterns, inverse, counts = np.unique(records, axis=0, return_inverse=True,
                                          return_counts=True)
    return patterns, counts, inverse.reshape(-1)


@dataclass(frozen=True)
class AdjustmentResult:
    """Weights of the distinct patterns (sum 1), sweeps run, whether the raking converged, and
    ``gap``, the largest remaining |weighted marginal − target| cell.

    Converged means: every target is met within ``tol``, or the weights stopped moving (a
    fixed point). The second case happens when the targets cannot all be met on the observed
    patterns — e.g. a target cell > 0 whose only patterns carry a cell another target sets to 0 —
    and ``gap`` then says by how much they are missed."""

    weights: np.ndarray
    iterations: int
    converged: bool
    gap: float


def _targets(targets, m: int) -> list[tuple[tuple[int, ...], np.ndarray]]:
    out = []
    for j, t in enumerate(targets):
        if isinstance(t, tuple) and len(t) == 2 and not np.isscalar(t[0]):
            cols, table = t
            out.append((tuple(int(c) for c in cols), np.asarray(table, dtype=float)))
        else:
            out.append(((j,), np.asarray(t, dtype=float)))
    for cols, table in out:
        if any(c < 0 or c >= m for c in cols) or table.ndim != len(cols):
            raise ValueError(f"target over columns {cols} has shape {table.shape}")
        if np.any(table < 0) or not np.isclose(table.sum(), 1.0, atol=1e-6):
            raise ValueError("targets must be proper distributions (clip-rescale them first)")
    return out


def rr_adjustment(patterns: np.ndarray, counts: np.ndarray, targets, *, tol: float = 1e-9,
                  max_iter: int = 1000) -> AdjustmentResult:
    """[MDRR] Alg. 2 on distinct ``patterns`` (``(k, m)``) with record ``counts`` (``(k,)``).

    ``targets``: one proper marginal per column (``targets[j]`` over column j), or a list of
    ``(columns, table)`` pairs for joint targets. One iteration is one sweep over the targets;
    it stops when after a sweep every weighted marginal is within ``tol`` of its target, or no
    weight moved by more than ``tol``·max(weight) in the sweep (see :class:`AdjustmentResult`).
    """
    patterns = np.asarray(patterns)
    counts = np.asarray(counts, dtype=float)
    if patterns.ndim != 2 or len(patterns) != len(counts):
        raise ValueError("patterns must be (k, m) with one count per pattern")
    tg = _targets(targets, patterns.shape[1])
    codes = [np.ravel_multi_index(tuple(patterns[:, c].astype(np.intp) for c in cols), t.shape)
             for cols, t in tg]
    w = counts / counts.sum()
    gap = np.inf
    it = 0
    for it in range(1, int(max_iter) + 1):
        w_prev = w
        for code, (_cols, t) in zip(codes, tg):
            s = np.bincount(code, weights=w, minlength=t.size)
            factor = np.divide(t.ravel(), s, out=np.zeros(t.size), where=s > 0)
            w = w * factor[code]
        total = w.sum()
        if total > 0:
            w = w / total
        gap = max(float(np.abs(np.bincount(code, weights=w, minlength=t.size) - t.ravel()).max())
                  for code, (cols, t) in zip(codes, tg))
        if gap < tol or float(np.abs(w - w_prev).max()) < tol * float(w.max()):
            return AdjustmentResult(w, it, True, gap)
    return AdjustmentResult(w, it, False, gap)


def adjusted_marginal(patterns: np.ndarray, weights: np.ndarray, columns: Sequence[int],
                      shape: Sequence[int]) -> np.ndarray:
    """The adjusted joint over ``columns``: pattern weights summed into the cells of their
    randomized values on those columns."""
    patterns = np.asarray(patterns)
    shape = tuple(int(s) for s in shape)
    code = np.ravel_multi_index(tuple(patterns[:, c].astype(np.intp) for c in columns), shape)
    return np.bincount(code, weights=weights, minlength=int(np.prod(shape))).reshape(shape)


def rr_adjustment_table(counts: np.ndarray, targets, *, tol: float = 1e-9,
                        max_iter: int = 1000) -> tuple[np.ndarray, AdjustmentResult]:
    """Alg. 2 on a dense count table of randomized values (its non-zero cells are the distinct
    patterns). Returns the adjusted table (same shape, sums to 1) and the raking result."""
    counts = np.asarray(counts)
    nz = np.flatnonzero(counts)
    patterns = np.stack(np.unravel_index(nz, counts.shape), axis=1)
    res = rr_adjustment(patterns, counts.ravel()[nz], targets, tol=tol, max_iter=max_iter)
    out = np.zeros(counts.size)
    out[nz] = res.weights
    return out.reshape(counts.shape), res
