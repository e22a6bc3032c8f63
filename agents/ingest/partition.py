"""Per-partition state of the ingest worker: one :class:`PartitionState` per assigned partition.

Created when the partition is assigned, dropped when it is revoked, and reset (pending delta,
quota use and position forgotten, epoch bumped) in ONE place, :meth:`Partitions.reset`, whenever
what was taken is no longer a continuation of the stored offset: a re-assignment, a log check, a
compare-and-set conflict. A :class:`Pending` delta remembers the epoch it was taken in; it is
*stale* (never applied) once its partition was revoked or reset since (docs/pipeline.md
"The worker's parts").
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import numpy as np
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from ldpstream.agents.ingest.log_identity import LogMark
from ldpstream.agents.store.dedupe import DedupeBook
from ldpstream.agents.store.layout import Layout
from ldpstream.agents.store.memo_log import EpochLog, LogPending
from ldpstream.producers.codec import ReportBatch


@dataclasses.dataclass(frozen=True)
class Reject:
    """A message (or the part of it) refused: filed in ``ldp.dlq`` with its reason."""

    reason: str
    detail: str
    payload: bytes
    offset: int


@dataclasses.dataclass
class Pending:
    """What one partition consumed since its last apply: the delta of offsets ``(base, last]``."""

    tp: TopicPartition
    epoch: int
    #: the delta covers offsets (base, last_offset]; -1: from the start of the log
    base: int = -1
    #: counts of the accepted reports so far: (layout of their version, fine bucket or None for
    #: all-time only) -> flat int64 cells (agents/store/layout.py; cell 0 = reports)
    deltas: dict[tuple[Layout, int | None], np.ndarray] = dataclasses.field(default_factory=dict)
    n: int = 0
    last_offset: int | None = None
    sent_at_max: float | None = None
    messages: int = 0
    since: float = dataclasses.field(default_factory=time.monotonic)
    rejects: list[Reject] = dataclasses.field(default_factory=list)
    #: reports refused, by reason
    rejected_reports: dict[str, int] = dataclasses.field(default_factory=dict)
    #: the first record taken, the partition's log mark if it has none yet (agents/ingest/log_identity.py)
    mark: LogMark | None = None
    #: reports counted per (limit's prefix, window) and device (agents/ingest/quota_gate.py), applied
    #: as side counters
    quota: dict[tuple[str, int], dict[int, int]] = dataclasses.field(default_factory=dict)
    #: batch-dedupe state this delta sets (agents/store/dedupe.py): window -> sender -> "high:bitmap"
    dedupe: dict[int, dict[int, str]] = dataclasses.field(default_factory=dict)
    #: buckets of each per-device side hash this delta writes (agents/store/side_buckets.py)
    side_buckets: dict[str, int] = dataclasses.field(default_factory=dict)
    #: keyed batches not counted: delivered before
    duplicates: int = 0
    #: memoized collections: what this delta writes to and reads back from each epoch's device
    #: log (agents/store/memo_log.py), by log name
    memo: dict[str, LogPending] = dataclasses.field(default_factory=dict)

    def cells(self) -> int:
        """The count cells this delta adds (each written per level by its apply)."""
        return sum(int(d.size) for d in self.deltas.values())

    def covers(self, offset: int) -> None:
        """Extend the delta's range to ``offset`` (one more message taken)."""
        self.last_offset = offset if self.last_offset is None else max(offset, self.last_offset)

    def reject(self, reason: str, detail: str, payload: bytes, offset: int, reports: int) -> None:
        """File a refused message (or part of one) holding ``reports`` reports."""
        self.rejects.append(Reject(reason, detail, payload, offset))
        self.rejected_reports[reason] = self.rejected_reports.get(reason, 0) + reports


@dataclasses.dataclass(frozen=True)
class Decoded:
    """Records of one take decoded (and their device's MAC checked) before their state is read:
    the batches and, for each record refused, its reason, detail and reports."""

    epoch: int
    #: the offsets of the records decoded, in order
    offsets: tuple[int, ...]
    good: list[tuple[ConsumerRecord, ReportBatch]]
    refused: list[tuple[ConsumerRecord, str, str, int]]


