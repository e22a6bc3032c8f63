"""The log-identity check of the ingest worker: before a partition is consumed from its stored
offset, make sure its log is the one that offset was counted from (agents/ingest/log_identity.py has the
rules), re-basing the stored offset by compare-and-set and reporting it when not."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from ldpstream.agents import metrics
from ldpstream.agents.ingest.clients import Clients, RedisGate
from ldpstream.agents.ingest.log_identity import LogMark, judge, mark_of
from ldpstream.agents.ingest.partition import Partitions
from ldpstream.agents.store.count_store import CountStore

log = logging.getLogger("ldpstream.agents.ingest.service")

#: seconds a check waits for the logs' start offsets (a topic not created yet: no answer)
START_TIMEOUT_S = 10.0


class LogCheck:
    """Stored offsets checked against the logs (on assignment, out-of-range, short logs)."""

    def __init__(self, clients: Clients, gate: RedisGate, partitions: Partitions,
                 store: CountStore, bootstrap: str, client_kwargs: dict[str, Any]) -> None:
        self.clients = clients
        self.gate = gate
        self.partitions = partitions
        self.store = store
        self.bootstrap = bootstrap
        self.client_kwargs = client_kwargs
        #: logs found recreated / truncated / with a retention gap (newest last)
        self.resets: list[dict[str, Any]] = []
        #: each partition's log start offset at its last check
        self.starts: dict[TopicPartition, int] = {}

    async def positions(self, cid: str, tps: list[TopicPartition],
                        consumer: AIOKafkaConsumer) -> dict[TopicPartition, int | None]:
        """Stored offset of each of ``tps`` after checking that its log is the one it was counted
        from (and, in :attr:`starts`, the log's start offset as the check saw it). Raises
        :class:`~.clients.Abandoned` when the consumer was replaced meanwhile."""
        states = await self.gate.retry(
            lambda: self.store.log_states(cid, [tp.partition for tp in tps]),
            what=f"read offsets of {cid}", abandon=lambda: self.clients.replaced(consumer))
        out: dict[TopicPartition, int | None] = {}
        todo = []
        for tp in tps:
            self.starts.pop(tp, None)
            stored, raw = states[tp.partition]
            self._set_marked(tp, raw is not None)
            out[tp] = stored
            if stored is not None:
                todo.append((tp, stored, None if raw is None else LogMark.parse(raw)))
        t0 = time.monotonic()
        try:
            # every partition's start, also those with nothing stored: the first record taken
            # after positioning them at the beginning must carry it (agents/ingest/intake.py)
            start = await asyncio.wait_for(consumer.beginning_offsets(tps), START_TIMEOUT_S)
            self.starts.update(start)
            if not todo:
                return out
            end = await consumer.end_offsets([tp for tp, _, _ in todo])
            end.update(await self._read_ends({tp: end[tp] for tp, stored, _ in todo
                                              if end[tp] <= stored}))
            found = await self._probe_marks({tp: m.offset for tp, _, m in todo
                                             if m is not None and start[tp] <= m.offset < end[tp]})
        except Exception as exc:  # noqa: BLE001 - cannot check now: the next lag check retries
            log.warning("ingest: cannot check the logs of %s (%s); keeping the stored offsets",
                        cid, exc)
            for tp, _, _ in todo:
                state = self.partitions.get(tp)
                if state is not None:
                    state.suspect = True
            return out
        log.info("ingest: checked the logs of %s %s in %.3fs", cid,
                 sorted(tp.partition for tp, _, _ in todo), time.monotonic() - t0)
        for tp, stored, mark in todo:
            verdict = judge(stored, mark, start[tp], end[tp], found.get(tp))
            if verdict.kind is None:
                continue
            event = {"collection": cid, "topic": tp.topic, "partition": tp.partition,
                     "kind": verdict.kind, "detail": verdict.detail, "stored_offset": stored,
                     "log_start": start[tp], "log_end": end[tp], "continue_after": verdict.position,
                     "at": time.time()}
            done, after = await self.gate.retry(
                lambda: self.store.rebase_log(cid, tp.partition, stored, verdict.position, event),
                what=f"re-base {cid}[{tp.partition}]")
            out[tp] = after
            self._set_marked(tp, False)
            if done:
                self.resets.append(event)
                metrics.LOG_RESETS.labels(cid, verdict.kind).inc()
                log.error("ingest: %s[%d]: log %s (%s); counting continues after offset %s "
                          "(stored offset was %d)", cid, tp.partition, verdict.kind,
                          verdict.detail, verdict.position, stored)
        return out

    def _set_marked(self, tp: TopicPartition, marked: bool) -> None:
        state = self.partitions.get(tp)
        if state is not None:
            state.marked = marked

    @contextlib.asynccontextmanager
    async def _probe_at(self, at: dict[TopicPartition, int]) -> AsyncIterator[AIOKafkaConsumer]:
        """A short-lived consumer outside the group, positioned at ``at[tp]`` of each partition."""
        probe = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                 enable_auto_commit=False, auto_offset_reset="none",
                                 client_id="ldpstream-log-check", **self.client_kwargs)
        await probe.start()
        try:
            probe.assign(list(at))
            for tp, off in at.items():
                probe.seek(tp, off)
            yield probe
        finally:
            await probe.stop()

    async def _read_ends(self, end: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The end of each log as its records show it: ``end[tp]`` (what the broker reports)
        raised to the offset after the last record read from ``end[tp] - 1`` on. Tansu (the
        embedded broker) answers ListOffsets(latest) with the base offset of its last record
        batch + 1, below the other records of that batch; taken at its word, a partition stored
        at the end of such a batch looked truncated and was re-based and counted twice.
        Needed on Tansu, not on Apache Kafka: Kafka's end offset is the offset after the last
        record (tests/test_broker_differences.py); there the read only confirms it."""
        at = {tp: e - 1 for tp, e in end.items() if e > 0}
        out = dict(end)
        if not at:
            return out
        async with self._probe_at(at) as probe:
            deadline = time.monotonic() + 5.0
            while at and time.monotonic() < deadline:
                try:
                    got = await probe.getmany(*at, timeout_ms=500)
                except OffsetOutOfRangeError:
                    break  # the log moved under us: keep what the broker said
                for tp, recs in got.items():
                    if recs:
                        out[tp] = max(out[tp], recs[-1].offset + 1)
                        at.pop(tp, None)
        return out

    async def _probe_marks(self, at: dict[TopicPartition, int]
                           ) -> dict[TopicPartition, LogMark | None]:
        """The mark of the record now at ``at[tp]`` of each partition (a short-lived consumer
        outside the group; None: no record there)."""
        if not at:
            return {}
        out: dict[TopicPartition, LogMark | None] = {}
        async with self._probe_at(at) as probe:
            deadline = time.monotonic() + 10.0
            while len(out) < len(at) and time.monotonic() < deadline:
                try:
                    got = await probe.getmany(*[tp for tp in at if tp not in out], timeout_ms=500,
                                              max_records=1)
                except OffsetOutOfRangeError as exc:
                    for tp in exc.args[0] if exc.args and isinstance(exc.args[0], dict) else ():
                        out[tp] = None
                    continue
                for tp, recs in got.items():
                    out[tp] = mark_of(recs[0]) if recs and recs[0].offset == at[tp] else None
        if len(out) < len(at):
            raise TimeoutError(f"no record read at {sorted((tp.partition, o) for tp, o in at.items())}")
        return out
