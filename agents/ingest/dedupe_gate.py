"""Idempotent batches in the ingest worker: each partition's senders' dedupe state (the highest
sequence and a bitmap below it, agents/store/dedupe.py) loaded from its side hashes at the stored
offset, the verdict on each keyed batch, and the side values an apply sets with the counts
(docs/pipeline.md "Wire format", docs/security.md "Idempotent batches")."""
from __future__ import annotations

import time

from aiokafka.structs import ConsumerRecord

from ldpstream.agents.ingest.acks import AckReconciler
from ldpstream.agents.ingest.clients import RedisGate
from ldpstream.agents.ingest.partition import PartitionState, Pending
from ldpstream.agents.store import dedupe
from ldpstream.agents.store.apply_delta import SideValues
from ldpstream.agents.store.count_store import CountStore
from ldpstream.producers.codec import ReportBatch


class DedupeGate:
    """The batch-dedupe state of the assigned partitions."""

    def __init__(self, gate: RedisGate, store: CountStore,
                 acks: AckReconciler | None = None) -> None:
        self.gate = gate
        self.store = store
        #: told of the sequences an authenticated device skipped (acknowledged, never here)
        self.acks = acks

    async def load(self, state: PartitionState) -> None:
        """Read the senders' state of the current and previous window of the worker's clock,
        unless already in memory (it is dropped with the partition's pending work on a reset)."""
        book = state.dedupe
        if book is None or book.epoch != state.epoch:
            book = state.dedupe = dedupe.DedupeBook(state.epoch)
        state.dedupe_window = w = dedupe.window_of(time.time())
        for missing in book.missing(w):
            name = dedupe.side_name(missing)
            raw = await self.gate.retry(
                lambda: self.store.read_side_raw(state.collection, state.tp.partition, name),
                what=f"read the batch-dedupe state of {state.collection}[{state.tp.partition}]")
            if state.dedupe is not book:  # reset meanwhile: read again for the new epoch
                return await self.load(state)
            book.load(missing, raw)

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