@dataclasses.dataclass(eq=False)
class PartitionState:
    """One assigned partition: where it stands in Redis and in the log, and what is pending."""

    tp: TopicPartition
    collection: str
    epoch: int
    #: the last offset applied to Redis (None: nothing counted yet)
    stored: int | None = None
    #: the highest offset taken (pending or applied); None: not positioned yet, records ignored
    seen: int | None = None
    pending: Pending | None = None
    #: (limit's prefix, window) -> device -> reports counted (applied and pending), for the
    #: devices of this poll only (read per poll: agents/ingest/quota_gate.py); None: not read
    quota_used: dict[tuple[str, int], dict[int, int]] | None = None
    #: each limit's window of this poll, by the worker's clock (never the producer's timestamp)
    quota_window: dict[str, int] = dataclasses.field(default_factory=dict)
    #: the batch-dedupe state (applied and pending) of this poll's senders only (read per poll:
    #: agents/ingest/dedupe_gate.py); None: not read
    dedupe: DedupeBook | None = None
    #: the dedupe window of this poll, by the worker's clock
    dedupe_window: int | None = None
    #: buckets of the per-device side hashes read (side name → B; agents/ingest/side_read.py)
    side_buckets: dict[str, int] = dataclasses.field(default_factory=dict)
    #: memoized collections: epoch -> the index of its log (each device's id and the position of
    #: its latest row in Redis, applied and pending; agents/ingest/memo_gate.py), this epoch and
    #: the one before; None: not loaded
    memo: dict[int, EpochLog] | None = None
    #: the epoch of this poll, by the worker's clock
    memo_epoch: int | None = None
    #: this poll's records decoded ahead of the take, to read their senders' and devices' state
    #: (agents/ingest/intake.py ``Intake.load``); None: none
    decoded: Decoded | None = None
    #: the delta handed to the flush in flight (until it is settled): its side values are not
    #: in Redis until its apply is (agents/ingest/intake.py ``Intake.load``)
    flushing: Pending | None = None
    #: poison-pill breaker (agents/ingest/breaker.py): size of the next careful chunk (None: normal)
    careful: int | None = None
    #: poison-pill breaker: offset of a message that killed the worker while processed alone
    poison_at: int | None = None
    #: the partition's offsets hash holds a log mark (agents/ingest/log_identity.py)
    marked: bool = False
    #: its log must be checked (position out of range, log ends below the stored offset)
    suspect: bool = False
    #: the offset the first record taken after positioning must carry (the stored offset + 1,
    #: or the log's start when nothing is stored); None: not known, or already met
    expect: int | None = None

    def open_pending(self, first: LogMark | None) -> Pending:
        """The running delta, started (continuing from ``seen``) if there is none; ``first`` is
        the mark of its first record (kept only while the partition has no mark)."""
        if self.pending is None:
            assert self.seen is not None, "a partition takes records only once positioned"
            self.pending = Pending(self.tp, self.epoch, base=self.seen,
                                   mark=None if self.marked else first)
        return self.pending


class Partitions:
    """The assigned partitions' states (topic-partition -> :class:`PartitionState`)."""

    def __init__(self) -> None:
        self._states: dict[TopicPartition, PartitionState] = {}
        #: per partition, bumped on every assignment, revocation and reset (never reused, so a
        #: delta taken before any of them is recognised as stale)
        self._epochs: dict[TopicPartition, int] = {}
        #: reports pending over all partitions
        self.pending_reports = 0

    def __iter__(self) -> Iterator[PartitionState]:
        return iter(list(self._states.values()))

    def __contains__(self, tp: object) -> bool:
        return tp in self._states

    def get(self, tp: TopicPartition) -> PartitionState | None:
        """The state of ``tp`` if it is assigned (and not revoked since)."""
        return self._states.get(tp)

    def _bump(self, tp: TopicPartition) -> int:
        epoch = self._epochs[tp] = self._epochs.get(tp, 0) + 1
        return epoch

    def assign(self, tp: TopicPartition, collection: str) -> PartitionState:
        """A fresh state for a newly assigned partition (not positioned yet)."""
        state = self._states[tp] = PartitionState(tp, collection, self._bump(tp))
        self.recount()
        return state

    def revoke(self, tp: TopicPartition) -> None:
        """Forget a revoked partition (what is pending of it becomes stale)."""
        if self._states.pop(tp, None) is not None:
            self._bump(tp)
        self.recount()

    def reset(self, state: PartitionState, seen: int | None) -> None:
        """The one place where a partition's taken-but-unapplied work is dropped: its pending
        delta, quota use and batch-dedupe state are forgotten, its epoch bumped (a delta in flight
        becomes stale) and its position set to ``seen`` (None: not positioned, records ignored)."""
        state.epoch = self._bump(state.tp)
        state.pending = None
        state.quota_used = None
        state.dedupe = None
        state.decoded = None
        state.flushing = None
        state.memo = None
        state.seen = seen
        self.recount()

    def is_stale(self, pend: Pending) -> bool:
        """``pend`` was taken before its partition was revoked or reset: it must not be applied."""
        state = self._states.get(pend.tp)
        return state is None or state.epoch != pend.epoch

    def take_pending(self, tps: list[TopicPartition]) -> dict[TopicPartition, Pending]:
        """Hand over the pending deltas of ``tps`` (for a flush)."""
        out = {}
        for tp in tps:
            state = self._states.get(tp)
            if state is not None and state.pending is not None:
                out[tp] = state.flushing = state.pending
                state.pending = None
        self.recount()
        return out

    def settled(self, pend: Pending) -> None:
        """``pend``'s flush is over (applied or not): no longer in flight."""
        state = self._states.get(pend.tp)
        if state is not None and state.flushing is pend:
            state.flushing = None

    def with_pending(self) -> list[TopicPartition]:
        return [s.tp for s in self._states.values() if s.pending is not None]

    def recount(self) -> None:
        self.pending_reports = sum(s.pending.n for s in self._states.values()
                                   if s.pending is not None)
