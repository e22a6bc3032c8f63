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
from ldpstream.agents.store import dedupe
from ldpstream.agents.store.apply_delta import SideValues
from ldpstream.agents.store.count_store import CountStore
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
    def wanted(state: PartitionState, senders: Sequence[str]) -> list[tuple[str, Sequence[str]]]:
        """The side hashes and fields a poll with keyed batches of ``senders`` (decimal ids)
        reads: the current and previous window of the worker's clock."""
        state.dedupe_window = w = dedupe.window_of(time.time())
        return [(dedupe.side_name(w - 1), senders), (dedupe.side_name(w), senders)] \
            if senders else []

    @staticmethod
    def took(state: PartitionState, senders: Sequence[str], values: Sequence[Sequence[bytes | None]],
             unapplied: Sequence[Pending]) -> None:
        """The poll's book from what :meth:`wanted` read (``values``: per window, per sender)
        and the side values of ``unapplied`` deltas (oldest first; not in Redis yet)."""
        w = state.dedupe_window
        assert w is not None
        ids = [int(s) for s in senders]
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
    def side(pend: Pending) -> dict[str, SideValues]:
        """The dedupe side values of a delta (each expiring after its window)."""
        return {dedupe.side_name(w): SideValues({str(d): v for d, v in senders.items()},
                                                expire_at=dedupe.expire_at(w))
                for w, senders in pend.dedupe.items() if senders}
