"""Small linear-algebra kernels shared by the Corr-RR estimators (docs/corr-rr.md): a contrast
basis of sum-zero vectors, the (pseudo-)inverse of a positive semi-definite matrix, block
diagonals. Pure numpy."""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

__all__ = ["contrast", "spd_inv", "blockdiag"]


@lru_cache(maxsize=64)
def contrast(d: int) -> np.ndarray:
    """d×(d−1) orthonormal basis of the sum-zero vectors."""
    q, _ = np.linalg.qr(np.vstack([np.ones((1, d)), np.eye(d)[:-1]]).T)
    return q[:, 1:]


def spd_inv(A: np.ndarray, rcond: float = 1e-10) -> np.ndarray:
    """(Pseudo-)inverse of a symmetric positive semi-definite matrix: Cholesky when A is well
    conditioned (eigen-decompositions are far slower on small matrices here), else the
    eigen-decomposition with eigenvalues below ``rcond``·max dropped (e.g. identical Phase II
    columns when every p_y = 1: their differences have no variance and carry no information)."""
    A = 0.5 * (A + A.T)
    n = A.shape[0]
    try:
        L = np.linalg.cholesky(A)
        dg = np.diag(L) ** 2
        if dg.min() > 1e3 * rcond * dg.max():
            Li = np.linalg.solve(L, np.eye(n))
            return Li.T @ Li
    except np.linalg.LinAlgError:
        pass
    w, V = np.linalg.eigh(A)
    keep = w > rcond * max(float(w.max()), 0.0)
    return (V[:, keep] / w[keep]) @ V[:, keep].T


def blockdiag(blocks: Sequence[np.ndarray]) -> np.ndarray:
    """The block-diagonal matrix of ``blocks`` (each 2-d, any shape)."""
    rows = sum(b.shape[0] for b in blocks)
    cols = sum(b.shape[1] for b in blocks)
    out = np.zeros((rows, cols))
    r = c = 0
    for b in blocks:
        out[r:r + b.shape[0], c:c + b.shape[1]] = b
        r += b.shape[0]
        c += b.shape[1]
    return out
