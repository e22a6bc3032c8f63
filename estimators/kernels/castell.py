"""Castell / RR-Ind-Joint: w-way joint estimation from independently randomized attributes
[Castell Alg. 3, §III-B; docs/mechanisms.md §2].

Every attribute i of a record goes through its own channel ``P_i`` (``P[u, v] = Pr(Y=v | X=u)``).
The w-way table Λ of randomized values then has expectation ``n · Π ×₁ P₁ … ×_w P_w`` and the
unbiased estimate inverts each factor separately (Kronecker identity
``(P₁⊗…⊗P_w)⁻ᵀ = P₁⁻ᵀ⊗…⊗P_w⁻ᵀ``)::

    Π̂ = (Λ/n) ×₁ P₁⁻ᵀ … ×_w P_w⁻ᵀ

computed as w mode-n products: storage |Ω|, time O(|Ω|·Σ d_i). ``castell_naive`` and
``castell_reduced`` are the Table II baselines (full Kronecker system), kept for the benchmark.

Convention of :func:`mode_product`: ``out[..., j, ...] = Σ_i T[..., i, ...] · M[i, j]``, i.e. the
matrix acts on the *first* index, so the forward channel is ``mode_product(Π, P, k)`` and the
inversion is ``mode_product(Λ, P⁻¹, k)`` (which is "×_k P⁻ᵀ" in the paper's notation).

>>> import numpy as np
>>> from ldpstream.estimators.kernels.channels import grr
>>> P = grr(np.log(3), 2)
>>> castell(np.array([[3, 1], [3, 3]]), [P, P]).round(6).tolist()   # [Castell] Appendix B
[[0.45, -0.15], [0.25, 0.45]]
"""
from __future__ import annotations

import contextlib
import threading
from typing import Sequence

import numpy as np

from ldpstream.estimators.kernels.blas import blas_limit

__all__ = ["mode_product", "castell", "castell_naive", "castell_reduced", "castell_variance",
           "expected_tvd", "check_inputs", "apply_modes", "inverses"]

_LIMIT_FROM = 1 << 16  # smaller products run single-threaded in BLAS anyway


def mode_product(T: np.ndarray, M: np.ndarray, axis: int) -> np.ndarray:
    """Contract ``axis`` of ``T`` with the first axis of ``M``:
    ``out[..., j, ...] = Σ_i T[..., i, ...] · M[i, j]`` (axis order kept)."""
    T = np.asarray(T, dtype=float)
    M = np.asarray(M, dtype=float)
    axis = int(axis) % T.ndim
    d = T.shape[axis]
    if M.ndim != 2 or M.shape[0] != d:
        raise ValueError(f"mode_product: axis {axis} has size {d} but the matrix is {M.shape}")
    k = M.shape[1]
    before = T.shape[:axis]
    after = T.shape[axis + 1:]
    a = int(np.prod(before, dtype=np.int64))
    b = int(np.prod(after, dtype=np.int64))
    if b == 1:  # last axis: one (a×d)(d×k) product
        out = T.reshape(a, d) @ M
    elif a == 1:  # first axis: one (k×d)(d×b) product
        out = M.T @ T.reshape(d, b)
    else:  # a batches of (k×d)(d×b)
        out = np.matmul(M.T, T.reshape(a, d, b))
    return out.reshape(before + (k,) + after)


_local = threading.local()
_CHUNK = 1 << 16  # elements per block when the first pass converts the input's dtype


_SCRATCH_MAX = 1 << 24  # keep at most 128 MB of scratch per thread


def _scratch(n: int) -> np.ndarray:
    """A per-thread float64 work array of ``n`` elements, reused across calls (a fresh large
    array costs a page-fault pass; the scratch is never returned to callers)."""
    if n > _SCRATCH_MAX:
        return np.empty(n)
    arr = getattr(_local, "scratch", None)
    if arr is None or arr.size < n:
        arr = np.empty(n)
        _local.scratch = arr
    return arr[:n]


