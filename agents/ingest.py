"""The ingest service: Kafka report batches → validated numpy counts → Redis, exactly once.

Why not a faust agent. faust-streaming acknowledges and commits offsets on its own schedule
(``broker_commit_every``/``broker_commit_interval``), independently of what the agent has applied
to Redis, and its own recovery seeks partitions to the *committed* offsets during a rebalance
(faust-streaming issues #216 "resumes from kafka before seeking to committed offsets", #312 "commits
the wrong offset in case of a gap in acks", #54 seek after revoke). A seek of ours inside
``on_partitions_assigned`` would race with faust's; and a faust stream costs ≈ 65 µs per message
(docs/pipeline.md). So the app keeps faust for what it is good at (worker lifecycle, web server, timers)
and consumes reports with an aiokafka consumer owned by this :class:`mode.Service`, which the
faust app starts and stops with itself.

Exactly-once design (the state of record is Redis, never Kafka's committed offsets):

1. On partition assignment (aiokafka's rebalance listener) read ``store.offsets(collection)`` and
   seek every assigned partition to ``stored + 1`` (to the beginning when nothing is stored).
2. Per message, skip offsets ``<= stored`` (dedupe; belt and braces after the seek).
3. Each poll's reports are counted with numpy (``mechanism.count``) into the partition's running
   delta, which covers the offsets ``(base, last]``: ``base`` is the offset the partition was
   sought from or the end of its previous delta. A flush (``ingest.batch_reports`` reports or
   ``ingest.batch_seconds``) sends the rejects to ``ldp.dlq`` (acknowledged first), then applies
   ONE delta per partition, all partitions of a collection in ONE Lua call
   (``CountStore.apply_many``), a compare-and-set per partition: a delta is counted only when the
   stored offset equals its ``base``, and the offset set to ``last``, atomically. A delta whose
   range is already counted is skipped (REPLAYED); any other mismatch is a CONFLICT (someone else
   moved the partition's offset: a new owner, or this worker while frozen): nothing changes, the
   partition's pending delta is dropped and it is re-sought to ``stored + 1`` (returned by the
   script). So the counted ranges of a partition form a gap-free, overlap-free chain whoever
   applies them, even when a worker frozen past the session timeout (not killed: its revocation
   callback never ran) wakes up and sends a stale delta after the new owner read the offset. The
   partitions of one flush are decided each on its own (not all-or-nothing): a conflict on one
   does not hold back the others.
4. On revocation, pending (unapplied) deltas of the revoked partitions are dropped, not applied:
   whoever gets the partition re-reads the offset from Redis and re-consumes them; the callback
   returns only after an in-flight apply touching those partitions has finished (not needed for
   correctness since the compare-and-set, it spares the new owner a conflict).
5. Redis down: the apply is retried with backoff forever (never skipped), every assigned partition
   is paused meanwhile, and the consumer keeps polling (paused, so nothing is fetched) to stay in
   the group; consumption resumes when Redis answers.

Kafka commits are best effort (stored + 1, every few seconds) for lag tooling only.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import time
from collections import defaultdict
from typing import Any, Iterable, Mapping

import numpy as np
from aiokafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError
from mode import Service

from ..producers.codec import (DLQ_TOPIC, DecodeError, ReportBatch, decode_batch, decode_uniform,
                               dlq_record, encode_batch, explain_batch)
from ..estimators.mechanism import Mechanism
from ..producers.device import ConfigWatcher
from . import metrics
from .layout import Layout
from .redis_client import TRANSIENT_ERRORS
from .log_identity import KINDS as LOG_KINDS, LogMark, judge, mark_of
from . import dedupe
from .apply_guard import BAD_TIMESTAMP, split_bad_timestamps
from .control_topic import CHECK_S as CONTROL_CHECK_S, ControlTopics
from .quota import side_name, split_by_quota, window_of
from .store import ApplyStatus, PartitionDelta, SideCounter, SideValues

log = logging.getLogger(__name__)

CONFIG_TOPIC = "ldp.config"
REDIS_ERRORS = TRANSIENT_ERRORS  # retried with consumption paused (incl. a cluster failover)
OFFSET_AUDIT_S = 5.0             # how often idle partitions' stored offsets are checked


@dataclasses.dataclass
class _Pending:
    """What one partition consumed since its last apply."""

    #: counts of the accepted reports so far: (layout of their version, fine bucket or None for
    #: all-time only) -> flat int64 cells (agents/layout.py; cell 0 = reports)
    deltas: dict[tuple[Layout, int | None], np.ndarray] = dataclasses.field(default_factory=dict)
    n: int = 0
    base: int = -1            # the delta covers offsets (base, last_offset]; -1: from the start
    last_offset: int | None = None
    sent_at_max: float | None = None
    messages: int = 0
    epoch: int = 0
    since: float = dataclasses.field(default_factory=time.monotonic)
    rejects: list[tuple[str, str, str, bytes, int]] = dataclasses.field(default_factory=list)
    rejected_reports: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    mark: LogMark | None = None  # first record taken, the log mark if the partition has none
    #: reports counted per quota window and device (agents/quota.py), applied as side counters
    quota: dict[int, dict[int, int]] = dataclasses.field(default_factory=dict)
    #: batch-dedupe state set by the apply (agents/dedupe.py): window -> sender -> "high:bitmap"
    dedupe: dict[int, dict[int, str]] = dataclasses.field(default_factory=dict)
    duplicates: int = 0       # keyed batches not counted: delivered before


class IngestService(Service):
    """Consume every collection's report topic, count, apply to Redis exactly once."""

    def __init__(self, ctx: Any, *, group_id: str = "ldpstream-ingest",
                 session_timeout_ms: int = 10_000, batch_reports: int | None = None,
                 batch_seconds: float | None = None, max_message_bytes: int | None = None,
                 publish_config: bool = True, create_topics: bool = True,
                 poll_ms: int = 100, max_records: int = 5000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ctx = ctx
        ingest = getattr(ctx.config, "ingest", None)
        self.batch_reports = int(batch_reports or getattr(ingest, "batch_reports", 20_000))
        self.batch_seconds = float(batch_seconds or getattr(ingest, "batch_seconds", 0.5))
        self.max_message_bytes = int(max_message_bytes or getattr(ingest, "max_message_bytes",
                                                                  1_048_576))
        self.group_id = group_id
        self.session_timeout_ms = int(session_timeout_ms)
        self.publish_config_on_start = publish_config
        self.create_topics_on_start = create_topics
        self.poll_ms = poll_ms
        self.max_records = max_records
        #: consumption waits for the flush in flight beyond this many pending reports
        self.max_pending_reports = 32 * self.batch_reports
        self._msgs_seen = 0
        self._reports_seen = 0
        self.collections = dict(ctx.config.collections)
        self.topic_of = {cid: c.topic for cid, c in self.collections.items()}
        self.cid_of = {c.topic: cid for cid, c in self.collections.items()}
        self.consumer = None
        self.producer = None
        self.config_watch: ConfigWatcher | None = None
        self.control: ControlTopics | None = None
        self._stored: dict[Any, int | None] = {}   # tp -> last applied offset (None: nothing)
        self._seen: dict[Any, int] = {}            # tp -> highest offset taken (pending or applied)
        self._epoch: dict[Any, int] = defaultdict(int)  # tp -> bumped on every assign/revoke
        self._pending: dict[Any, _Pending] = {}
        self._pending_reports = 0
        self._flush_task: asyncio.Task | None = None
        self._revoked: set[Any] = set()
        self._applying: set[Any] = set()            # tps of the apply attempt in flight
        self._blocked = False
        self._last_commit = 0.0
        self._last_lag = 0.0
        self.applied_batches = 0
        #: seconds spent (cumulative, polls that returned data): waiting in getmany, decoding +
        #: validating + counting (count: the counting part), waiting for the previous flush; and
        #: applying (one Lua call per collection and flush, in the background flush task)
        self.timings = {"poll": 0.0, "decode": 0.0, "flush_wait": 0.0, "count": 0.0, "apply": 0.0}
        self.skipped_batches = 0   # deltas whose range was already counted (REPLAYED)
        self.conflicts = 0         # deltas refused by the compare-and-set (re-sought)
        self.lost_rereads = 0      # idle partitions whose stored offset went back (re-sought)
        self._last_audit = 0.0
        self.applied_reports = 0
        self._marked: set[Any] = set()      # tps whose offsets hash holds a log mark
        #: tp -> quota window -> device -> reports counted (applied and pending); loaded from the
        #: side counters at the stored offset, dropped with the pending deltas
        self._quota_used: dict[Any, dict[int, dict[int, int]]] = {}
        self._quota_window: dict[Any, int] = {}  # tp -> quota window of this poll (worker clock)
        #: tp -> its senders' batch-dedupe state (agents/dedupe.py), and the window of this poll
        self._dedupe: dict[Any, dedupe.DedupeBook] = {}
        self._dedupe_window: dict[Any, int] = {}
        #: an apply failed for a reason other than Redis being unreachable: the partitions are not
        #: released on stop, so the next owner's poison-pill breaker processes them carefully
        self._apply_failed = False
        #: poison-pill breaker (see _take_carefully): tp -> size of the next careful chunk, and
        #: tp -> offset of a message that killed the worker while processed alone
        self._careful: dict[Any, int] = {}
        self._poison_at: dict[Any, int] = {}
        self.poison_pills = 0
        self._suspect: set[Any] = set()     # tps whose log must be checked (out of range, short)
        #: logs found recreated / truncated / with a retention gap (agents/log_identity.py)
        self.log_resets: list[dict[str, Any]] = []
        for cid in self.collections:  # series at 0, so that the LogReset alert sees the first one
            for kind in LOG_KINDS:
                metrics.LOG_RESETS.labels(cid, kind)
        self.assigned_at: float | None = None     # unix time the last assignment was done
        self.last_apply_at: float | None = None   # unix time of the last applied delta

    # --- lifecycle ------------------------------------------------------------------------------
    def known(self) -> dict[str, dict[int, Mechanism]]:
        """collection → {version: mechanism} accepted on the wire."""
        return {cid: self.ctx.versions(cid) for cid in self.collections}

    async def on_start(self) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        boot = self.ctx.kafka_bootstrap
        topics = {c.topic: int(c.partitions) for c in self.collections.values()}
        topics.update({DLQ_TOPIC: 1, CONFIG_TOPIC: 1})
        if self.create_topics_on_start:
            await self._create_topics(topics)
        security = self.ctx.kafka_security.client_kwargs()
        self.producer = AIOKafkaProducer(bootstrap_servers=boot, acks="all", linger_ms=5,
                                         max_request_size=max(1_048_576, 2 * 65_536 + 4096),
                                         client_id="ldpstream-worker", **security)
        await self.producer.start()
        if self.publish_config_on_start:
            from .controller import controller_for
            # the adaptive states stored so far; one that cannot be read now is not republished
            # (its stored version may be newer than the config's) until the controller can
            unread = await controller_for(self.ctx).follow_all()
            await self.publish_config(skip=unread)
            if self.create_topics_on_start:  # recreated and republished after broker log loss
                self.control = await ControlTopics(
                    boot, topics, CONFIG_TOPIC, self._republish, self._create_topics,
                    self.ctx.kafka_security.client_kwargs(), len(self.collections)).start()
        # read ldp.config as devices do: a forged or foreign record shows in a metric and alert
        for reason in FORGERY_REASONS:
            metrics.CONFIG_REFUSED.labels(reason)
        self.config_watch = await ConfigWatcher(
            boot, verify_key=self.ctx.signing_key.verify_key, security=self.ctx.kafka_security,
            on_refused=lambda exc: metrics.CONFIG_REFUSED.labels(exc.reason).inc(),
            collections=self.collections, max_epsilon=None).start()
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=boot, group_id=self.group_id, enable_auto_commit=False,
            # never reset a position silently: an out-of-range position means the log is not the
            # one the stored offset came from (agents/log_identity.py checks it)
            auto_offset_reset="none", session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(100, self.session_timeout_ms // 4),
            rebalance_timeout_ms=max(self.session_timeout_ms, 30_000),
            max_partition_fetch_bytes=max(4 * 1_048_576, 2 * self.max_message_bytes),
            fetch_max_bytes=64 * 1_048_576, client_id="ldpstream-ingest", **security)
        self.consumer.subscribe(sorted(self.cid_of), listener=_Listener(self))
        await self.consumer.start()
        self.ctx.ingest = self

    async def on_stop(self) -> None:
        if self.control is not None:
            await self.control.stop()
            self.control = None
        if self._flush_task is not None:  # let an apply in flight finish (it is atomic anyway)
            try:
                await asyncio.wait_for(asyncio.shield(self._flush_task), 10.0)
            except Exception:  # noqa: BLE001
                self._flush_task.cancel()
        if not self._apply_failed:
            await self._release(self.assignment())
        if self.config_watch is not None:
            await self.config_watch.stop()
            self.config_watch = None
        consumer, self.consumer = self.consumer, None
        producer, self.producer = self.producer, None
        if consumer is not None:
            try:
                await consumer.stop()
            except Exception:  # noqa: BLE001
                log.warning("ingest: consumer stop failed", exc_info=True)
        if producer is not None:
            try:
                await producer.stop()
            except Exception:  # noqa: BLE001
                log.warning("ingest: producer stop failed", exc_info=True)

    async def publish_config(self, skip: Iterable[str] = ()) -> None:
        """Publish every collection's mechanism state (but ``skip``'s), signed with the worker's
        key (producers/signing.py), to the compacted ``ldp.config``."""
        futs = []
        skipped = set(skip)
        for cid in [c for c in self.collections if c not in skipped]:
            value = self.ctx.signing_key.sign_state(self.ctx.mechanism(cid).device_state(), cid)
            futs.append(await self.producer.send(CONFIG_TOPIC, value, key=cid.encode()))
        await asyncio.gather(*futs)

    async def _republish(self) -> None:
        """Publish every state again (the adaptive ones as stored: agents/controller.py)."""
        from .controller import controller_for
        await self.publish_config(skip=await controller_for(self.ctx).follow_all())

    async def _create_topics(self, topics: Mapping[str, int]) -> list[str]:
        from ..services import create_topics
        return await create_topics(self.ctx.kafka_bootstrap, topics, compacted={CONFIG_TOPIC})

    @Service.task
    async def _keep_control_topics(self) -> None:
        """agents/control_topic.py: every CHECK_S, recreate missing topics and republish the
        signed states after log loss or before they expire."""
        while not self.should_stop:
            await asyncio.sleep(CONTROL_CHECK_S)
            if self.control is not None:
                try:
                    await self.control.check()
                except Exception as exc:  # noqa: BLE001 - the broker may be down: next check
                    metrics.CONTROL_CHECK_FAILED.inc()
                    log.warning("ingest: control-topic check failed: %s", exc)

    def assignment(self) -> set:
        return set(self.consumer.assignment()) if self.consumer is not None else set()

    # --- rebalance ------------------------------------------------------------------------------
    async def on_assigned(self, assigned: Iterable[Any]) -> None:
        """Position every newly assigned partition at its Redis offset + 1 (the beginning when
        none is stored). The partitions stay paused (and ignored by :meth:`_take`) until then."""
        consumer = self.consumer
        if consumer is None:
            return
        assigned = set(assigned)
        for tp in assigned:
            self._epoch[tp] += 1
            self._revoked.discard(tp)
            self._stored.pop(tp, None)
            self._seen.pop(tp, None)
            self._pending.pop(tp, None)
            self._quota_used.pop(tp, None)
        self._recount_pending()
        consumer.pause(*assigned)
        by_cid: dict[str, list[Any]] = defaultdict(list)
        for tp in assigned:
            by_cid[self.cid_of[tp.topic]].append(tp)
        stored_of: dict[Any, int | None] = {}
        for cid, tps in by_cid.items():
            positions = await self._verified_positions(cid, tps, consumer)
            if positions is _ABANDONED:
                return
            stored_of.update(positions)
        if self.consumer is not consumer:
            return
        begin = [tp for tp in assigned if stored_of[tp] is None]
        for tp in assigned:
            if stored_of[tp] is not None:
                consumer.seek(tp, stored_of[tp] + 1)
        if begin:
            await consumer.seek_to_beginning(*begin)
        current = self.assignment()
        ready = {tp for tp in assigned if tp in current and tp not in self._revoked}
        for tp in ready:
            died, chunk = await self._redis_retry(
                lambda tp=tp: self.ctx.store.hold(self.cid_of[tp.topic], tp.partition,
                                                  stored_of[tp]),
                what=f"hold {tp.topic}[{tp.partition}]")
            self._careful.pop(tp, None)
            self._poison_at.pop(tp, None)
            if died:  # the previous owner died holding it: find the message, if one killed it
                self._careful[tp] = 1
                first = 0 if stored_of[tp] is None else stored_of[tp] + 1
                if chunk is not None and chunk == (first, 1):
                    self._poison_at[tp] = first
                log.warning("ingest: %s[%d]: the previous owner died holding it; processing from "
                            "offset %s carefully (poison-pill breaker)", tp.topic, tp.partition,
                            first)
        for tp in ready:
            self._stored[tp] = stored_of[tp]
            self._seen[tp] = -1 if stored_of[tp] is None else stored_of[tp]
        if not self._blocked and ready:
            consumer.resume(*ready)
        self.assigned_at = time.time()
        log.info("ingest: assigned %s", sorted((tp.topic, tp.partition, stored_of[tp])
                                               for tp in assigned))

    async def on_revoked(self, revoked: Iterable[Any]) -> None:
        revoked = set(revoked)
        self._revoked |= revoked
        for tp in revoked:
            self._epoch[tp] += 1
            self._pending.pop(tp, None)
            self._stored.pop(tp, None)
            self._seen.pop(tp, None)
            self._quota_used.pop(tp, None)
            self._careful.pop(tp, None)
            self._poison_at.pop(tp, None)
        self._recount_pending()
        # an apply already sent for a revoked partition must finish before another owner reads
        while self._applying & revoked:
            await asyncio.sleep(0.01)
        await self._release(revoked)

    async def _release(self, tps: Iterable[Any]) -> None:
        """Tell the breaker these partitions were let go cleanly (best effort: if Redis does not
        answer, the next owner processes them carefully, which is only slower)."""
        by_cid: dict[str, list[int]] = defaultdict(list)
        for tp in tps:
            by_cid[self.cid_of[tp.topic]].append(tp.partition)
        for cid, parts in by_cid.items():
            try:
                await asyncio.wait_for(self.ctx.store.release(cid, parts), 2.0)
            except Exception as exc:  # noqa: BLE001
                log.warning("ingest: could not release %s %s: %s", cid, parts, exc)

    # --- log identity (agents/log_identity.py) ---------------------------------------------------
    async def _verified_positions(self, cid: str, tps: list, consumer: Any) -> Any:
        """Stored offset of each of ``tps`` after checking that its log is the one it was counted
        from (re-based by compare-and-set, reported, when not). _ABANDONED when the consumer was
        replaced meanwhile."""
        states = await self._redis_retry(
            lambda: self.ctx.store.log_states(cid, [tp.partition for tp in tps]),
            what=f"read offsets of {cid}", abandon=lambda: self.consumer is not consumer)
        if states is _ABANDONED:
            return _ABANDONED
        out: dict[Any, int | None] = {}
        todo = []
        for tp in tps:
            stored, mark = states[tp.partition]
            (self._marked.add if mark is not None else self._marked.discard)(tp)
            out[tp] = stored
            if stored is not None:
                todo.append((tp, stored, None if mark is None else LogMark.parse(mark)))
        if not todo:
            return out
        t0 = time.monotonic()
        try:
            start = await consumer.beginning_offsets([tp for tp, _, _ in todo])
            end = await consumer.end_offsets([tp for tp, _, _ in todo])
            end.update(await self._read_ends({tp: end[tp] for tp, stored, _ in todo
                                              if end[tp] <= stored}))
            found = await self._probe_marks({tp: m.offset for tp, _, m in todo
                                             if m is not None and start[tp] <= m.offset < end[tp]})
        except Exception as exc:  # noqa: BLE001 - cannot check now: the next lag check retries
            log.warning("ingest: cannot check the logs of %s (%s); keeping the stored offsets",
                        cid, exc)
            self._suspect |= {tp for tp, _, _ in todo}
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
            done, after = await self._redis_retry(
                lambda: self.ctx.store.rebase_log(cid, tp.partition, stored, verdict.position,
                                                  event),
                what=f"re-base {cid}[{tp.partition}]")
            out[tp] = after
            self._marked.discard(tp)
            if done:
                self.log_resets.append(event)
                metrics.LOG_RESETS.labels(cid, verdict.kind).inc()
                log.error("ingest: %s[%d]: log %s (%s); counting continues after offset %s "
                          "(stored offset was %d)", cid, tp.partition, verdict.kind,
                          verdict.detail, verdict.position, stored)
        return out

    @contextlib.asynccontextmanager
    async def _probe_at(self, at: dict[Any, int]):
        """A short-lived consumer outside the group, positioned at ``at[tp]`` of each partition."""
        from aiokafka import AIOKafkaConsumer

        probe = AIOKafkaConsumer(bootstrap_servers=self.ctx.kafka_bootstrap, group_id=None,
                                 enable_auto_commit=False, auto_offset_reset="none",
                                 client_id="ldpstream-log-check",
                                 **self.ctx.kafka_security.client_kwargs())
        await probe.start()
        try:
            probe.assign(list(at))
            for tp, off in at.items():
                probe.seek(tp, off)
            yield probe
        finally:
            await probe.stop()

    async def _read_ends(self, end: dict[Any, int]) -> dict[Any, int]:
        """The end of each log as its records show it: ``end[tp]`` (what the broker reports)
        raised to the offset after the last record read from ``end[tp] - 1`` on. Tansu (the
        embedded broker) answers ListOffsets(latest) with the base offset of its last record
        batch + 1, below the other records of that batch; taken at its word, a partition stored
        at the end of such a batch looked truncated and was re-based and counted twice."""
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

    async def _probe_marks(self, at: dict[Any, int]) -> dict[Any, LogMark | None]:
        """The mark of the record now at ``at[tp]`` of each partition (a short-lived consumer
        outside the group; None: no record there)."""
        if not at:
            return {}
        out: dict[Any, LogMark | None] = {}
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

    async def _check_suspects(self) -> None:
        """Check the logs of partitions whose position is out of range or whose log ended below
        the stored offset; re-position them (nothing pending of theirs is kept)."""
        consumer = self.consumer
        tps = {tp for tp in self._suspect if tp in self.assignment() and tp not in self._revoked}
        self._suspect.clear()
        if consumer is None or not tps:
            return
        consumer.pause(*tps)
        by_cid: dict[str, list[Any]] = defaultdict(list)
        for tp in tps:
            by_cid[self.cid_of[tp.topic]].append(tp)
            self._epoch[tp] += 1   # what is pending is from before the check: dropped
            self._pending.pop(tp, None)
            self._seen.pop(tp, None)
            self._quota_used.pop(tp, None)
        self._recount_pending()
        await self.wait_flushed()
        for cid, group in by_cid.items():
            positions = await self._verified_positions(cid, group, consumer)
            if positions is _ABANDONED or self.consumer is not consumer:
                return
            for tp, stored in positions.items():
                if tp not in self.assignment() or tp in self._revoked:
                    continue
                self._stored[tp] = stored
                if stored is None:
                    await consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, stored + 1)
                self._seen[tp] = -1 if stored is None else stored
        if not self._blocked:
            consumer.resume(*(tp for tp in tps if tp in self._seen))

    def _recount_pending(self) -> None:
        self._pending_reports = sum(p.n for p in self._pending.values())

    # --- consuming ------------------------------------------------------------------------------
    @Service.task
    async def _consume(self) -> None:
        while not self.should_stop:
            if self.consumer is None:
                await asyncio.sleep(0.05)
                continue
            t0 = time.perf_counter()
            try:
                data = await self.consumer.getmany(
                    timeout_ms=self.poll_ms if not self._pending else min(self.poll_ms, 20),
                    max_records=self._poll_records())
            except asyncio.CancelledError:
                raise
            except NoOffsetForPartitionError:
                # a partition just assigned, not positioned yet: on_assigned seeks it to the
                # offset stored in Redis (the consumer never picks a position by itself)
                await asyncio.sleep(0.01)
                continue
            except OffsetOutOfRangeError as exc:  # the log is not where the offsets say
                self._suspect |= set(exc.args[0]) if exc.args and isinstance(exc.args[0], dict) \
                    else self.assignment()
                await self._check_suspects()
                continue
            except Exception:  # noqa: BLE001 - keep the worker alive; aiokafka reconnects
                log.warning("ingest: poll failed", exc_info=True)
                await asyncio.sleep(0.5)
                continue
            t1 = time.perf_counter()
            for tp, msgs in data.items():
                before = self._pending_reports
                await self._load_state(tp, msgs)
                if tp in self._careful:
                    await self._take_carefully(tp, msgs)
                else:
                    self._take(tp, msgs)
                self._msgs_seen += len(msgs)
                self._reports_seen += self._pending_reports - before
            t2 = time.perf_counter()
            now = time.monotonic()
            due = any(p.n >= self.batch_reports or now - p.since >= self.batch_seconds
                      for p in self._pending.values())
            in_flight = self._flush_task is not None and not self._flush_task.done()
            if due and (not in_flight or self._pending_reports >= self.max_pending_reports):
                # every partition with something pending goes: their applies run concurrently
                # (one Redis fsync serves them all); while a flush is in flight the deltas grow
                # instead, up to max_pending_reports, so slow applies mean bigger deltas
                await self._start_flush(list(self._pending))
            t3 = time.perf_counter()
            if data:
                self.timings["poll"] += t1 - t0
                self.timings["decode"] += t2 - t1
                self.timings["flush_wait"] += t3 - t2
            if now - self._last_lag >= 1.0:
                self._last_lag = now
                self._update_lag()
                if self._suspect:
                    await self._check_suspects()
            if now - self._last_audit >= OFFSET_AUDIT_S:
                self._last_audit = now
                await self._audit_offsets()
            if now - self._last_commit >= 5.0:
                self._last_commit = now
                await self._commit()

    def _poll_records(self) -> int:
        """Messages to take per poll: about :data:`POLL_DELTAS` deltas' worth (``batch_reports``
        each) at the mean reports per message seen so far, so the per-poll arrays stay
        cache-sized whatever the batch size while the fixed cost of a poll is paid rarely."""
        if self._msgs_seen < 100:
            return min(self.max_records, 200)
        per_msg = max(1.0, self._reports_seen / self._msgs_seen)
        return int(max(16, min(self.max_records, POLL_DELTAS * self.batch_reports / per_msg)))

    async def _take_carefully(self, tp: Any, msgs: list) -> None:
        """The poison-pill breaker. When a worker takes a partition whose previous owner died
        holding it (never released it), the messages after the stored offset are processed in
        chunks of 1, 2, 4, ... messages, each chunk recorded in Redis before it is processed and
        applied right after. If the worker dies again, the next owner reads which chunk it was:
        a message that killed the worker while processed alone (the second death at it) goes to
        ``ldp.dlq`` as ``poison_pill``, unprocessed; a bigger chunk starts over at size 1. So a
        message that crashes the worker twice never causes a crash loop. Chunks reaching
        ``max_records`` messages end careful processing."""
        cid = self.cid_of[tp.topic]
        pos = 0
        while pos < len(msgs):
            seen = self._seen.get(tp)
            if seen is None or tp in self._revoked or tp not in self._careful:
                return
            while pos < len(msgs) and msgs[pos].offset <= seen:
                pos += 1
            if pos >= len(msgs):
                return
            size = self._careful[tp]
            chunk = msgs[pos:pos + size]
            if self._poison_at.get(tp) == chunk[0].offset:
                del self._poison_at[tp]
                self._poison(tp, cid, chunk[0])
                chunk = chunk[:1]
            else:
                await self._redis_retry(
                    lambda: self.ctx.store.note_chunk(cid, tp.partition, chunk[0].offset,
                                                      len(chunk)),
                    what=f"note a chunk of {cid}[{tp.partition}]")
                await self._load_state(tp, chunk)  # a flush may have re-sought it meanwhile
                self._take(tp, chunk)
            pos += len(chunk)
            await self.flush()  # applied before the next chunk is tried
            if tp not in self._careful:
                return
            self._careful[tp] = size * 2
            if self._careful[tp] > self.max_records:
                del self._careful[tp]
                log.warning("ingest: %s[%d] back to normal processing after offset %d", cid,
                            tp.partition, chunk[-1].offset)
                if pos < len(msgs):
                    await self._load_state(tp, msgs[pos:])
                    self._take(tp, msgs[pos:])
                return

    def _poison(self, tp: Any, cid: str, m: Any) -> None:
        """File ``m`` in the DLQ unprocessed; its offset is covered by the partition's delta."""
        pend = self._pending.get(tp)
        if pend is None:
            pend = self._pending[tp] = _Pending(epoch=self._epoch[tp], base=self._seen[tp])
            if tp not in self._marked:
                pend.mark = mark_of(m)
        self._seen[tp] = m.offset
        pend.messages += 1
        pend.last_offset = max(m.offset, pend.last_offset or -1)
        self.poison_pills += 1
        log.error("ingest: %s[%d] offset %d: the worker died twice processing this message; "
                  "dead-lettered unprocessed as poison_pill", cid, tp.partition, m.offset)
        self._reject(pend, cid, "poison_pill", "the worker died while processing this message "
                     "alone, after an earlier death holding the partition", m.value or b"",
                     m.offset, 1)

    def _take(self, tp: Any, msgs: list) -> None:
        """Decode and validate the messages of one partition into its pending buffer."""
        seen = self._seen.get(tp)
        if tp in self._revoked or seen is None:
            return  # not (or no longer) positioned at its Redis offset: the records come again
        if msgs[0].offset <= seen:
            msgs = [m for m in msgs if m.offset > seen]
            if not msgs:
                return
        if _ABORT_ON is not None and any((m.value or b"").startswith(_ABORT_ON) for m in msgs):
            os.abort()  # fault injection for the breaker's test (LDP_FAULT_ABORT_ON_HEX)
        self._seen[tp] = msgs[-1].offset
        cid = self.cid_of[tp.topic]
        pend = self._pending.get(tp)
        if pend is None:  # continues from the previous delta's end (or the sought offset)
            pend = self._pending[tp] = _Pending(epoch=self._epoch[tp], base=seen)
            if tp not in self._marked:
                pend.mark = mark_of(msgs[0])
        known = self.known()
        pend.messages += len(msgs)
        pend.last_offset = max(msgs[-1].offset, pend.last_offset or -1)
        metrics.MESSAGES_CONSUMED.labels(cid).inc(len(msgs))
        msgs, bad = split_bad_timestamps(msgs)
        for m in bad:  # agents/apply_guard.py: never reaches the apply script
            self._reject(pend, cid, BAD_TIMESTAMP, f"record timestamp {m.timestamp} ms is out of "
                         "range", m.value or b"", m.offset, 1)
        if not msgs:
            return
        quota = self.collections[cid].device_quota
        if len(msgs) >= 16 and quota is None:  # the fast path drops device ids
            fast = decode_uniform([m.value for m in msgs], self.max_message_bytes)
            if fast is not None and fast.collection == cid and explain_batch(fast, known) is None:
                per = fast.n // len(msgs)
                self._accept(pend, cid, fast.version, fast.reports,
                             self._buckets(cid, msgs, np.full(len(msgs), per)),
                             clamp_sent_at(fast.sent_at, max(m.timestamp for m in msgs) / 1000.0,
                                           time.time()))
                return
        good: list[tuple[Any, ReportBatch]] = []
        for m in msgs:
            try:
                good.append((m, decode_batch(m.value if m.value is not None else b"",
                                             max_bytes=self.max_message_bytes)))
            except DecodeError as exc:
                # the topic names the collection even when the bytes cannot: count and file
                # the reject under it (the DLQ record's topic/offset locate the message)
                self._reject(pend, cid, exc.reason, exc.detail, m.value or b"", m.offset, 1)
        # validate: one vectorized check for all batches sharing (collection, version, width);
        # only when that fails, find the bad batches one by one
        groups: dict[tuple, list[tuple[Any, ReportBatch]]] = defaultdict(list)
        for m, b in good:
            groups[(b.collection, b.version, b.width)].append((m, b))
        valid: list[tuple[Any, ReportBatch]] = []
        for (_, version, _), items in groups.items():
            if len(items) > 1:
                joined = dataclasses.replace(items[0][1], reports=np.concatenate(
                    [b.reports for _, b in items]), device_ids=None)
                ok = explain_batch(joined, known) is None if joined.collection == cid else False
            else:
                ok = False
            accepted: list[tuple[Any, ReportBatch]] = []
            for m, b in items:
                res = None if ok else (
                    explain_batch(b, known) if b.collection == cid else
                    ("unknown_collection", f"batch of collection {b.collection!r} on topic {tp.topic}"))
                if res is None:
                    if b.key is None or self._first_delivery(tp, pend, cid, m, b):
                        accepted.append((m, b))
                else:
                    self._reject(pend, cid, res[0], res[1], m.value, m.offset, b.n)
            if quota is not None:
                valid += accepted
            elif accepted:
                self._accept_batches(pend, cid, version, accepted)
        if quota is not None and valid:
            # the quota decides in offset order, in the worker clock's window; what is applied is
            # exact after a crash (the side counters move with the offset: agents/quota.py)
            by_version: dict[int, list[tuple[Any, ReportBatch]]] = defaultdict(list)
            for m, b in sorted(valid, key=lambda mb: mb[0].offset):
                kept = self._within_quota(tp, pend, cid, m, b)
                if kept is not None:
                    by_version[kept.version].append((m, kept))
            for version, accepted in by_version.items():
                self._accept_batches(pend, cid, version, accepted)

    def _accept_batches(self, pend: _Pending, cid: str, version: int,
                        accepted: list[tuple[Any, ReportBatch]]) -> None:
        reports = np.concatenate([b.reports for _, b in accepted]) \
            if len(accepted) > 1 else accepted[0][1].reports
        buckets = self._buckets(cid, [m for m, _ in accepted], np.array([b.n for _, b in accepted]))
        now = time.time()
        self._accept(pend, cid, version, reports, buckets,
                     max(clamp_sent_at(b.sent_at, m.timestamp / 1000.0, now) for m, b in accepted))

    def _reject(self, pend: _Pending, cid: str, reason: str, detail: str, payload: bytes,
                offset: int, reports: int) -> None:
        pend.rejects.append((reason, detail, cid, payload, offset))
        pend.rejected_reports[(cid, reason)] = pend.rejected_reports.get((cid, reason), 0) + reports

    # --- per-device quotas (agents/quota.py) ---------------------------------------------------
    async def _load_quota(self, tp: Any, msgs: list) -> None:
        """Read the side counters of the quota windows of ``msgs`` not in memory yet."""
        cid = self.cid_of[tp.topic]
        window_s = self.collections[cid].device_quota.window_s
        have = self._quota_used.setdefault(tp, {})
        # the window of the worker's clock, never of the producer's record timestamp
        self._quota_window[tp] = window_of(time.time() * 1000.0, window_s)
        for w in {self._quota_window[tp]} - set(have):
            raw = await self._redis_retry(
                lambda w=w: self.ctx.store.read_side(cid, tp.partition, side_name(w)),
                what=f"read the quota of {cid}[{tp.partition}]")
            if tp not in self._quota_used:  # dropped meanwhile (rebalance): reloaded next time
                return
            have[w] = {int(k): v for k, v in raw.items()}

    def _within_quota(self, tp: Any, pend: _Pending, cid: str, m: Any,
                      b: ReportBatch) -> ReportBatch | None:
        """The reports of ``b`` within the device quota (the excess to the DLQ); None: none."""
        quota = self.collections[cid].device_quota
        if b.device_ids is None:
            self._reject(pend, cid, "missing_device_ids", f"collection {cid!r} has a device quota: "
                         f"every report needs a device id", m.value, m.offset, b.n)
            return None
        w = self._quota_window[tp]
        used = self._quota_used[tp][w]
        mask, taken = split_by_quota(b.device_ids, used, quota.reports)
        counted = pend.quota.setdefault(w, {})
        for d, k in taken.items():
            used[d] = used.get(d, 0) + k
            counted[d] = counted.get(d, 0) + k
        if mask.all():
            return b
        over = ~mask
        excess = encode_batch(b.collection, b.version, b.reports[over],
                              device_ids=b.device_ids[over], sent_at=b.sent_at)
        devices = np.unique(b.device_ids[over])
        self._reject(pend, cid, "over_quota",
                     f"{int(over.sum())} report(s) of {devices.size} device(s) beyond "
                     f"{quota.reports} per device in quota window {w} ({quota.window_s:g} s); "
                     f"first device {int(devices[0])}", excess, m.offset, int(over.sum()))
        if not mask.any():
            return None
        return dataclasses.replace(b, reports=b.reports[mask], device_ids=b.device_ids[mask])

    def _side(self, cid: str, pend: _Pending) -> dict[str, SideCounter | SideValues]:
        """The quota side counters and batch-dedupe state of a delta (each expiring two windows
        after its own)."""
        out: dict[str, SideCounter | SideValues] = {
            dedupe.side_name(w): SideValues({str(d): v for d, v in senders.items()},
                                            expire_at=dedupe.expire_at(w))
            for w, senders in pend.dedupe.items() if senders}
        quota = self.collections[cid].device_quota
        if quota is not None:
            out.update({side_name(w): SideCounter({str(d): k for d, k in devices.items()},
                                                  expire_at=(w + 2) * quota.window_s)
                        for w, devices in pend.quota.items() if devices})
        return out

    async def _load_state(self, tp: Any, msgs: list) -> None:
        """What :meth:`_take` needs from Redis for ``msgs``: quota counters and dedupe state."""
        if self.collections[self.cid_of[tp.topic]].device_quota is not None:
            await self._load_quota(tp, msgs)
        await self._load_dedupe(tp)

    # --- idempotent batches (agents/dedupe.py) -------------------------------------------------
    async def _load_dedupe(self, tp: Any) -> None:
        """Read the senders' dedupe state of the current and previous window of the worker's
        clock, unless in memory for the partition's current epoch."""
        cid = self.cid_of[tp.topic]
        epoch = self._epoch[tp]
        book = self._dedupe.get(tp)
        if book is None or book.epoch != epoch:
            book = self._dedupe[tp] = dedupe.DedupeBook(epoch)
        self._dedupe_window[tp] = w = dedupe.window_of(time.time())
        for missing in book.missing(w):
            raw = await self._redis_retry(
                lambda m=missing: self.ctx.store.read_side_raw(cid, tp.partition,
                                                               dedupe.side_name(m)),
                what=f"read the batch-dedupe state of {cid}[{tp.partition}]")
            if self._epoch[tp] != epoch:  # dropped meanwhile: read again for the new epoch
                return await self._load_dedupe(tp)
            book.load(missing, raw)

    def _first_delivery(self, tp: Any, pend: _Pending, cid: str, m: Any,
                        b: ReportBatch) -> bool:
        """Whether keyed batch ``b`` is counted: a duplicate is skipped (and counted as one), a
        sequence too far below its sender's highest goes to the DLQ."""
        book = self._dedupe.get(tp)
        if book is None or book.epoch != pend.epoch or b.key is None:
            raise RuntimeError(f"batch-dedupe state of {tp} not loaded for this epoch")
        sender, seq = b.key
        verdict = book.decide(self._dedupe_window[tp], sender, seq, pend.dedupe)
        if verdict == dedupe.DUPLICATE:
            pend.duplicates += 1
        elif verdict == dedupe.STALE:
            self._reject(pend, cid, "stale_sequence", f"sequence {seq} of sender {sender} is more "
                         f"than {dedupe.BITS} below the highest seen; it may have been counted",
                         m.value, m.offset, b.n)
        return verdict == dedupe.NEW

    def _buckets(self, cid: str, msgs: list, sizes: np.ndarray) -> np.ndarray:
        """Fine bucket of every report (message i holds ``sizes[i]`` of them) from its message's
        Kafka record timestamp (agents/windows.py); -1: all-time only (no finite window, or late).
        One element when every report falls in the same bucket. Reports whose timestamp was
        moved are counted per reason."""
        now = time.time()
        ts = np.fromiter((m.timestamp if m.timestamp is not None else -1 for m in msgs),
                         dtype=np.float64, count=len(msgs)) / 1000.0
        ts[ts < 0] = now
        buckets, future, late = self.collections[cid].policy.place_many(ts, now)
        for why, mask in (("future", future), ("late", late)):
            if mask.any():
                metrics.REPORTS_CLAMPED.labels(cid, why).inc(int(sizes[mask].sum()))
        if len(buckets) and (buckets == buckets[0]).all():
            return buckets[:1]   # the usual poll: one bucket, no per-report array
        return np.repeat(buckets, sizes)

    def _accept(self, pend: _Pending, cid: str, version: int, reports: np.ndarray,
                buckets: np.ndarray, sent_at: float) -> None:
        """Count validated reports of one mechanism ``version`` into the partition's running
        delta, per fine bucket (``buckets`` from :meth:`_buckets`: one bucket for all of them, or
        ``buckets[i]`` of report i; -1 = all-time only). Counted per poll, so the arrays stay
        cache-sized and memory is the tensors', not the reports'."""
        t0 = time.perf_counter()
        layout = self.ctx.layout(cid, version)
        mech = self.ctx.versions(cid)[version]
        specs = list(layout.specs)
        if len(buckets) <= 1:   # _buckets collapsed a single bucket to one element
            parts = [(int(buckets[0]) if len(buckets) else -1, reports)]
        else:
            parts = [(int(b), reports[buckets == b]) for b in np.unique(buckets)]
        for b, rep in parts:
            flat = layout.pack(count_reports(mech, rep, specs), rep.shape[0])
            key = (layout, None if b < 0 else b)
            cur = pend.deltas.get(key)
            if cur is None:
                pend.deltas[key] = flat
            else:
                cur += flat
        n = int(reports.shape[0])
        pend.n += n
        self._pending_reports += n
        if pend.sent_at_max is None or sent_at > pend.sent_at_max:
            pend.sent_at_max = sent_at
        self.timings["count"] += time.perf_counter() - t0

    async def _start_flush(self, tps: list) -> None:
        """Hand the pending deltas of ``tps`` to a background flush, so the next messages are
        fetched and decoded while Redis applies these. At most one flush is in flight: a new one
        first waits for the previous (which also bounds memory, e.g. while Redis is down)."""
        await self.wait_flushed()
        batch = {tp: self._pending.pop(tp) for tp in tps if tp in self._pending}
        self._recount_pending()
        if batch:
            self._flush_task = asyncio.create_task(self._flush(batch), name="ldp-ingest-flush")

    async def wait_flushed(self) -> None:
        task, self._flush_task = self._flush_task, None
        if task is not None:
            await task

    async def flush(self) -> None:
        """Apply every partition's pending delta now and wait for it."""
        await self._start_flush(list(self._pending))
        await self.wait_flushed()

    async def _flush(self, batch: dict) -> None:
        """Apply the deltas of several partitions: DLQ records first, then ONE Lua call per
        collection (all its partitions; collections concurrently). Only stale deltas are dropped;
        an unexpected error crashes the worker (it restarts from the offsets in Redis) rather than
        leave consumed-but-uncounted records behind."""
        live = [(tp, p) for tp, p in batch.items()
                if not self._stale(tp, p) and p.last_offset is not None]
        by_cid: dict[str, list[tuple[Any, _Pending]]] = defaultdict(list)
        for tp, p in live:
            by_cid[self.cid_of[tp.topic]].append((tp, p))
        try:
            await asyncio.gather(*(self._send_dlq(tp, self.cid_of[tp.topic], p)
                                   for tp, p in live if p.rejects))
            await asyncio.gather(*(self._apply_collection(cid, parts)
                                   for cid, parts in by_cid.items()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            log.exception("ingest: flush failed; stopping the worker (it resumes from Redis)")
            self._apply_failed = True
            await self.crash(exc)

    def _stale(self, tp: Any, pend: _Pending) -> bool:
        return tp in self._revoked or pend.epoch != self._epoch[tp]

    async def _apply_collection(self, cid: str, parts: list[tuple[Any, _Pending]]) -> None:
        """One compare-and-set script call for the deltas of ``parts`` (partitions of ``cid``),
        retried while Redis is unreachable (stale partitions are left out of every retry)."""
        t0 = time.perf_counter()

        async def attempt() -> Any:
            live = [(tp, p) for tp, p in parts if not self._stale(tp, p)]
            if not live:
                return _ABANDONED
            tps = {tp for tp, _ in live}
            self._applying |= tps
            try:
                res = await self.ctx.store.apply_many(cid, [
                    PartitionDelta(tp.partition, p.last_offset, p.deltas, p.n,
                                   expected=p.base, sent_at_max=p.sent_at_max,
                                   side=self._side(cid, p))
                    for tp, p in live], self.collections[cid].policy)
            finally:
                self._applying -= tps
            return list(zip(live, res))

        results = await self._redis_retry(
            attempt, what=f"apply {cid}{sorted(tp.partition for tp, _ in parts)}",
            abandon=lambda: all(self._stale(tp, p) for tp, p in parts))
        if results is _ABANDONED:
            log.info("ingest: %s %s revoked while Redis was down; deltas left to the new owner",
                     cid, sorted(tp.partition for tp, _ in parts))
            return
        elapsed = time.perf_counter() - t0
        metrics.BATCH_APPLY_SECONDS.labels(cid).observe(elapsed)
        self.timings["apply"] += elapsed
        for (tp, pend), res in results:
            if res.status is ApplyStatus.APPLIED:
                self.applied_batches += 1
                self.applied_reports += pend.n
                self.last_apply_at = time.time()
                if pend.n:
                    metrics.REPORTS_INGESTED.labels(cid).inc(pend.n)
                if pend.duplicates:
                    metrics.DUPLICATE_BATCHES.labels(cid).inc(pend.duplicates)
                for (coll, reason), k in pend.rejected_reports.items():
                    metrics.REPORTS_REJECTED.labels(coll, reason).inc(k)
                if not self._stale(tp, pend):
                    self._stored[tp] = pend.last_offset
                if pend.mark is not None and tp not in self._marked:
                    await self._redis_retry(
                        lambda: self.ctx.store.set_log_mark(cid, tp.partition, str(pend.mark)),
                        what=f"mark the log of {cid}[{tp.partition}]")
                    self._marked.add(tp)
            elif res.status is ApplyStatus.REPLAYED and res.stored == pend.last_offset:
                # counted up to exactly here already (e.g. our own apply whose reply was lost to a
                # timeout): the position is right, the next delta continues from it
                self.skipped_batches += 1
                log.info("ingest: %s[%d] offsets (%d, %d] already counted; skipped", cid,
                         tp.partition, pend.base, pend.last_offset)
                if not self._stale(tp, pend):
                    self._stored[tp] = res.stored
            else:
                if res.status is ApplyStatus.REPLAYED:
                    self.skipped_batches += 1
                else:
                    self.conflicts += 1
                log.warning("ingest: %s[%d] delta (%d, %d] %s: stored offset is %s; dropping "
                            "what is pending and re-reading from there", cid, tp.partition,
                            pend.base, pend.last_offset, res.status.value, res.stored)
                await self._resync(tp, pend, res.stored)

    async def _audit_offsets(self) -> None:
        """Re-read an idle partition whose stored offset went BACK behind the one this worker
        applied: acknowledged writes were lost (a Redis Cluster failover: replication is
        asynchronous, count deltas and offset are lost together). A partition with traffic finds
        out at its next apply (CONFLICT); one with none would stay short until its next report.
        Only when no flush is in flight, for partitions with nothing pending; a read error is
        left to the next apply (which retries and pauses consumption)."""
        in_flight = self._flush_task is not None and not self._flush_task.done()
        if self.consumer is None or self._blocked or in_flight:
            return
        ours: dict[str, dict[Any, int]] = defaultdict(dict)
        for tp in self.assignment():
            if self._stored.get(tp) is not None and tp not in self._pending \
                    and tp not in self._revoked:
                ours[self.cid_of[tp.topic]][tp] = self._stored[tp]
        for cid, mine in ours.items():
            try:
                stored = await self.ctx.store.offsets(cid, [tp.partition for tp in mine])
            except REDIS_ERRORS:
                return
            for tp, applied in mine.items():
                now_stored = stored.get(tp.partition)
                if (now_stored is not None and now_stored >= applied) or tp in self._pending \
                        or self._stored.get(tp) != applied:
                    continue  # as applied (or ahead: another owner), or moved on meanwhile
                self.lost_rereads += 1
                log.warning("ingest: %s[%d] stored offset %s is behind %d, applied by this "
                            "worker: writes were lost (Redis failover?); re-reading from there",
                            cid, tp.partition, now_stored, applied)
                await self._resync(tp, _Pending(epoch=self._epoch[tp]), now_stored)

    async def _resync(self, tp: Any, pend: _Pending, stored: int | None) -> None:
        """Drop what is pending for ``tp`` and re-seek it to ``stored + 1`` (the beginning when
        nothing is stored), unless it was revoked or re-assigned meanwhile."""
        if self._stale(tp, pend) or tp not in self.assignment():
            return
        self._epoch[tp] += 1  # what is pending for tp now is behind the new position
        epoch = self._epoch[tp]
        self._pending.pop(tp, None)
        self._quota_used.pop(tp, None)
        self._recount_pending()
        self._stored[tp] = stored
        if stored is not None:
            self._seen[tp] = stored
            self.consumer.seek(tp, stored + 1)
        else:
            self._seen.pop(tp, None)  # ignore records until positioned
            await self.consumer.seek_to_beginning(tp)
            if self._epoch[tp] == epoch and tp not in self._revoked:
                self._seen[tp] = -1

    async def _send_dlq(self, tp: Any, cid: str, pend: _Pending) -> None:
        if self.control is not None:  # recreated (e.g. after broker log loss) before producing
            await self.control.ensure([DLQ_TOPIC])
        now = time.time()
        futs = []
        for reason, detail, coll, payload, offset in pend.rejects:
            rec = dlq_record(reason, detail, collection=coll or None, topic=tp.topic,
                             partition=tp.partition, offset=offset, payload=payload,
                             received_at=now)
            futs.append(await self.producer.send(DLQ_TOPIC, rec, key=cid.encode()))
        # the offset that covers these messages is recorded only after the DLQ has them
        await asyncio.gather(*futs)

    async def _redis_retry(self, fn, *, what: str, abandon=None):
        """``await fn()`` until it succeeds; while Redis is unreachable pause consumption and
        retry with backoff (0.1 s → 2 s). ``abandon()`` true → give up (returns _ABANDONED)."""
        delay = 0.1
        blocked_at = None
        while True:
            if abandon is not None and abandon():
                if blocked_at is not None:  # else the partitions stayed paused for good
                    log.warning("ingest: gave up %s after %.1fs (revoked)", what,
                                time.monotonic() - blocked_at)
                    self._set_blocked(False)
                return _ABANDONED
            try:
                result = await fn()
            except REDIS_ERRORS as exc:
                if blocked_at is None:
                    blocked_at = time.monotonic()
                    log.warning("ingest: Redis unavailable (%s: %s) during %s; pausing "
                                "consumption and retrying", exc.__class__.__name__, exc, what)
                    self._set_blocked(True)
                await self._idle_poll(delay)
                delay = min(delay * 2, 2.0)
                continue
            if blocked_at is not None:
                log.warning("ingest: Redis back after %.1fs; resuming (%s)",
                            time.monotonic() - blocked_at, what)
                self._set_blocked(False)
            return result

    def _set_blocked(self, blocked: bool) -> None:
        self._blocked = blocked
        if self.consumer is None:
            return
        tps = self.assignment()
        if blocked:
            self.consumer.pause(*tps)
        else:  # partitions still being positioned by on_assigned stay paused
            self.consumer.resume(*(tp for tp in tps if tp in self._seen))

    async def _idle_poll(self, seconds: float) -> None:
        """Wait while blocked. Partitions are paused, so nothing is fetched; partitions newly
        assigned meanwhile are paused as soon as they appear."""
        await asyncio.sleep(seconds)
        if self.consumer is not None and self._blocked:
            new = self.assignment() - set(self.consumer.paused())
            if new:
                self.consumer.pause(*new)

    def _update_lag(self) -> None:
        if self.consumer is None:
            return
        lag: dict[str, int] = defaultdict(int)
        for tp in self.assignment():
            hw = self.consumer.highwater(tp)
            if hw is None:
                continue
            stored = self._stored.get(tp)
            behind = hw - (0 if stored is None else stored + 1)
            if behind < 0 and tp in self._seen:
                self._suspect.add(tp)  # the log ends below what was counted: never hidden
            lag[self.cid_of[tp.topic]] += behind
        for cid in self.collections:
            metrics.CONSUMER_LAG.labels(cid).set(lag.get(cid, 0))

    async def _commit(self) -> None:
        """Best-effort Kafka commit of the applied offsets (tooling only; Redis is the record)."""
        if self.consumer is None:
            return
        assigned = self.assignment()
        offsets = {tp: off + 1 for tp, off in self._stored.items()
                   if off is not None and tp in assigned and tp not in self._revoked}
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except Exception as exc:  # noqa: BLE001 - rebalancing etc.; Redis is the record anyway
            log.debug("ingest: Kafka commit skipped: %s", exc)

    # --- introspection for tests / health -------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {"assigned": sorted(f"{tp.topic}[{tp.partition}]" for tp in self.assignment()),
                "blocked": self._blocked, "pending_reports": self._pending_reports,
                "applied_batches": self.applied_batches, "skipped_batches": self.skipped_batches,
                "conflicts": self.conflicts, "lost_rereads": self.lost_rereads,
                "applied_reports": self.applied_reports, "assigned_at": self.assigned_at,
                "last_apply_at": self.last_apply_at, "log_resets": self.log_resets[-20:],
                "poison_pills": self.poison_pills,
                "config_republished": [] if self.control is None else self.control.republished,
                "careful": sorted(f"{tp.topic}[{tp.partition}]" for tp in self._careful),
                "timings_s": {k: round(v, 4) for k, v in self.timings.items()}}


_ABANDONED = object()

#: refusal reasons of an ldp.config record that only a forger produces (producers/signing.py)
FORGERY_REASONS = ("unsigned", "wrong_key", "bad_signature", "wrong_collection")

#: fault injection, for tests of the poison-pill breaker only: a worker whose environment sets
#: LDP_FAULT_ABORT_ON_HEX aborts (SIGABRT) when it processes a message starting with those bytes
_ABORT_ON = bytes.fromhex(os.environ["LDP_FAULT_ABORT_ON_HEX"]) \
    if os.environ.get("LDP_FAULT_ABORT_ON_HEX") else None

#: reports taken per poll, in deltas (``batch_reports``): 4 measured ~14 % more ingest than 1
#: (``ldpstream bench pipeline``, 4M reports of 500 per message: 4.85M vs 4.25M reports/s)
POLL_DELTAS = 4

#: how far a batch's ``sent_at`` may be from its Kafka record timestamp (and ahead of now)
SENT_AT_TOLERANCE_S = 300.0


def clamp_sent_at(sent_at: float, record_ts: float, now: float,
                  tolerance: float = SENT_AT_TOLERANCE_S) -> float:
    """A device's ``sent_at`` within ``[record_ts - tolerance, min(record_ts, now) + tolerance]``:
    one report claiming ``sent_at = 1e300`` must not pin the freshness gauge forever."""
    return min(max(sent_at, record_ts - tolerance), min(record_ts, now) + tolerance)


def count_reports(mech: Any, reports: np.ndarray, specs: list) -> dict[str, np.ndarray]:
    """``mech.count(reports, specs)``; for mechanisms that keep the default count (histograms of
    ``spec.columns``) the same tensors computed faster on validated reports: each used column
    converted once, flat cell indices by multiply-add, one ``bincount`` per tensor (no bounds
    re-check: the batch passed ``check_batch`` against ``report_bounds()``)."""
    if type(mech).count is not Mechanism.count or any(not s.columns for s in specs):
        return mech.count(reports, specs)
    out = {}
    for s in specs:
        size = s.size
        # the cell index in the narrowest dtype that holds it, built in place
        dt = np.uint16 if size <= 1 << 16 else np.uint32 if size <= 1 << 32 else np.intp
        flat = reports[:, s.columns[0]].astype(dt)
        for c, width in zip(s.columns[1:], s.shape[1:]):
            flat *= dt(width)
            np.add(flat, reports[:, c], out=flat, casting="unsafe")  # validated: in bounds
        out[s.key] = np.bincount(flat, minlength=size).astype(np.int64, copy=False).reshape(s.shape)
    return out

def _listener_base():
    from aiokafka import ConsumerRebalanceListener
    return ConsumerRebalanceListener


class _Listener(_listener_base()):
    """aiokafka rebalance listener delegating to the service (both callbacks are awaited by
    aiokafka's coordinator before it proceeds)."""

    def __init__(self, service: IngestService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked) -> None:
        await self.service.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned) -> None:
        await self.service.on_assigned(assigned)
