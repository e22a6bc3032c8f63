"""Idempotent batches in the ingest worker: the dedupe state (the highest sequence and a bitmap
below it, agents/store/dedupe.py) of each poll's senders, read from the partition's side hashes
with the stored offset, the verdict on each keyed batch, and the side values an apply sets with
the counts (docs/pipeline.md "Wire format", docs/security.md "Idempotent batches")."""
from __future__ import annotations

import time
from collections.abc import Sequence

from aiokafka.structs import ConsumerRecord

from ldpstream.agents.ingest.acks import AckReconciler
from ldpstream.agents.ingest.clients import RedisGate
from ldpstream.agents.ingest.partition import PartitionState, Pending
from ldpstream.agents.ingest.side_read import SideWant
from ldpstream.agents.store import dedupe, keys
from ldpstream.agents.store.apply_delta import SideBucketMeta, SideValues
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.side_buckets import split_buckets
from ldpstream.producers.codec import ReportBatch


class DedupeGate:
    """The batch-dedupe state of the assigned partitions: read per poll for that poll's senders
    (agents/ingest/intake.py ``Intake.load``), never held for every sender."""

    def __init__(self, gate: RedisGate, store: CountStore,
                 acks: AckReconciler | None = None) -> None:
        self.gate = gate
        self.store = store
        #: told of the sequences an authenticated device skipped (acknowledged, never here)
        self.acks = acks

    @staticmethod
    def wanted(state: PartitionState, senders: Sequence[int]) -> list[SideWant]:
        """The side hashes and fields a poll with keyed batches of ``senders`` reads: the
        current and previous window of the worker's clock."""
        state.dedupe_window = w = dedupe.window_of(time.time())
        return [SideWant(dedupe.side_name(v), dedupe.side_name(v - 1), senders, False)
                for v in (w - 1, w)] if senders else []

    @staticmethod
    def took(state: PartitionState, senders: Sequence[int], values: Sequence[Sequence[bytes | None]],
             unapplied: Sequence[Pending]) -> None:
        """The poll's book from what :meth:`wanted` read (``values``: per window, per sender)
        and the side values of ``unapplied`` deltas (oldest first; not in Redis yet)."""
        w = state.dedupe_window
        assert w is not None
        ids = list(senders)
        book = dedupe.DedupeBook(state.epoch, known=frozenset(ids))
        for window, vals in zip((w - 1, w), values or ([], [])):
            raw: dict[int, str | bytes] = {d: v for d, v in zip(ids, vals) if v is not None}
            for pend in unapplied:
                later = pend.dedupe.get(window)
                if later:
                    raw.update({d: later[d] for d in ids if d in later})
            book.load(window, raw)
        state.dedupe = book

    def first_delivery(self, state: PartitionState, pend: Pending, m: ConsumerRecord,
                       b: ReportBatch) -> bool:
        """Whether keyed batch ``b`` is counted: a duplicate is skipped (and counted as one), a
        sequence too far below its sender's highest goes to the DLQ."""
        book, window = state.dedupe, state.dedupe_window
        if book is None or window is None or book.epoch != pend.epoch or b.key is None:
            raise RuntimeError(f"batch-dedupe state of {state.tp} not loaded for this epoch")
        sender, seq = b.key
        before = book.state_of(window, sender) if self.acks is not None and b.fleet else None
        verdict = book.decide(window, sender, seq, pend.dedupe)
        if verdict == dedupe.NEW:
            name = dedupe.side_name(window)
            pend.side_buckets[name] = state.side_buckets[name]
        if self.acks is not None and before is not None and b.fleet is not None \
                and verdict == dedupe.NEW:
            self.acks.sequence(state.collection, b.fleet, seq - before[0] - 1 if seq > before[0]
                               else -1)
        if verdict == dedupe.DUPLICATE:
            pend.duplicates += 1
        elif verdict == dedupe.STALE:
            pend.reject("stale_sequence", f"sequence {seq} of sender {sender} is more than "
                        f"{dedupe.BITS} below the highest seen; it may have been counted",
                        m.value or b"", m.offset, b.n)
        return verdict == dedupe.NEW

    @staticmethod
    def side(pend: Pending) -> dict[str, SideValues | SideBucketMeta]:
        """The dedupe side values of a delta, bucketed, each window's meta after its buckets
        (all expiring after their window)."""
        out: dict[str, SideValues | SideBucketMeta] = {}
        for w, senders in pend.dedupe.items():
            if senders:
                name, exp = dedupe.side_name(w), dedupe.expire_at(w)
                b = pend.side_buckets[name]
                for bucket, values in split_buckets(name, b, senders):
                    out[bucket] = SideValues(values, expire_at=exp)
                out[keys.side_meta_name(name)] = SideBucketMeta(b, expire_at=exp)
        return out