def apply_modes(T: np.ndarray, mats: Sequence[np.ndarray], *, out: np.ndarray | None = None,
                buf: np.ndarray | None = None, scale: float = 1.0) -> np.ndarray:
    """``scale · T ×₁ M₁ … ×_w M_w`` in :func:`mode_product`'s convention (``M_k`` square, one
    per axis); ``T`` may have any real dtype (e.g. int64 counts).

    Fast path used by every estimator: w BLAS products on reshaped views, no transposition
    copies. Pass ``i`` views the current tensor as ``(d_i, rest)`` and writes ``restᵀ @ M_i``
    (shape ``(rest, d_i)``), which is the same tensor with axis i rotated to the end; after w
    passes the axis order is the original again. ``scale`` is folded into M₁; a non-float64 or
    non-contiguous ``T`` is converted block by block inside the first pass (no full-size copy).
    Passes alternate between ``out`` and ``buf`` (float64 arrays of ``T.size`` elements, distinct
    from each other and from ``T``); by default ``out`` is fresh and ``buf`` a per-thread scratch.
    """
    T = np.asarray(T)
    shape = T.shape
    N = T.size
    w = len(mats)
    if w != T.ndim:
        raise ValueError(f"apply_modes: {T.ndim} axes but {w} matrices")
    for i, M in enumerate(mats):
        if M.shape != (shape[i], shape[i]):
            raise ValueError(f"apply_modes: axis {i} has size {shape[i]} but the matrix is "
                             f"{M.shape}")
    if N == 0:
        return np.zeros(shape)
    out = np.empty(N) if out is None else out.reshape(-1)
    if w > 1 and buf is None:
        buf = _scratch(N)
    mats = [np.asarray(M, dtype=float) for M in mats]
    if scale != 1.0:
        mats[0] = mats[0] * scale
    with blas_limit() if N >= _LIMIT_FROM else contextlib.nullcontext():
        X = T
        for i, M in enumerate(mats):
            d = shape[i]
            R = N // d
            tgt = (out if (w - 1 - i) % 2 == 0 else buf).reshape(R, d)  # last pass → out
            if i == 0 and not (T.dtype == np.float64 and T.flags.c_contiguous):
                src = T.reshape(d, R)
                step = max(1, _CHUNK // d)
                for s0 in range(0, R, step):
                    blk = src[:, s0:s0 + step].astype(np.float64)
                    np.matmul(blk.T, M, out=tgt[s0:s0 + step])
            else:
                np.matmul(X.reshape(d, R).T, M, out=tgt)
            X = tgt
    return out.reshape(shape)


def check_inputs(counts: np.ndarray, channels: Sequence[np.ndarray]) -> tuple[np.ndarray,
                                                                               list[np.ndarray]]:
    """Counts as a numeric array (≥ 1 axis, dtype kept) and the channels as float matrices
    matching its axes. Costs one pass over the counts (the minimum); non-finite counts are caught
    by :func:`_frequencies` through their sum."""
    counts = np.asarray(counts)
    if counts.dtype.kind not in "biuf":
        counts = counts.astype(float)
    if counts.ndim == 0:
        raise ValueError("counts must have at least one axis")
    channels = [np.asarray(P, dtype=float) for P in channels]
    if len(channels) != counts.ndim:
        raise ValueError(f"counts have {counts.ndim} axes but {len(channels)} channels were given")
    for i, (P, d) in enumerate(zip(channels, counts.shape)):
        if P.shape != (d, d):
            raise ValueError(f"channel {i} is {P.shape} but axis {i} of the counts has {d} values")
    if counts.size and counts.min() < 0:
        raise ValueError("counts must be finite and non-negative")
    return counts, channels


def _total(counts: np.ndarray) -> float:
    """n = Σ Λ, checked finite and positive."""
    n = float(counts.sum())
    if not np.isfinite(n):
        raise ValueError("counts must be finite and non-negative")
    if n <= 0:
        raise ValueError("counts are all zero: nothing to estimate")
    return n


def _frequencies(counts: np.ndarray) -> tuple[np.ndarray, float]:
    """(λ = Λ/n as a fresh float64 array, n)."""
    n = _total(counts)
    return np.divide(counts, n, dtype=np.float64), n


def inverses(channels: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The inverse of every channel (each ``(d, d)``, or a stack ``(B, d, d)`` inverted per
    matrix); a singular one raises ValueError naming its position."""
    out = []
    for i, P in enumerate(channels):
        try:
            out.append(np.linalg.inv(P))
        except np.linalg.LinAlgError:
            raise ValueError(f"channel {i} is singular (not invertible)") from None
    return out


def castell(counts: np.ndarray, channels: Sequence[np.ndarray]) -> np.ndarray:
    """Unbiased RR-Ind-Joint estimate Π̂ = (Λ/n) ×₁ P₁⁻ᵀ … ×_w P_w⁻ᵀ [Castell Alg. 3].

    Probabilities summing to 1; cells may be negative (or above 1). Each small ``P_i`` is
    inverted once; no Kronecker matrix is formed.
    """
    counts, channels = check_inputs(counts, channels)
    n = _total(counts)
    return apply_modes(counts, inverses(channels), scale=1.0 / n)


def castell_naive(counts: np.ndarray, channels: Sequence[np.ndarray]) -> np.ndarray:
    """Baseline [Castell Table II "naive"]: solve the full |Ω|×|Ω| system (⊗P_i)ᵀ π = λ."""
    counts, channels = check_inputs(counts, channels)
    lam, _ = _frequencies(counts)
    K = channels[0]
    for P in channels[1:]:
        K = np.kron(K, P)
    return np.linalg.solve(K.T, lam.reshape(-1)).reshape(counts.shape)


def castell_reduced(counts: np.ndarray, channels: Sequence[np.ndarray]) -> np.ndarray:
    """Baseline [Castell Table II "reduced"]: form P₁⁻¹⊗…⊗P_w⁻¹ explicitly and multiply."""
    counts, channels = check_inputs(counts, channels)
    lam, _ = _frequencies(counts)
    inv = inverses(channels)
    K = inv[0]
    for Q in inv[1:]:
        K = np.kron(K, Q)
    return (lam.reshape(-1) @ K).reshape(counts.shape)


def castell_variance(counts: np.ndarray, channels: Sequence[np.ndarray]) -> np.ndarray:
    """Per-cell variance of Π̂ from the multinomial covariance of Λ (plug-in λ = Λ/n).

    With Π̂ = A λ̂, A = ⊗P_i⁻ᵀ and Cov(λ̂) = (diag λ − λλᵀ)/n:
    ``Var(Π̂_c) = (Σ_v A[c,v]² λ_v − (Σ_v A[c,v] λ_v)²) / n``; the first sum is the mode products
    with the element-wise squared inverses, the second is Π̂_c itself. No |Ω|² matrix is formed.
    """
    counts, channels = check_inputs(counts, channels)
    n = _total(counts)
    inv = inverses(channels)
    var = apply_modes(counts, [Q * Q for Q in inv], scale=1.0 / n)
    est = apply_modes(counts, inv, scale=1.0 / n)
    est *= est
    var -= est
    var /= n
    return np.maximum(var, 0.0, out=var)


def expected_tvd(variance: np.ndarray) -> float:
    """½·Σ_c sqrt(2/π · var_c): the expected total variation distance under a normal
    approximation of each cell's error (E|N(0, σ²)| = σ·sqrt(2/π)). Used as an error bound."""
    var = np.maximum(np.asarray(variance, dtype=float), 0.0)
    return float(0.5 * np.sqrt(2.0 / np.pi * var).sum())
