"""The ingest worker's Kafka clients, created when the ingest service starts (agents/ingest/service.py)
and shared by its parts: the group consumer of the report topics and the producer of
``ldp.dlq`` and ``ldp.config``. Also the Redis retry gate every part's Redis call goes through."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.conn import AIOKafkaConnection, CloseReason

from ldpstream.agents.ingest.partition import Partitions
from ldpstream.redis_client import TRANSIENT_ERRORS

log = logging.getLogger("ldpstream.agents.ingest.service")

#: retried with consumption paused (incl. a cluster failover)
REDIS_ERRORS = TRANSIENT_ERRORS

T = TypeVar("T")


class Abandoned(Exception):
    """A Redis call given up because what it was for went away (partitions revoked, consumer
    replaced)."""


class Clients:
    """The consumer and producer of one ingest service (None until started / after stop)."""

    def __init__(self) -> None:
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None

    def replaced(self, consumer: AIOKafkaConsumer) -> bool:
        """``consumer`` is no longer the service's (stopped or restarted meanwhile)."""
        return self.consumer is not consumer

    def assignment(self) -> set[TopicPartition]:
        return set(self.consumer.assignment()) if self.consumer is not None else set()


def watch_connections(consumer: AIOKafkaConsumer, on_change: Callable[[], None]) -> None:
    """Call ``on_change()`` whenever one of ``consumer``'s broker connections breaks or times
    out, and whenever a new one is made (a reconnection: the broker behind it may be another).

    A broker that restarts may come back with another log under the same partition (an
    in-memory broker, a topic deleted and recreated): a fetch from the stored position can then
    succeed on the new log, and its records would be counted as the old log's continuation
    before any rebalance or out-of-range error makes the worker look. The ingest service marks
    its partitions suspect at both ends and takes nothing from them until their logs are
    checked (agents/ingest/log_identity.py). The new connection is the end that cannot be
    missed: records of the new log arrive only over a connection made after it, while the
    break of the old one may come too early (a check can still reach a broker that is shutting
    down, find its log intact and clear the mark). aiokafka has no public hook for either; its
    client's close callback (bound per connection when the connection is made) and its
    connection factory are wrapped here, before the consumer starts."""
    client: AIOKafkaClient = consumer._client
    inner_closed = client._on_connection_closed
    inner_get = client._get_conn

    def closed(conn: AIOKafkaConnection, reason: CloseReason) -> None:
        inner_closed(conn, reason)
        if reason in (CloseReason.CONNECTION_BROKEN, CloseReason.CONNECTION_TIMEOUT):
            on_change()

    async def get_conn(node_id: int, *, group: ConnectionGroup = ConnectionGroup.DEFAULT,
                       no_hint: bool = False) -> AIOKafkaConnection | None:
        before = client._conns.get((node_id, group))
        conn = await inner_get(node_id, group=group, no_hint=no_hint)
        if conn is not None and conn is not before:
            on_change()
        return conn

    client._on_connection_closed = closed
    client._get_conn = get_conn


class RedisGate:
    """Redis calls retried while Redis is unreachable, with consumption paused meanwhile (every
    assigned partition: nothing is fetched, but the consumer keeps polling to stay in its group;
    agents/ingest/service.py point 5)."""

    def __init__(self, clients: Clients, partitions: Partitions) -> None:
        self.clients = clients
        self.partitions = partitions
        self.blocked = False

    async def retry(self, fn: Callable[[], Awaitable[T]], *, what: str,
                    abandon: Callable[[], bool] | None = None) -> T:
        """``await fn()`` until it succeeds, backing off 0.1 s → 2 s; raises :class:`Abandoned`
        once ``abandon()`` is true."""
        delay = 0.1
        blocked_at = None
        while True:
            if abandon is not None and abandon():
                if blocked_at is not None:  # else the partitions stayed paused for good
                    log.warning("ingest: gave up %s after %.1fs (revoked)", what,
                                time.monotonic() - blocked_at)
                    self.set_blocked(False)
                raise Abandoned(what)
            try:
                result = await fn()
            except REDIS_ERRORS as exc:
                if blocked_at is None:
                    blocked_at = time.monotonic()
                    log.warning("ingest: Redis unavailable (%s: %s) during %s; pausing "
                                "consumption and retrying", exc.__class__.__name__, exc, what)
                    self.set_blocked(True)
                await self._idle(delay)
                delay = min(delay * 2, 2.0)
                continue
            if blocked_at is not None:
                log.warning("ingest: Redis back after %.1fs; resuming (%s)",
                            time.monotonic() - blocked_at, what)
                self.set_blocked(False)
            return result

    def set_blocked(self, blocked: bool) -> None:
        self.blocked = blocked
        consumer = self.clients.consumer
        if consumer is None:
            return
        tps = self.clients.assignment()
        if blocked:
            consumer.pause(*tps)
        else:  # partitions still being positioned (on assignment) stay paused
            consumer.resume(*(tp for tp in tps if self.positioned(tp)))

    def positioned(self, tp: TopicPartition) -> bool:
        state = self.partitions.get(tp)
        return state is not None and state.seen is not None

    async def _idle(self, seconds: float) -> None:
        """Wait while blocked. Partitions are paused, so nothing is fetched; partitions newly
        assigned meanwhile are paused as soon as they appear."""
        await asyncio.sleep(seconds)
        consumer = self.clients.consumer
        if consumer is not None and self.blocked:
            new = self.clients.assignment() - set(consumer.paused())
            if new:
                consumer.pause(*new)
