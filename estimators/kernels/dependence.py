"""Dependence between categorical attributes [MDRR §4.1] (docs/mechanisms.md §3).

Cramér's V for nominal attributes, |Pearson r| (category index as score) for ordinal ones, both
computed from a contingency table built with one ``bincount``. [MDRR] measures dependence on the
*randomized* data of an RR-Independent round: randomized response attenuates dependence but keeps
its ranking, which is all Alg. 1 needs.

>>> t = np.array([[10, 0], [0, 10]])
>>> cramers_v_table(t), pearson_abs_table(t)
(1.0, 1.0)
>>> round(cramers_v_table(np.array([[5, 5], [5, 5]])), 12)
0.0
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

__all__ = ["contingency", "cramers_v_table", "pearson_abs_table", "cramers_v", "pearson_abs",
           "dependence_matrix", "dependence_from_tables"]


def contingency(x: np.ndarray, y: np.ndarray, dx: int | None = None,
                dy: int | None = None) -> np.ndarray:
    """The ``dx × dy`` table of counts of the integer pairs ``(x[i], y[i])``."""
    x = np.asarray(x, dtype=np.intp)
    y = np.asarray(y, dtype=np.intp)
    if x.shape != y.shape:
        raise ValueError(f"columns differ in length: {x.shape} vs {y.shape}")
    dx = int(x.max()) + 1 if dx is None else int(dx)
    dy = int(y.max()) + 1 if dy is None else int(dy)
    return np.bincount(x * dy + y, minlength=dx * dy).reshape(dx, dy)


def cramers_v_table(table: np.ndarray) -> float:
    """Cramér's V = sqrt(χ² / (n·(min(r, c) − 1))) of a two-way table.

    Empty rows and columns are dropped first (they carry no information and would otherwise
    inflate ``min(r, c)``); a table with a single non-empty row or column has V = 0.
    """
    t = np.asarray(table, dtype=float)
    t = t[t.sum(axis=1) > 0][:, t.sum(axis=0) > 0]
    n = t.sum()
    k = min(t.shape) - 1 if t.size else 0
    if n <= 0 or k <= 0:
        return 0.0
    expected = np.outer(t.sum(axis=1), t.sum(axis=0)) / n
    chi2 = float(((t - expected) ** 2 / expected).sum())
    return float(min(1.0, np.sqrt(chi2 / (n * k))))


def pearson_abs_table(table: np.ndarray) -> float:
    """|Pearson r| between the row and column index of a two-way table (ordinal scores 0..d−1);
    0 when either variable is constant."""
    t = np.asarray(table, dtype=float)
    n = t.sum()
    if n <= 0:
        return 0.0
    i = np.arange(t.shape[0], dtype=float)
    j = np.arange(t.shape[1], dtype=float)
    pr, pc = t.sum(axis=1) / n, t.sum(axis=0) / n
    mi, mj = pr @ i, pc @ j
    vi, vj = pr @ (i - mi) ** 2, pc @ (j - mj) ** 2
    if vi <= 0 or vj <= 0:
        return 0.0
    cov = (i - mi) @ (t / n) @ (j - mj)
    return float(min(1.0, abs(cov) / np.sqrt(vi * vj)))


def cramers_v(x: np.ndarray, y: np.ndarray) -> float:
    """Cramér's V of two integer columns."""
    return cramers_v_table(contingency(x, y))


def pearson_abs(x: np.ndarray, y: np.ndarray) -> float:
    """|Pearson r| of two integer (ordinal) columns."""
    return pearson_abs_table(contingency(x, y))


def dependence_matrix(records: np.ndarray, shape: Sequence[int] | None = None,
                      kinds: str | Sequence[str] = "nominal") -> np.ndarray:
    """Symmetric ``m × m`` matrix of pairwise dependence between the columns of ``records``
    (diagonal 1).

    ``kinds`` is ``"nominal"``, ``"ordinal"`` or one of them per column: a pair of ordinal
    columns is measured with |Pearson r|, any other pair with Cramér's V [MDRR §4.1].
    """
    records = np.asarray(records)
    if records.ndim != 2:
        raise ValueError(f"records must be a 2-D (n, m) array, got shape {records.shape}")
    m = records.shape[1]
    if shape is None:
        shape = [int(records[:, j].max()) + 1 if len(records) else 1 for j in range(m)]
    shape = [int(s) for s in shape]
    if len(shape) != m:
        raise ValueError(f"shape lists {len(shape)} sizes for {m} columns")
    return dependence_from_tables(
        lambda a, b: contingency(records[:, a], records[:, b], shape[a], shape[b]), m, kinds)


def dependence_from_tables(table: Callable[[int, int], np.ndarray], m: int,
                           kinds: str | Sequence[str] = "nominal") -> np.ndarray:
    """:func:`dependence_matrix` from the pair contingency tables (``table(a, b)`` for a < b),
    e.g. count tensors kept by a server."""
    if isinstance(kinds, str):
        kinds = [kinds] * m
    kinds = list(kinds)
    if len(kinds) != m or any(k not in ("nominal", "ordinal") for k in kinds):
        raise ValueError("kinds must be 'nominal' or 'ordinal' (one, or one per column)")
    out = np.eye(m)
    for a in range(m):
        for b in range(a + 1, m):
            t = np.asarray(table(a, b))
            both_ordinal = kinds[a] == kinds[b] == "ordinal"
            out[a, b] = out[b, a] = pearson_abs_table(t) if both_ordinal else cramers_v_table(t)
    return out
