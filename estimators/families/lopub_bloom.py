"""LoPub's client side [LoPub §V-B; docs/mechanisms.md §6]: Bloom encoding with shared seeded hashes,
bit flipping, and the ε it costs.

Every attribute j gets its own Bloom filter of ``m_j`` bits and ``h`` hash functions; value ``v``
sets the bits ``H_k(v) mod m_j`` (k = 1..h). Sizes default to [LoPub eqs. 6–7]:
``m_j = ln(1/p_fp)/(ln 2)²·d_j`` and ``h = ln(1/p_fp)/ln 2``. The hashes are a deterministic
function of a 64-bit seed (splitmix64), so the server rebuilds the devices' filters from the
published seeds. Flipping [eq. 5]: every bit is kept with 1−f, set to 1 with f/2, set to 0 with f/2.

Privacy. For one attribute, bits flip independently, so the likelihood ratio of an output
``ŝ`` between inputs u and v factorises per bit; its maximum over ``ŝ`` is
``((2−f)/f)^{H(B_u, B_v)}`` with H the Hamming distance of the two filters. Hence the exact ε is
``ln((2−f)/f)·max_{u≠v} H(B_u, B_v)`` (:func:`epsilon_exact`), which equals eq. 8's
``2h·ln((2−f)/f)`` only if two values have disjoint filters with h distinct bits each, and is
smaller when filters share bits or a value's hashes collide. Eq. 8 is therefore a valid upper bound;
a record costs the sum over its attributes (sequential composition).

>>> B = filters(4, 12, 2, seed=7)
>>> B.shape, int(B.sum(axis=1).max()) <= 2
((4, 12), True)
>>> bool((filters(4, 12, 2, seed=7) == B).all())
True
>>> bloom_size(16, 0.01), bloom_hashes(0.01)
(154, 7)
>>> bool(abs(epsilon_declared(0.5, 2) - 4 * np.log(3)) < 1e-12)
True
>>> epsilon_exact(np.array([[1, 1, 0, 0], [0, 0, 1, 1]]), 0.5) == epsilon_declared(0.5, 2)
True
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["bloom_size", "bloom_hashes", "splitmix64", "positions", "filters", "choose_seed",
           "encode", "flip", "bit_channels", "epsilon_declared", "epsilon_exact",
           "epsilon_from_bit_channels", "expected_bits"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK64 = (1 << 64) - 1


def bloom_size(d: int, p_fp: float) -> int:
    """[LoPub eq. 6] bits m = ln(1/p_fp)/(ln 2)²·d, rounded up (at least 1)."""
    _check_pfp(p_fp)
    return max(1, int(np.ceil(np.log(1.0 / p_fp) / np.log(2.0) ** 2 * int(d))))


def bloom_hashes(p_fp: float) -> int:
    """[LoPub eq. 7] hash functions h = ln(1/p_fp)/ln 2, rounded (at least 1)."""
    _check_pfp(p_fp)
    return max(1, int(round(np.log(1.0 / p_fp) / np.log(2.0))))


def _check_pfp(p_fp: float) -> None:
    if not 0.0 < float(p_fp) < 1.0:
        raise ValueError(f"p_fp (Bloom false-positive rate) must be in (0, 1), got {p_fp!r}")


def _check_f(f: float) -> float:
    f = float(f)
    if not 0.0 < f < 1.0:
        raise ValueError(f"f (LoPub bit-flip probability) must be in (0, 1), got {f!r}")
    return f


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on uint64 arrays (wrap-around arithmetic; platform independent)."""
    z = np.asarray(x, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def positions(d: int, m: int, h: int, seed: int) -> np.ndarray:
    """``(d, h)`` bit positions: hash k of value v is splitmix64(splitmix64(seed) ⊕ (v·h + k + 1))
    mod m."""
    d, m, h = int(d), int(m), int(h)
    if d < 1 or m < 1 or h < 1:
        raise ValueError(f"Bloom filter needs d, m, h ≥ 1, got d={d}, m={m}, h={h}")
    base = splitmix64(np.array([int(seed) & _MASK64], dtype=np.uint64))[0]
    keys = (np.arange(d, dtype=np.uint64)[:, None] * np.uint64(h)
            + np.arange(h, dtype=np.uint64)[None, :] + np.uint64(1))
    return (splitmix64(keys ^ base) % np.uint64(m)).astype(np.int64)


def filters(d: int, m: int, h: int, seed: int) -> np.ndarray:
    """``(d, m)`` uint8 matrix: row v is the Bloom filter of value v (≤ h ones: hashes can
    collide)."""
    pos = positions(d, m, h, seed)
    B = np.zeros((int(d), int(m)), dtype=np.uint8)
    B[np.arange(int(d))[:, None], pos] = 1
    return B


def _identifiable(B: np.ndarray, f: float = 0.5) -> bool:
    """Distinct filters whose expected-bit matrix has full column rank (so that value frequencies
    are identifiable from bit frequencies)."""
    d, m = B.shape
    if len(np.unique(B, axis=0)) < d:
        return False
    if m >= d:
        return int(np.linalg.matrix_rank(expected_bits(B, f))) == d
    return True


def choose_seed(d: int, m: int, h: int, base_seed: int, attr_index: int,
                tries: int = 1000) -> int:
    """The first seed of a deterministic sequence (from ``base_seed`` and ``attr_index``) whose
    filters are distinct and identifiable; ``ValueError`` if none within ``tries``."""
    root = int(splitmix64(np.array([(int(base_seed) * 1_000_003 + int(attr_index)) & _MASK64],
                                   dtype=np.uint64))[0])
    for t in range(int(tries)):
        seed = (root + t) & _MASK64
        if _identifiable(filters(d, m, h, seed)):
            return seed
    raise ValueError(f"no hash seed gives {d} distinct identifiable Bloom filters with m={m}, "
                     f"h={h}; use more bits")


def encode(records: np.ndarray, blooms: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenated Bloom filters of ``(n, k)`` records (column j encoded with ``blooms[j]``):
    ``(n, Σ m_j)`` uint8."""
    records = np.asarray(records)
    if records.ndim != 2 or records.shape[1] != len(blooms):
        raise ValueError(f"records must be (n, {len(blooms)}), got {records.shape}")
    return np.concatenate([B[records[:, j].astype(np.intp)] for j, B in enumerate(blooms)],
                          axis=1)


def flip(bits: np.ndarray, f: float, rng: np.random.Generator) -> np.ndarray:
    """[LoPub eq. 5]: keep each bit with 1−f, else set it to 1 or 0 with f/2 each (one uniform
    draw per bit)."""
    f = _check_f(f)
    u = rng.random(bits.shape)
    out = np.where(u < f, (u < f / 2).astype(np.uint8), bits.astype(np.uint8))
    return out.astype(np.uint8, copy=False)


def expected_bits(B: np.ndarray, f: float) -> np.ndarray:
    """``(m, d)`` matrix A with A[b, v] = Pr(ŝ[b] = 1 | value v) = f/2 + (1−f)·B[v, b]."""
    f = _check_f(f)
    return f / 2 + (1 - f) * np.asarray(B, dtype=float).T


def bit_channels(B: np.ndarray, f: float) -> np.ndarray:
    """Per-bit channels of one attribute: ``(m, d, 2)`` with P[b, v, y] = Pr(ŝ[b] = y | v)."""
    p1 = expected_bits(B, f)
    return np.stack([1.0 - p1, p1], axis=-1)


def epsilon_from_bit_channels(P: np.ndarray) -> float:
    """Exact ε of a product of independent per-bit channels ``P[b, v, y]``:
    max_{u,v} Σ_b max_y ln(P[b,u,y]/P[b,v,y]) (the max over output vectors factorises per bit)."""
    logP = np.log(np.asarray(P, dtype=float))                     # (m, d, 2)
    diff = logP[:, :, None, :] - logP[:, None, :, :]              # (m, d, d, 2)
    return float(diff.max(axis=-1).sum(axis=0).max())


def epsilon_declared(f: float, h: int, attributes: int = 1) -> float:
    """[LoPub eq. 8]: ε = 2h·ln((2−f)/f) per attribute, times the number of attributes."""
    f = _check_f(f)
    return float(int(attributes) * 2 * int(h) * np.log((2 - f) / f))


def epsilon_exact(B: np.ndarray, f: float) -> float:
    """Exact ε of one attribute's Bloom filters ``B`` (d, m) under flip f:
    ln((2−f)/f)·max_{u≠v} Hamming(B_u, B_v)."""
    f = _check_f(f)
    B = np.asarray(B, dtype=np.int64)
    ones = B.sum(axis=1)
    ham = ones[:, None] + ones[None, :] - 2 * (B @ B.T)
    return float(np.log((2 - f) / f) * ham.max())
