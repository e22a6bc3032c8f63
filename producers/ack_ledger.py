"""What a gateway or MQTT bridge acknowledged to devices, per fleet and collection, published to
``ldp.acks`` for the workers' reconciliation (docs/security.md "Acknowledged equals counted").

Each process has a random instance id; every :data:`~ldpstream.names.ACK_FLUSH_S` it publishes,
for each (fleet, collection) whose count changed, one record keyed
``<instance>/<fleet>/<collection>`` (the topic is compacted) with the cumulative number of
reports acknowledged: ``{"instance", "via", "fleet", "collection", "reports", "at"}``. Only
batches authenticated by their device are recorded (their fleet is what the worker verifies).
A publish that fails is retried at the next flush and counted in
``ldp_ack_publish_failures_total``; it never holds up an acknowledgement.
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time

from prometheus_client import CollectorRegistry, Counter

from ldpstream.names import ACK_FLUSH_S, ACKS_TOPIC
from ldpstream.producers.publisher import Publisher

log = logging.getLogger(__name__)


class AckMetrics:
    """The ledger's series in one process's registry (the gateway's or the bridge's)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter("ldp_ack_publish_failures_total", "Flushes of the acknowledged "
                                "counts to ldp.acks that failed (retried at the next flush).",
                                registry=registry)
        self.acked = Counter("ldp_acked_reports_total", "Reports of device-authenticated "
                             "batches acknowledged to devices, by fleet and collection.",
                             ["fleet", "collection"], registry=registry)


class AckLedger:
    """Cumulative acknowledged reports of one process, flushed to ``ldp.acks``."""

    def __init__(self, publisher: Publisher, via: str, metrics: "AckMetrics") -> None:
        self.publisher = publisher
        self.via = via
        self.instance = f"{via}-{secrets.token_hex(6)}"
        self.acked: dict[tuple[str, str], int] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None
        self.failures, self.acked_total = metrics.failures, metrics.acked

    def add(self, fleet: str, collection: str, reports: int) -> None:
        key = (fleet, collection)
        self.acked[key] = self.acked.get(key, 0) + int(reports)
        self._dirty.add(key)
        self.acked_total.labels(fleet, collection).inc(reports)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ldp-ack-ledger")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(ACK_FLUSH_S)
            await self.flush()

    async def flush(self) -> None:
        """Publish the changed counts (once Kafka acknowledged them they are clean)."""
        todo, self._dirty = self._dirty, set()
        if not todo:
            return
        try:
            futures = [await self.publisher.send(ACKS_TOPIC, json.dumps(
                {"instance": self.instance, "via": self.via, "fleet": f, "collection": c,
                 "reports": self.acked[(f, c)], "at": time.time()}).encode(),
                key=f"{self.instance}/{f}/{c}".encode()) for f, c in sorted(todo)]
            await asyncio.wait_for(asyncio.gather(*futures), 10.0)
        except Exception as exc:  # noqa: BLE001 - retried at the next flush
            self._dirty |= todo
            self.failures.inc()
            log.warning("%s: could not publish the acknowledged counts to %s: %s", self.via,
                        ACKS_TOPIC, exc)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()
