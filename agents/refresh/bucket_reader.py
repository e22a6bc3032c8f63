"""Reading a collection's bucket counts for the refresh (agents/refresh/refresher.py): a window's counts are
the sum of its buckets (ldpstream/windows.py ``cover``: coarse buckets inside, fine buckets at the
edges), summed over the partitions, re-reading only the buckets whose report count (cell 0)
changed since the last read (docs/windows.md)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ldpstream.agents.store import keys
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.layout import Layout
from ldpstream.windows import cover

Part = tuple[str, int]  # (level, bucket)


@dataclass
class WindowCounts:
    """The counts of one range of buckets, per version, and the bucket report counts they were
    summed from (equal signatures: equal counts)."""

    counts: dict[int, dict[str, np.ndarray]]
    n: int
    signature: tuple


@dataclass
class BucketReader:
    """Sums a collection's bucket counts over ranges of fine buckets (or all time), summed over
    its partitions, re-reading only the buckets whose report count changed since the last call."""

    store: CountStore
    collection: str
    partitions: tuple[int, ...]
    #: (layout id, version, level, bucket) → (report count per partition, summed cells or None)
    cache: dict[tuple, tuple[tuple[int, ...], np.ndarray | None]] = field(default_factory=dict)

    @staticmethod
    def parts(rng: tuple[int, int] | None) -> list[Part]:
        if rng is None:
            return [(keys.LEVEL_ALL, 0)]
        fine, coarse = cover(*rng)
        return [(keys.LEVEL_FINE, b) for b in fine] + [(keys.LEVEL_COARSE, c) for c in coarse]

    async def read(self, layouts: Mapping[int, Layout],
                   ranges: Mapping[str, tuple[int, int] | None]) -> dict[str, WindowCounts]:
        """``ranges``: name → inclusive fine-bucket range, or None for all time."""
        plan = {name: self.parts(r) for name, r in ranges.items()}
        wanted = sorted({p for parts in plan.values() for p in parts})
        keep: set[tuple] = set()
        for v, layout in layouts.items():
            where = [(p, lvl, b) for lvl, b in wanted for p in self.partitions]
            heads = await self.store.read_heads(self.collection, layout, where)
            changed: list[Part] = []
            for lvl, b in wanted:
                key = (layout.id, v, lvl, b)
                keep.add(key)
                h = tuple(heads[(p, lvl, b)] for p in self.partitions)
                cached = self.cache.get(key)
                if cached is None or cached[0] != h:
                    changed.append((lvl, b))
                    self.cache[key] = (h, None)
            todo = [(lvl, b) for lvl, b in changed if any(self.cache[(layout.id, v, lvl, b)][0])]
            got = await self.store.read_cells(self.collection, layout,
                                              [(p, lvl, b) for lvl, b in todo
                                               for p in self.partitions])
            for lvl, b in todo:
                total = np.zeros(layout.size, dtype=np.int64)
                for p in self.partitions:
                    total += got[(p, lvl, b)]
                key = (layout.id, v, lvl, b)
                self.cache[key] = (self.cache[key][0], total)
        for key in [k for k in self.cache if k not in keep]:
            del self.cache[key]
        out: dict[str, WindowCounts] = {}
        for name, parts in plan.items():
            counts: dict[int, dict[str, np.ndarray]] = {}
            sig: list = []
            n = 0
            for v, layout in layouts.items():
                total = np.zeros(layout.size, dtype=np.int64)
                for lvl, b in parts:
                    h, cells = self.cache[(layout.id, v, lvl, b)]
                    sig.append(h)
                    if cells is not None:
                        total += cells
                # cell 0 of a memoized collection counts changes (agents/store/device_memo.py): a
                # window whose devices all moved on holds nothing
                n += int(total[0]) if total[1:].any() else 0
                counts[v] = layout.unpack(total)
            out[name] = WindowCounts(counts, n, (tuple(sorted(layouts)), tuple(sig)))
        return out
