"""Bit co-occurrence estimator of LoPub joints (docs/mechanisms.md §6 note; our addition beside Alg. 2).

Given a record with value ω_j of attribute j, its flipped bits are independent across attributes
with E[ŝ_j] = A_j[:, ω_j], where A_j = f/2 + (1−f)·B_jᵀ is ``m_j × d_j``
(:func:`~ldpstream.estimators.families.lopub_bloom.expected_bits`). Hence the co-occurrence count tensor of a set
S of attributes, C_S[b_1, …, b_w] = Σ_records Π_j ŝ_j[b_j], satisfies the linear system

    E[C_S] / N = (A_1 ⊗ … ⊗ A_w) · π_S,

with π_S the joint of S. Its least-squares solution applies the pseudo-inverse of every A_j along
its axis (the pseudo-inverse of a Kronecker product is the Kronecker product of the
pseudo-inverses); since A_j⁺A_j = I when A_j has full column rank, the estimate is **unbiased**.
For w = 1 it is the de-noised bit count estimate, for w = 2 it reads the ``m_a × m_b`` pair tensor
(streaming friendly: integer counts that add up across batches). It may have cells < 0; repair
with :mod:`~ldpstream.estimators.kernels.proper`.

For w ≥ 3 the w-way tensor is large (Π m_j cells); :func:`cooccurrence_from_bits` computes the
same least-squares solution from the bit vectors directly, as the mean over records of
⊗_j A_j⁺ŝ_j (linear, so equal to solving on the full tensor), in O(n·Π d_j).

>>> from ldpstream.estimators.families.lopub_bloom import expected_bits
>>> B = np.array([[1, 0, 0, 1], [0, 1, 1, 0]]); A = expected_bits(B, 0.2)
>>> pi = np.array([[0.5, 0.1], [0.0, 0.4]])
>>> C = np.einsum('av,bw,vw->ab', A, A, pi) * 1000     # the expected co-occurrence counts
>>> (solve_cooccurrence(C, 1000, [A, A]).round(10) + 0.0).tolist()
[[0.5, 0.1], [0.0, 0.4]]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["cooccurrence_counts", "solve_cooccurrence", "cooccurrence_from_bits",
           "kr_product", "split_axes"]

_CHUNK = 1 << 16


def cooccurrence_counts(*parts: np.ndarray) -> np.ndarray:
    """Integer co-occurrence tensor Σ_r ⊗_j parts[j][r] of 0/1 bit blocks (each ``(n, m_j)``).

    One block gives the per-bit counts; two the ``m_a × m_b`` pair tensor (a float32 BLAS matmul
    in chunks of 2^16 rows, exact below 2^24 per cell and chunk); more blocks the full tensor.
    """
    if not parts:
        raise ValueError("cooccurrence_counts needs at least one bit block")
    n = parts[0].shape[0]
    if any(p.shape[0] != n for p in parts):
        raise ValueError("bit blocks differ in length")
    shape = tuple(p.shape[1] for p in parts)
    if len(parts) == 1:
        return parts[0].sum(axis=0, dtype=np.int64)
    out = np.zeros((int(np.prod(shape[:-1])), shape[-1]), dtype=np.int64)
    for s in range(0, n, _CHUNK):
        blocks = [p[s:s + _CHUNK].astype(np.float32) for p in parts]
        left = kr_product(blocks[:-1])
        out += np.rint(left.T @ blocks[-1]).astype(np.int64)
    return out.reshape(shape)


def kr_product(blocks: Sequence[np.ndarray]) -> np.ndarray:
    """Row-wise Kronecker (Khatri–Rao) product of ``(n, k_j)`` blocks: ``(n, Π k_j)``, C order."""
    out = blocks[0]
    for b in blocks[1:]:
        out = (out[:, :, None] * b[:, None, :]).reshape(out.shape[0], -1)
    return out


def _pinvs(A: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = []
    for j, Aj in enumerate(A):
        Aj = np.asarray(Aj, dtype=float)
        if np.linalg.matrix_rank(Aj) < Aj.shape[1]:
            raise ValueError(f"attribute {j}: its Bloom filters are not identifiable "
                             f"(rank < {Aj.shape[1]}); use more bits or another seed")
        out.append(np.linalg.pinv(Aj))
    return out


def solve_cooccurrence(C: np.ndarray, n: int, A: Sequence[np.ndarray]) -> np.ndarray:
    """Least-squares solution π̂ of C/N = (⊗ A_j) π: C/N ×_1 A_1⁺ ×_2 … ×_w A_w⁺ (unbiased)."""
    C = np.asarray(C, dtype=float)
    if C.ndim != len(A) or any(C.shape[j] != A[j].shape[0] for j in range(C.ndim)):
        raise ValueError(f"co-occurrence tensor of shape {C.shape} does not match the filters")
    if n <= 0:
        raise ValueError("no reports counted (n = 0)")
    est = C / float(n)
    for j, Ap in enumerate(_pinvs(A)):
        est = np.moveaxis(np.tensordot(Ap, est, axes=([1], [j])), 0, j)
    return est


def cooccurrence_from_bits(parts: Sequence[np.ndarray], A: Sequence[np.ndarray]) -> np.ndarray:
    """The same estimate from the bit blocks ``parts[j]`` (n, m_j): mean_r ⊗_j A_j⁺ ŝ_{r,j},
    computed as one matmul of two Khatri–Rao halves per chunk of records."""
    n = parts[0].shape[0]
    if n == 0:
        raise ValueError("no reports")
    P = _pinvs(A)
    shape = tuple(Aj.shape[1] for Aj in A)
    w = len(parts)
    split = split_axes(shape)
    out = np.zeros((int(np.prod(shape[:split])), int(np.prod(shape[split:]))))
    for s in range(0, n, 8192):
        z = [parts[j][s:s + 8192].astype(float) @ P[j].T for j in range(w)]
        left = kr_product(z[:split])
        right = kr_product(z[split:]) if split < w else np.ones((left.shape[0], 1))
        out += left.T @ right
    return (out / n).reshape(shape)


def split_axes(shape: Sequence[int]) -> int:
    """Index splitting ``shape`` into two groups of balanced cell counts (left gets ≥ 1 axis)."""
    total = float(np.prod(shape))
    best, best_t = None, 1
    for t in range(1, len(shape) + 1):
        left = float(np.prod(shape[:t]))
        cost = max(left, total / left)
        if best is None or cost < best:
            best, best_t = cost, t
    return best_t
