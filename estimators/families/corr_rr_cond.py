"""Cond-RR copy channels [Corr-RR] §3.3.4–3.3.5 (docs/mechanisms.md §5, extension): attributes with
different domain sizes. In Phase II the non-pivot value is drawn from the Phase I estimate of
Pr(X_k | Y_j = y_j), where Y_j is the pivot's GRR_ε output:

    Pr(X_k = u | Y_j = y) = Σ_w F_jk(w, u)·P2_j(w, y) / Σ_w f_j(w)·P2_j(w, y),

with F_jk the Phase I joint of (X_j, X_k): the unbiased inverse P1_j^{-T} (N_jk/n₁) P1_k^{-1} of the
pair's Phase I counts (SPL, GRR(ε/m) each), repaired to a proper distribution ([MDRR §6.4]
clip-rescale) and f_j its row sums. It depends on y_j only, so it is post-processing of the
pivot's report (no ε cost).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ldpstream.estimators.kernels.proper import clip_rescale

__all__ = ["pair_joint", "conditional_channel", "conditional_channels"]


def pair_joint(counts: np.ndarray, P1j: np.ndarray, P1k: np.ndarray) -> np.ndarray:
    """Proper Phase I estimate of the joint of (X_j, X_k) from its randomized pair counts."""
    counts = np.asarray(counts, dtype=float)
    n = counts.sum()
    if n <= 0:
        return np.full(counts.shape, 1.0 / counts.size)
    raw = np.linalg.solve(P1j.T, np.linalg.solve(P1k.T, (counts / n).T).T)
    return clip_rescale(raw)


def conditional_channel(F: np.ndarray, P2j: np.ndarray) -> np.ndarray:
    """Row y: Pr(X_k | Y_j = y) for the joint F of (X_j, X_k) and the pivot channel P2_j
    (uniform where Y_j = y has no mass)."""
    num = P2j.T @ F
    den = num.sum(axis=1, keepdims=True)
    dk = F.shape[1]
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0 / dk)


def conditional_channels(pairs: Mapping[tuple[int, int], np.ndarray], P1: Sequence[np.ndarray],
                         P2: Sequence[np.ndarray]) -> list[list[np.ndarray | None]]:
    """C[j][k] for every ordered pair from the Phase I pair counts ``pairs[(j, k)]`` (j < k)."""
    m = len(P1)
    C: list[list[np.ndarray | None]] = [[None] * m for _ in range(m)]
    for j in range(m):
        for k in range(j + 1, m):
            F = pair_joint(pairs[(j, k)], P1[j], P1[k])
            C[j][k] = conditional_channel(F, P2[j])
            C[k][j] = conditional_channel(F.T, P2[k])
    return C
