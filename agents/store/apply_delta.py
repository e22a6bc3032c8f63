"""What one apply carries and answers (:meth:`~ldpstream.agents.store.count_store.CountStore.apply_many`):
a partition's delta with the offsets it covers and its side counters, and the outcome
(docs/pipeline.md "Exactly once")."""
from __future__ import annotations

import dataclasses
import enum
from typing import Mapping

import numpy as np

from ldpstream.agents.store import keys
from ldpstream.agents.store.layout import Layout
from ldpstream.windows import COARSE_FACTOR, BucketPolicy

__all__ = ["ApplyStatus", "ApplyResult", "PartitionDelta", "SideCounter", "SideValues",
           "SideLog", "SidePatch", "SideStaged", "SideBucketMeta", "CellsKey", "expand_levels"]

class ApplyStatus(str, enum.Enum):
    """Outcome of one partition's delta in :meth:`CountStore.apply_many`."""

    APPLIED = "applied"      # counted; the stored offset is now the delta's offset
    REPLAYED = "replayed"    # stored offset >= the delta's offset: already counted, skipped
    CONFLICT = "conflict"    # the delta does not start at the stored offset: refused


_STATUS = {1: ApplyStatus.APPLIED, 0: ApplyStatus.REPLAYED, -1: ApplyStatus.CONFLICT}

#: (layout of the reports' mechanism version, fine bucket or None for all-time only)
CellsKey = tuple[Layout, "int | None"]


@dataclasses.dataclass(frozen=True)
class SideCounter:
    """Increments of one side-counter hash of the shard (e.g. per-device report counts of a quota
    window), applied atomically with the counts; ``expire_at`` unix seconds (None: never)."""

    increments: Mapping[str, int]
    expire_at: float | None = None


@dataclasses.dataclass(frozen=True)
class SideValues:
    """Fields of one side hash of the shard set to ``values`` (digits, ':' and '-' only, e.g. the
    batch-dedupe state of agents/store/dedupe.py), atomically with the counts; ``expire_at`` unix
    seconds (None: never)."""

    values: Mapping[str, str]
    expire_at: float | None = None


@dataclasses.dataclass(frozen=True)
class SideBucketMeta:
    """The meta hash of a window's per-device side hashes bucketed in ``buckets``
    (agents/store/side_buckets.py), after its buckets' :class:`SideValues` or
    :class:`SideCounter` in ``PartitionDelta.side``: the apply records ``buckets`` if none is
    recorded, refuses the delta as a CONFLICT if another one is, and counts the fields its
    buckets gained; ``expire_at`` unix seconds (None: never)."""

    buckets: int
    expire_at: float | None = None


@dataclasses.dataclass(frozen=True)
class SideLog:
    """Bytes appended to a side string of the shard (``replace``: the string set to them), e.g.
    the device state log of agents/store/device_memo.py, atomically with the counts; ``expire_at``
    unix seconds (None: never)."""

    data: bytes
    replace: bool = False
    expire_at: float | None = None


@dataclasses.dataclass(frozen=True)
class SidePatch:
    """A device state segment (agents/store/memo_log.py): rows rewritten in place, then rows
    appended, atomically with the counts; ``data`` is ``memo_log.patch_blob``'s."""

    data: bytes
    expire_at: float | None = None


@dataclasses.dataclass(frozen=True)
class SideStaged:
    """A side string set to ``data`` by the apply without the bytes passing through its Lua
    script: written beforehand to a staging key of its own, RENAMEd into place by the apply
    (a new device state segment, agents/store/memo_log.py); ``expire_at`` unix seconds."""

    data: bytes | bytearray | memoryview
    expire_at: float | None = None


@dataclasses.dataclass(frozen=True)
class PartitionDelta:
    """Counts of the reports at offsets ``(expected, offset]`` of one partition.

    ``cells``: (layout, fine bucket or None) → flat int64 delta of ``layout.size`` cells (cell 0 =
    the reports it counts; :meth:`Layout.pack`). ``expected``: the stored offset the delta
    continues from (-1: nothing stored yet; ``None``: unchecked). ``side``: side-counter name →
    increments (agents/store/keys.py ``side_key``)."""

    partition: int
    offset: int
    cells: Mapping[CellsKey, np.ndarray]
    n_reports: int
    expected: int | None = None
    sent_at_max: float | None = None
    side: Mapping[str, SideCounter | SideValues | SideLog | SidePatch | SideStaged
                  | SideBucketMeta] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ApplyResult:
    """``status`` of a partition's delta and the partition's stored offset after the call
    (``None``: nothing stored). On CONFLICT (or a REPLAYED delta ending below ``stored``) a
    consumer must drop its pending deltas of the partition and re-read from ``stored + 1``."""

    partition: int
    status: ApplyStatus
    stored: int | None

    @property
    def applied(self) -> bool:
        return self.status is ApplyStatus.APPLIED


def expand_levels(cells: Mapping[CellsKey, np.ndarray], policy: BucketPolicy | None
                  ) -> dict[tuple[Layout, str, int], tuple[np.ndarray, float | None]]:
    """Per key (layout, level, bucket): the summed delta and its expiry (unix s; None: never).

    A fine bucket's delta is added to its fine key, its coarse key and the all-time key; a delta
    without a bucket to the all-time key only."""
    out: dict[tuple[Layout, str, int], tuple[np.ndarray, float | None]] = {}

    def add(k: tuple[Layout, str, int], d: np.ndarray, exp: float | None) -> None:
        cur = out.get(k)
        out[k] = (d.copy() if cur is None else cur[0] + d, exp)

    for (layout, bucket), delta in cells.items():
        d = np.asarray(delta, dtype=np.int64).ravel()
        if d.size != layout.size:
            raise ValueError(f"delta of layout {layout.id} has {d.size} cells, expected "
                             f"{layout.size}")
        if bucket is not None:
            if policy is None or not policy.bucketed:
                raise ValueError("a bucketed delta needs a BucketPolicy with finite windows")
            b = int(bucket)
            c = b // COARSE_FACTOR
            add((layout, keys.LEVEL_FINE, b), d, policy.fine_expire_at(b))
            add((layout, keys.LEVEL_COARSE, c), d, policy.coarse_expire_at(c))
        add((layout, keys.LEVEL_ALL, 0), d, None)
    return out
