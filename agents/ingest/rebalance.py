"""Rebalance and seek in the ingest worker: partitions are positioned at the offset stored in
Redis (never Kafka's committed offset) when assigned, after a log check and after a conflict.

Assigned: a fresh :class:`~.partition.PartitionState`, the log checked (agents/ingest/log_check.py),
the consumer sought to ``stored + 1`` (the beginning when nothing is stored), the breaker told
(agents/ingest/breaker.py), then resumed. Revoked: the state is dropped with what is pending (the next
owner re-reads the offset from Redis and re-consumes it), after an apply in flight touching the
partition has finished (not needed for correctness since the compare-and-set, it spares the new
owner a conflict).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from ldpstream.agents.ingest.breaker import Breaker
from ldpstream.agents.ingest.clients import Abandoned, Clients, RedisGate
from ldpstream.agents.ingest.log_check import LogCheck
from ldpstream.agents.ingest.partition import Partitions, PartitionState

log = logging.getLogger("ldpstream.agents.ingest.service")


class Seeker:
    """Re-positions a partition at its stored offset, dropping what is pending of it."""

    def __init__(self, clients: Clients, partitions: Partitions) -> None:
        self.clients = clients
        self.partitions = partitions

    async def resync(self, state: PartitionState, stored: int | None) -> None:
        """Drop what is pending for ``state``'s partition and re-seek it to ``stored + 1`` (the
        beginning when nothing is stored), unless it was revoked or re-assigned meanwhile."""
        consumer = self.clients.consumer
        tp = state.tp
        if consumer is None or self.partitions.get(tp) is not state \
                or tp not in self.clients.assignment():
            return
        state.stored = stored
        if stored is not None:
            self.partitions.reset(state, seen=stored)
            consumer.seek(tp, stored + 1)
        else:
            self.partitions.reset(state, seen=None)  # ignore records until positioned
            epoch = state.epoch
            await consumer.seek_to_beginning(tp)
            if state.epoch == epoch and self.partitions.get(tp) is state:
                state.seen = -1


class Rebalancer:
    """The consumer's partition assignment, revocation and log re-checks."""

    def __init__(self, cid_of: dict[str, str], clients: Clients, gate: RedisGate,
                 partitions: Partitions, log_check: LogCheck, breaker: Breaker,
                 applying: set[TopicPartition]) -> None:
        self.cid_of = cid_of    # report topic -> collection
        self.clients = clients
        self.gate = gate
        self.partitions = partitions
        self.log_check = log_check
        self.breaker = breaker
        self.applying = applying  # partitions of the apply in flight (agents/ingest/applier.py)
        self.assigned_at: float | None = None
        #: the process's CPU seconds when ``assigned_at`` was set
        self.assigned_cpu: float | None = None

    async def on_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        """Position every newly assigned partition at its Redis offset + 1 (the beginning when
        none is stored). The partitions stay paused (and not positioned) until then."""
        consumer = self.clients.consumer
        if consumer is None:
            return
        states = [self.partitions.assign(tp, self.cid_of[tp.topic]) for tp in set(assigned)]
        consumer.pause(*(s.tp for s in states))
        by_cid: dict[str, list[TopicPartition]] = defaultdict(list)
        for s in states:
            by_cid[s.collection].append(s.tp)
        stored_of: dict[TopicPartition, int | None] = {}
        try:
            for cid, tps in by_cid.items():
                stored_of.update(await self.log_check.positions(cid, tps, consumer))
        except Abandoned:
            return
        if self.clients.replaced(consumer):
            return
        for s in states:
            stored = stored_of[s.tp]
            if stored is not None:
                consumer.seek(s.tp, stored + 1)
        await self.seek_starts(consumer, [s.tp for s in states if stored_of[s.tp] is None])
        current = self.clients.assignment()
        ready = [s for s in states if s.tp in current and self.partitions.get(s.tp) is s]
        for s in ready:
            await self.breaker.hold(s, stored_of[s.tp])
        for s in ready:
            stored = s.stored = stored_of[s.tp]
            s.seen = -1 if stored is None else stored
            s.expect = self.first_offset(s.tp, stored)
        if not self.gate.blocked and ready:
            consumer.resume(*(s.tp for s in ready))
        self.assigned_at = time.time()
        self.assigned_cpu = time.process_time()
        log.info("ingest: assigned %s", sorted((s.tp.topic, s.tp.partition, stored_of[s.tp])
                                               for s in states))

    async def on_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        revoked = set(revoked)
        for tp in revoked:
            self.partitions.revoke(tp)
        # an apply already sent for a revoked partition must finish before another owner reads
        while self.applying & revoked:
            await asyncio.sleep(0.01)
        await self.release(revoked)

    async def release(self, tps: Iterable[TopicPartition]) -> None:
        """Tell the breaker these partitions were let go cleanly (best effort)."""
        by_cid: dict[str, list[int]] = defaultdict(list)
        for tp in tps:
            by_cid[self.cid_of[tp.topic]].append(tp.partition)
        for cid, parts in by_cid.items():
            try:
                await asyncio.wait_for(self.breaker.release(cid, parts), 2.0)
            except Exception as exc:  # noqa: BLE001
                log.warning("ingest: could not release %s %s: %s", cid, parts, exc)

    async def seek_starts(self, consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> None:
        """Position ``tps`` (nothing stored) at the log start their check read, explicitly: the
        same offset :meth:`first_offset` expects, not a reset answered whenever the broker
        answers (the beginning, as aiokafka resolves it, where the check could not read it)."""
        known = [tp for tp in tps if tp in self.log_check.starts]
        for tp in known:
            consumer.seek(tp, self.log_check.starts[tp])
        rest = [tp for tp in tps if tp not in self.log_check.starts]
        if rest:
            await consumer.seek_to_beginning(*rest)

    def first_offset(self, tp: TopicPartition, stored: int | None) -> int | None:
        """The offset the first record taken after positioning at ``stored`` + 1 (at the log's
        start when None) must carry; None when the check could not read the log's start."""
        return stored + 1 if stored is not None else self.log_check.starts.get(tp)

    def suspect(self, tps: Iterable[TopicPartition]) -> None:
        """Mark partitions whose log must be checked (out of range, ends below the stored
        offset); :meth:`check_suspects` checks them."""
        for tp in tps:
            state = self.partitions.get(tp)
            if state is not None:
                state.suspect = True

    def has_suspects(self) -> bool:
        return any(s.suspect for s in self.partitions)

    async def check_suspects(self, wait_flushed: Callable[[], Awaitable[None]]) -> None:
        """Check the logs of the suspect partitions and re-position them (nothing pending of
        theirs is kept; ``wait_flushed`` lets the flush in flight end first)."""
        consumer = self.clients.consumer
        assigned = self.clients.assignment()
        states = [s for s in self.partitions if s.suspect]
        for s in states:
            s.suspect = False
        states = [s for s in states if s.tp in assigned]
        if consumer is None or not states:
            return
        consumer.pause(*(s.tp for s in states))
        by_cid: dict[str, list[TopicPartition]] = defaultdict(list)
        for s in states:
            by_cid[s.collection].append(s.tp)
            self.partitions.reset(s, seen=None)  # what is pending is from before the check
        await wait_flushed()
        for cid, group in by_cid.items():
            try:
                positions = await self.log_check.positions(cid, group, consumer)
            except Abandoned:
                return
            if self.clients.replaced(consumer):
                return
            for tp, stored in positions.items():
                state = self.partitions.get(tp)
                if state is None or tp not in self.clients.assignment():
                    continue
                state.stored = stored
                if stored is None:
                    await self.seek_starts(consumer, [tp])
                else:
                    consumer.seek(tp, stored + 1)
                state.seen = -1 if stored is None else stored
                state.expect = self.first_offset(tp, stored)
        if not self.gate.blocked:
            consumer.resume(*(s.tp for s in states if self.gate.positioned(s.tp)))


class Listener(ConsumerRebalanceListener):
    """aiokafka rebalance listener delegating to the :class:`Rebalancer` (both callbacks are
    awaited by aiokafka's coordinator before it proceeds)."""

    def __init__(self, rebalancer: Rebalancer) -> None:
        self.rebalancer = rebalancer

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.rebalancer.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.rebalancer.on_assigned(assigned)
