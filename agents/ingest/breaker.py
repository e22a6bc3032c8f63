"""The poison-pill breaker of the ingest worker.

When a worker takes a partition whose previous owner died holding it (never released it), the
messages after the stored offset are processed in chunks of 1, 2, 4, ... messages, each chunk
recorded in Redis before it is processed and applied right after. If the worker dies again, the
next owner reads which chunk it was: a message that killed the worker while processed alone (the
second death at it) goes to ``ldp.dlq`` as ``poison_pill``, unprocessed; a bigger chunk starts
over at size 1. So a message that crashes the worker twice never causes a crash loop. Chunks
reaching ``max_records`` messages end careful processing (docs/security.md).
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiokafka.structs import ConsumerRecord

from ldpstream.agents.ingest.clients import RedisGate
from ldpstream.agents.ingest.faults import Load, Take
from ldpstream.agents.ingest.log_identity import mark_of
from ldpstream.agents.ingest.partition import Partitions, PartitionState
from ldpstream.agents.ingest.stats import IngestStats
from ldpstream.agents.store.count_store import CountStore

log = logging.getLogger("ldpstream.agents.ingest.service")


class Breaker:
    """Careful processing of partitions whose previous owner died holding them."""

    def __init__(self, gate: RedisGate, partitions: Partitions, store: CountStore,
                 stats: IngestStats, load: Load, take: Take,
                 flush: Callable[[], Awaitable[None]], max_records: int) -> None:
        self.gate = gate
        self.partitions = partitions
        self.store = store
        self.stats = stats
        self.load = load
        self.take = take
        self.flush = flush
        self.max_records = max_records

    async def hold(self, state: PartitionState, stored: int | None) -> None:
        """Mark the partition held by this worker (from its ``stored`` offset); if the previous
        owner died holding it, process it carefully from there."""
        died, chunk = await self.gate.retry(
            lambda: self.store.hold(state.collection, state.tp.partition, stored),
            what=f"hold {state.tp.topic}[{state.tp.partition}]")
        state.careful = state.poison_at = None
        if died:  # the previous owner died holding it: find the message, if one killed it
            state.careful = 1
            first = 0 if stored is None else stored + 1
            if chunk is not None and chunk == (first, 1):
                state.poison_at = first
            log.warning("ingest: %s[%d]: the previous owner died holding it; processing from "
                        "offset %s carefully (poison-pill breaker)", state.tp.topic,
                        state.tp.partition, first)

    async def release(self, cid: str, partitions: list[int]) -> None:
        """Tell the breaker these partitions were let go cleanly (best effort: if Redis does not
        answer, the next owner processes them carefully, which is only slower)."""
        await self.store.release(cid, partitions)

    async def take_carefully(self, state: PartitionState, msgs: list[ConsumerRecord]) -> None:
        """Take ``msgs`` chunk by chunk (module docstring), each applied before the next."""
        cid, tp = state.collection, state.tp
        pos = 0
        while pos < len(msgs):
            seen = state.seen
            if seen is None or self.partitions.get(tp) is not state or state.careful is None:
                return
            while pos < len(msgs) and msgs[pos].offset <= seen:
                pos += 1
            if pos >= len(msgs):
                return
            size = state.careful
            chunk = msgs[pos:pos + size]
            if state.poison_at == chunk[0].offset:
                state.poison_at = None
                self._poison(state, chunk[0])
                chunk = chunk[:1]
            else:
                first = chunk[0].offset
                await self.gate.retry(
                    lambda: self.store.note_chunk(cid, tp.partition, first, len(chunk)),
                    what=f"note a chunk of {cid}[{tp.partition}]")
                await self.load(state, chunk)  # a flush may have re-sought it meanwhile
                self.take(state, chunk)
            pos += len(chunk)
            await self.flush()  # applied before the next chunk is tried
            if state.careful is None:
                return
            state.careful = size * 2
            if state.careful > self.max_records:
                state.careful = None
                log.warning("ingest: %s[%d] back to normal processing after offset %d", cid,
                            tp.partition, chunk[-1].offset)
                if pos < len(msgs):
                    await self.load(state, msgs[pos:])
                    self.take(state, msgs[pos:])
                return

    def _poison(self, state: PartitionState, m: ConsumerRecord) -> None:
        """File ``m`` in the DLQ unprocessed; its offset is covered by the partition's delta."""
        pend = state.open_pending(mark_of(m))
        state.seen = m.offset
        pend.messages += 1
        pend.covers(m.offset)
        self.stats.poison_pills += 1
        log.error("ingest: %s[%d] offset %d: the worker died twice processing this message; "
                  "dead-lettered unprocessed as poison_pill", state.collection,
                  state.tp.partition, m.offset)
        pend.reject("poison_pill", "the worker died while processing this message alone, after "
                    "an earlier death holding the partition", m.value or b"", m.offset, 1)
