"""The draws every device SDK makes from 64-bit words, identically in Python, C (sdk/c) and
TypeScript (sdk/ts) (docs/device-protocol.md, "Draws"): the test generator
:class:`SplitMix64`, the production generator :class:`OsRandom` (the OS CSPRNG), and
:func:`uniform` (rejection sampling on 64-bit words), :func:`bernoulli` and :func:`categorical`
(53-bit fractions).
"""
from __future__ import annotations

import secrets
from typing import Protocol, Sequence

import numpy as np

from ldpstream.estimators.kernels.device_program import mix64

__all__ = ["DrawSource", "SplitMix64", "OsRandom", "NumpyDraws", "uniform", "bernoulli",
           "categorical", "mix64", "M64", "TWO53"]

M64 = (1 << 64) - 1
TWO53 = float(1 << 53)


class DrawSource(Protocol):
    """A source of uniform 64-bit words."""

    def next_u64(self) -> int: ...


class SplitMix64:
    """SplitMix64 (Steele, Lea and Flood, OOPSLA 2014), seeded by a u64: the test generator."""

    def __init__(self, seed: int) -> None:
        self.state = int(seed) & M64

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)


class OsRandom:
    """64-bit words from the OS CSPRNG (the production generator)."""

    def next_u64(self) -> int:
        return secrets.randbits(64)


class NumpyDraws:
    """64-bit words from a numpy Generator (callers that seed numpy)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def next_u64(self) -> int:
        return int(self.rng.integers(0, 1 << 64, dtype=np.uint64))


def uniform(rng: DrawSource, k: int) -> int:
    """Uniform in ``[0, k)``, 1 ≤ k ≤ 2**32: words ≥ 2**64 − (2**64 mod k) are rejected, the
    first accepted word w gives w mod k."""
    limit = (1 << 64) - ((1 << 64) % k)
    while True:
        w = rng.next_u64()
        if w < limit:
            return w % k


def _fraction(rng: DrawSource) -> float:
    """The top 53 bits of a word, as an integer-valued double in [0, 2**53)."""
    return float(rng.next_u64() >> 11)


def bernoulli(rng: DrawSource, p: float) -> bool:
    """True with probability ``p``: one word, ``(w >> 11) < p·2**53``."""
    return _fraction(rng) < p * TWO53


def categorical(rng: DrawSource, cum: Sequence[float]) -> int:
    """Index j of the first cumulative sum with ``(w >> 11) < cum[j]·2**53`` (the last index
    when none is); ``cum`` are left-to-right double sums of one matrix row."""
    u = _fraction(rng)
    last = len(cum) - 1
    for j in range(last):
        if u < cum[j] * TWO53:
            return j
    return last
