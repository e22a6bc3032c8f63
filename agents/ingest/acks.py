"""Acknowledged equals counted (docs/security.md "Acknowledged equals counted"): the gateways
and MQTT bridges publish how many reports of device-authenticated batches they acknowledged per
fleet and collection (``ldp.acks``, producers/ack_ledger.py); every worker adds what it took of
them (verified by agents/ingest/identity_gate.py, then counted or dead-lettered) to one Redis
hash per collection; each worker compares the two every
:data:`~ldpstream.names.ACK_CHECK_S`. A report acknowledged more than
:data:`~ldpstream.names.ACK_SETTLE_S` ago that no worker took is a *gap*: reports a device was
told were delivered and that never reached a worker (an MQTT subscriber that swallowed them, a
lost produce). It shows in ``ldp_ack_gap_reports{collection,fleet}``, ``/healthz``
(``checks.acks``) and the alert ``AckedNotCounted``.

The taken counts are not exactly-once (a worker killed after taking a poll takes it again),
so a gap can be hidden by as many re-taken reports; it is never shown where there is none."""
from __future__ import annotations

import json
import logging
import time
from collections import defaultdict, deque
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from ldpstream.agents import metrics
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.keys import acks_taken_key
from ldpstream.names import ACK_SETTLE_S, ACKS_TOPIC

log = logging.getLogger(__name__)


class AckReconciler:
    """The taken side (fed by the identity gate) and the comparison."""

    def __init__(self, store: CountStore, bootstrap: str, kafka_kwargs: dict[str, Any]) -> None:
        self.store = store
        self.bootstrap = bootstrap
        self.kafka_kwargs = kafka_kwargs
        #: (collection, fleet) → reports taken since the last flush to Redis
        self.pending: dict[tuple[str, str], int] = defaultdict(int)
        #: record key → (monotonic time seen, cumulative reports), oldest first
        self.history: dict[bytes, deque[tuple[float, int, str, str]]] = {}
        self.consumer: AIOKafkaConsumer | None = None
        #: the last comparison, per "collection/fleet"
        self.gaps: dict[str, dict[str, int]] = {}
        self.error: str | None = None
        #: (collection, fleet) → sequences skipped minus those filled late, this worker
        self.missing: dict[tuple[str, str], int] = {}

    def took(self, collection: str, fleet: str, reports: int) -> None:
        self.pending[(collection, fleet)] += int(reports)

    def sequence(self, collection: str, fleet: str, holes: int) -> None:
        """A device's new batch skipped ``holes`` sequences (> 0), or filled one (-1): a device
        sends sequence s only once s - 1 was acknowledged (docs/device-protocol.md section 4),
        so a skipped sequence is a batch acknowledged by the edge (the MQTT broker's PUBACK
        included) that never reached a worker, unless it arrives late."""
        key = (collection, fleet)
        self.missing[key] = self.missing.get(key, 0) + holes
        if holes > 0:
            metrics.BATCHES_MISSING.labels(collection, fleet).inc(holes)
        else:
            metrics.BATCHES_LATE.labels(collection, fleet).inc(-holes)

    async def tick(self) -> None:
        try:
            await self._flush_taken()
            await self._read_acks()
            await self._compare()
            self.error = None
        except Exception as exc:  # noqa: BLE001 - shown in /healthz, tried again next tick
            self.error = f"{exc.__class__.__name__}: {exc}"
            log.warning("acks: reconciliation failed: %s", self.error)

    async def _flush_taken(self) -> None:
        todo, self.pending = self.pending, defaultdict(int)
        try:
            for (cid, fleet), n in todo.items():
                await self.store.redis.hincrby(acks_taken_key(cid), fleet, n)
        except Exception:
            for k, n in todo.items():
                self.pending[k] += n
            raise

    async def _read_acks(self) -> None:
        if self.consumer is None:
            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                        enable_auto_commit=False, auto_offset_reset="earliest",
                                        **self.kafka_kwargs)
            await consumer.start()
            consumer.assign([TopicPartition(ACKS_TOPIC, 0)])
            self.consumer = consumer
        now = time.monotonic()
        while True:
            batches = await self.consumer.getmany(timeout_ms=200, max_records=10_000)
            records = [m for msgs in batches.values() for m in msgs]
            if not records:
                return
            for m in records:
                try:
                    doc = json.loads(m.value)
                    entry = (now, int(doc["reports"]), str(doc["collection"]), str(doc["fleet"]))
                except (ValueError, KeyError, TypeError):
                    continue
                self.history.setdefault(m.key or b"", deque()).append(entry)

    async def _compare(self) -> None:
        settled: dict[tuple[str, str], int] = defaultdict(int)
        cutoff = time.monotonic() - ACK_SETTLE_S
        for hist in self.history.values():
            while len(hist) > 1 and hist[1][0] <= cutoff:
                hist.popleft()      # the newest settled value is all a comparison needs
            seen, reports, cid, fleet = hist[0]
            if seen <= cutoff:
                settled[(cid, fleet)] += reports
        gaps: dict[str, dict[str, int]] = {}
        for cid in sorted({c for c, _ in settled}):
            raw = await self.store.redis.hgetall(acks_taken_key(cid))
            taken = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
            for (c, fleet), acked in settled.items():
                if c != cid:
                    continue
                got = taken.get(fleet, 0)
                gaps[f"{cid}/{fleet}"] = {"acked": acked, "taken": got, "gap": acked - got}
                metrics.ACK_GAP.labels(cid, fleet).set(max(acked - got, 0))
        self.gaps = gaps

    def status(self) -> dict[str, Any]:
        """``checks.acks`` of ``/healthz``."""
        bad = {k: v for k, v in self.gaps.items() if v["gap"] > 0}
        missing = {f"{c}/{f}": n for (c, f), n in self.missing.items() if n > 0}
        return {"ok": not bad and not missing and self.error is None, "settle_s": ACK_SETTLE_S,
                "gaps": bad, "fleets": self.gaps, "missing_batches": missing,
                "error": self.error}

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
