"""Keeping ``ldp.config`` and ``ldp.dlq`` alive (docs/security.md "The control topic").

Every :data:`CHECK_S` seconds the worker checks the broker: topics it needs that are missing
(e.g. after an in-memory broker lost its logs) are created again, ``ldp.dlq`` before anything is
produced to it; and every collection's signed state is republished when ``ldp.config`` was
recreated, is empty, or its log ends below where it ended at the last check (log loss), when
more than :data:`FLOOD_RECORDS` records (or 10 per published state, so that other workers'
republications never look like one) were written to it since the last publication (a flood:
so the newest valid states stay near its end, where watchers of given collections look first,
producers/device.py ``TAIL_RECORDS``), and in any case every :data:`REPUBLISH_S` (a quarter of
the state's validity, producers/signing.py ``STATE_TTL_S``), so that a state never expires on
devices. Devices
that adopted a newer state refuse an older one replayed meanwhile (``replayed``), new devices
refuse it once expired.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable, Mapping

from ldpstream.agents import metrics
from ldpstream.producers.signing import STATE_TTL_S

log = logging.getLogger(__name__)

__all__ = ["CHECK_S", "REPUBLISH_S", "FLOOD_RECORDS", "ControlTopics"]

CHECK_S = 5.0
REPUBLISH_S = STATE_TTL_S / 4
FLOOD_RECORDS = 1000


class ControlTopics:
    """The broker-side checks of one worker; ``publish()`` republishes every collection's signed
    state (``states`` of them), ``create(topics)`` creates the missing ones of
    ``{name: partitions}`` (returns the names created)."""

    def __init__(self, bootstrap: str, topics: Mapping[str, int], config_topic: str,
                 publish: Callable[[], Awaitable[None]],
                 create: Callable[[Mapping[str, int]], Awaitable[list[str]]],
                 client_kwargs: Mapping[str, Any], states: int) -> None:
        self.bootstrap = bootstrap
        self.topics = dict(topics)
        #: records since the last publication that make a flood
        self.flood_records = max(FLOOD_RECORDS, 10 * int(states))
        self.config_topic = config_topic
        self.publish = publish
        self.create = create
        self.client_kwargs = dict(client_kwargs)
        self._consumer: Any = None
        self._last_end: int | None = None
        self._published_end = 0     # end offset of ldp.config after the last publication
        self._published_at = time.monotonic()
        self.republished: list[dict[str, Any]] = []   # the last events (for /healthz, logs)

    async def start(self) -> "ControlTopics":
        from aiokafka import AIOKafkaConsumer

        self._consumer = consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
            client_id="ldpstream-control", **self.client_kwargs)
        try:
            await consumer.start()
            self._last_end = self._published_end = await self._config_end()
        except BaseException:   # failed or cancelled while starting: nothing left open
            self._consumer = None
            await consumer.stop()
            raise
        return self

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def ensure(self, names: list[str] | None = None) -> list[str]:
        """Create those of ``names`` (default: every topic) the broker does not have."""
        assert self._consumer is not None
        have = await self._consumer.topics()
        missing = {t: p for t, p in self.topics.items()
                   if t not in have and (names is None or t in names)}
        if not missing:
            return []
        created = await self.create(missing)
        log.warning("control: created missing topics %s", sorted(created or missing))
        return sorted(missing)

    async def _config_end(self) -> int:
        from aiokafka import TopicPartition

        tp = TopicPartition(self.config_topic, 0)
        return int((await self._consumer.end_offsets([tp]))[tp])

    async def check(self) -> str | None:
        """One check; returns why every state was republished (None: it was not)."""
        created = await self.ensure()
        end = await self._config_end()
        why = None
        if self.config_topic in created:
            why, detail = "recreated", "ldp.config was missing"
        elif end == 0:
            why, detail = "empty", "ldp.config is empty"
        elif self._last_end is not None and end < self._last_end:
            why, detail = "shrank", f"its log ends at {end}, was {self._last_end}"
        elif end - self._published_end > self.flood_records:
            why, detail = "flood", f"{end - self._published_end} records since the last one"
        elif time.monotonic() - self._published_at >= REPUBLISH_S:
            why, detail = "expiry", f"every {REPUBLISH_S:g} s"
        if why is not None:
            metrics.CONFIG_REPUBLISHED.labels(why).inc()
            await self.publish()
            self._published_at = time.monotonic()
            end = self._published_end = await self._config_end()
            self.republished = (self.republished + [{"at": time.time(), "why": why,
                                                     "detail": detail}])[-20:]
            log.warning("control: republished every signed state (%s: %s)", why, detail)
        self._last_end = end
        return why
