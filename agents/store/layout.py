"""The count layout of one mechanism version: its tensors concatenated into one int64 vector.

Cell 0 holds the number of reports counted; tensor ``specs[i]`` follows at ``offsets[i]``. One
Redis string per (shard, version, bucket) holds a whole layout (agents/store/keys.py), so that a refresh
reads one key per bucket, not one per tensor. The layout id (a hash of the tensor keys and shapes,
and of what a tensor's ``channel`` says of the channel behind it) is part of the key: a config
that changes the marginals, or a channel that changes with the same shape, counts into new keys
instead of misreading old ones.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ldpstream.estimators.mechanism import TensorSpec

__all__ = ["Layout"]


@dataclass(frozen=True)
class Layout:
    """Tensors of mechanism ``version`` in ``specs`` order after one cell of report count."""

    version: int
    specs: tuple[TensorSpec, ...]
    id: str = field(init=False, compare=False)
    offsets: tuple[int, ...] = field(init=False, compare=False, repr=False)
    size: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        text = ";".join(f"{s.key}={'x'.join(map(str, s.shape))}"
                        + (f"@{s.channel}" if s.channel else "") for s in self.specs)
        object.__setattr__(self, "id", hashlib.sha1(text.encode()).hexdigest()[:10])
        offs, at = [], 1
        for s in self.specs:
            offs.append(at)
            at += s.size
        object.__setattr__(self, "offsets", tuple(offs))
        object.__setattr__(self, "size", at)

    @classmethod
    def of(cls, version: int, specs: Sequence[TensorSpec]) -> "Layout":
        return cls(int(version), tuple(specs))

    def pack(self, counts: Mapping[str, np.ndarray], n: int) -> np.ndarray:
        """One flat int64 vector: ``n`` then every tensor of ``counts`` (missing ones: zeros)."""
        out = np.zeros(self.size, dtype=np.int64)
        out[0] = int(n)
        for s, at in zip(self.specs, self.offsets):
            c = counts.get(s.key)
            if c is not None:
                out[at:at + s.size] = np.asarray(c, dtype=np.int64).ravel()
        return out

    def unpack(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Tensor key → counts (views into ``flat``, shaped)."""
        return {s.key: flat[at:at + s.size].reshape(s.shape)
                for s, at in zip(self.specs, self.offsets)}

    @staticmethod
    def n_of(flat: np.ndarray) -> int:
        return int(flat[0])
