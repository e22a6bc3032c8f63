"""RR-Joint [MDRR Protocol 2]: one GRR over the Cartesian product of a set of attributes.

For the same risk as RR-Independent with ε_A on each attribute A of C, use ε_C = Σ ε_A
[MDRR §6.3.2]: diagonal p_C = 1/(1 + (|Ω_C|−1)·e^{−ε_C}), off-diagonal q_C = p_C·e^{−ε_C}
(docs/mechanisms.md §2). The |Ω_C|×|Ω_C| matrix is never formed: everything here uses (p_C, q_C).

A sub-marginal over S ⊂ C of the product GRR is itself a GRR on Ω_S with
p_S = p_C + (K−1)·q_C and q_S = K·q_C, K = |Ω_C|/|Ω_S|; so the closed-form inverse
π̂ = (λ̂ − q)/(p − q) applied to the randomized S-counts equals the S-sum of the joint estimate.

>>> p, q = joint_pq([np.log(3), np.log(3)], (2, 2))
>>> round(p / q, 9)
9.0
>>> cells = encode(np.array([[1, 0], [1, 1]]), (2, 3))
>>> cells.tolist(), decode(cells, (2, 3)).tolist()
([3, 4], [[1, 0], [1, 1]])
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ldpstream.estimators.kernels.channels import grr

__all__ = ["joint_channel_epsilon", "joint_pq", "joint_channel", "encode", "decode",
           "randomize_joint", "submarginal_pq", "estimate_joint", "estimate_submarginal"]


def joint_channel_epsilon(eps_list: Sequence[float]) -> float:
    """Risk-equivalent ε_C = Σ ε_A of RR-Joint over the attributes of C [MDRR §6.3.2]."""
    eps = np.asarray(list(eps_list), dtype=float)
    if eps.size == 0 or not np.all(np.isfinite(eps)) or np.any(eps <= 0):
        raise ValueError(f"every ε must be a finite number > 0, got {eps.tolist()}")
    return float(eps.sum())


def _size(shape: Sequence[int] | int) -> int:
    if np.isscalar(shape):
        return int(shape)  # type: ignore[arg-type]  # np.isscalar narrowed it to a number
    return int(np.prod([int(s) for s in shape], dtype=np.int64))  # type: ignore[union-attr]  # a sequence here


def joint_pq(eps: float | Sequence[float], shape: Sequence[int] | int) -> tuple[float, float]:
    """(p_C, q_C) of RR-Joint over a product of ``shape`` (or ``|Ω_C|``). ``eps`` is ε_C, or the
    per-attribute ε list whose sum is ε_C."""
    eps_c = float(eps) if np.isscalar(eps) else joint_channel_epsilon(eps)  # type: ignore[arg-type]  # a sequence here
    if not np.isfinite(eps_c) or eps_c <= 0:
        raise ValueError(f"epsilon must be a finite number > 0, got {eps_c!r}")
    size = _size(shape)
    if size < 2:
        raise ValueError(f"the product domain needs at least 2 cells, has {size}")
    # p_C = 1/(1 + (|Ω_C|−1) e^{−ε_C}), q_C = p_C e^{−ε_C}
    em = np.exp(-eps_c)
    p = 1.0 / (1.0 + (size - 1) * em)
    return float(p), float(p * em)


def joint_channel(eps: float | Sequence[float], shape: Sequence[int] | int) -> np.ndarray:
    """The dense |Ω_C|×|Ω_C| RR-Joint matrix (small domains only: tests, ε checks)."""
    eps_c = float(eps) if np.isscalar(eps) else joint_channel_epsilon(eps)  # type: ignore[arg-type]  # a sequence here
    return grr(eps_c, _size(shape))


def encode(records: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Flat product-cell index (C order, ``ravel_multi_index``) of every row of ``records``."""
    records = np.asarray(records)
    return np.ravel_multi_index(tuple(records[:, j].astype(np.intp) for j in range(records.shape[1])),
                                tuple(int(s) for s in shape)).astype(np.int64)


def decode(cells: np.ndarray, shape: Sequence[int], dtype=None) -> np.ndarray:
    """Inverse of :func:`encode`: ``(n, len(shape))`` per-attribute values."""
    shape = tuple(int(s) for s in shape)
    if dtype is None:
        dtype = np.uint8 if max(shape) <= 256 else np.uint16 if max(shape) <= 65536 else np.uint32
    return np.stack(np.unravel_index(np.asarray(cells, dtype=np.intp), shape), axis=1).astype(dtype)


def randomize_joint(records: np.ndarray, shape: Sequence[int], eps: float | Sequence[float],
                    rng: np.random.Generator) -> np.ndarray:
    """Randomize every row of ``records`` (columns = the attributes of C) by one GRR over the
    product: keep the cell with p_C, else report one of the other |Ω_C|−1 cells uniformly.
    Returns per-attribute values (same layout as ``records``). Vectorized."""
    shape = tuple(int(s) for s in shape)
    size = _size(shape)
    p, _ = joint_pq(eps, shape)
    x = encode(records, shape)
    keep = rng.random(x.shape) < p
    other = rng.integers(0, size - 1, size=x.shape, dtype=np.int64)
    other += other >= x
    y = np.where(keep, x, other)
    return decode(y, shape, dtype=np.asarray(records).dtype if np.asarray(records).dtype.kind == "u"
                  else None)


def submarginal_pq(p: float, q: float, size_c: int, size_s: int) -> tuple[float, float]:
    """GRR parameters induced on a sub-marginal of ``size_s`` cells of a product GRR(p, q) of
    ``size_c`` cells: p_S = p + (K−1)q, q_S = K·q with K = size_c/size_s."""
    k = size_c // size_s
    if k * size_s != size_c:
        raise ValueError(f"{size_s} cells do not divide the product's {size_c}")
    return p + (k - 1) * q, k * q


def estimate_joint(counts: np.ndarray, p: float, q: float) -> np.ndarray:
    """Unbiased GRR inversion π̂ = (λ̂ − q)/(p − q) of a count table (any shape; λ̂ = counts/n).
    May be negative; sums to 1."""
    counts = np.asarray(counts, dtype=float)
    n = counts.sum()
    if n <= 0:
        raise ValueError("no reports counted")
    return (counts / n - q) / (p - q)


def estimate_submarginal(counts: np.ndarray, eps: float | Sequence[float],
                         shape_c: Sequence[int], keep: Sequence[int] | None = None) -> np.ndarray:
    """Estimate the marginal over axes ``keep`` of the RR-Joint product ``shape_c``.

    ``counts`` is either the full randomized table of C (``keep`` chooses the axes to keep) or
    already the randomized table of the sub-marginal (``keep=None``); both give the same
    estimate (the induced channel is GRR)."""
    counts = np.asarray(counts, dtype=float)
    size_c = _size(shape_c)
    p, q = joint_pq(eps, size_c)
    if keep is not None:
        keep = tuple(int(a) for a in keep)
        drop = tuple(a for a in range(counts.ndim) if a not in keep)
        counts = counts.sum(axis=drop) if drop else counts
        order = sorted(keep)
        counts = np.transpose(counts, [order.index(a) for a in keep])
    ps, qs = submarginal_pq(p, q, size_c, int(counts.size))
    return estimate_joint(counts, ps, qs)
