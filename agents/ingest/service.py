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
   one delta per partition, the partitions of a collection together (``CountStore.apply_many``: one
   script call per partition, all sent at once), a compare-and-set per partition: a delta is
   counted only when the stored offset equals its ``base``, and the offset set to ``last``,
   atomically. A delta whose range is already counted is skipped (REPLAYED); any other mismatch is
   a CONFLICT (someone else moved the partition's offset: a new owner, or this worker while
   frozen): nothing changes, the partition's pending delta is dropped and it is re-sought to
   ``stored + 1`` (returned by the script). So the counted ranges of a partition form a gap-free,
   overlap-free chain whoever applies them, even when a worker frozen past the session timeout (not
   killed: its revocation callback never ran) wakes up and sends a stale delta after the new owner
   read the offset. The partitions of one flush are decided each on its own (not all-or-nothing): a
   conflict on one does not hold back the others.
4. On revocation, pending (unapplied) deltas of the revoked partitions are dropped, not applied:
   whoever gets the partition re-reads the offset from Redis and re-consumes them; the callback
   returns only after an in-flight apply touching those partitions has finished (not needed for
   correctness since the compare-and-set, it spares the new owner a conflict).
5. Redis down: the apply is retried with backoff forever (never skipped), every assigned partition
   is paused meanwhile, and the consumer keeps polling (paused, so nothing is fetched) to stay in
   the group; consumption resumes when Redis answers.

Kafka commits are best effort (stored + 1, every few seconds) for lag tooling only.

The worker is made of parts with one job each, wired in agents/app.py (docs/pipeline.md "The
worker's parts"): this consumer loop; per-partition state (agents/ingest/partition.py); rebalance and
seek (agents/ingest/rebalance.py); the log-identity check (agents/ingest/log_check.py); the poison-pill breaker
(agents/ingest/breaker.py); device quotas (agents/ingest/quota_gate.py); decoding and counting
(agents/ingest/intake.py); the flusher/applier (agents/ingest/applier.py) and the DLQ writer
(agents/ingest/dlq_writer.py); Redis retries (agents/ingest/clients.py).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError
from aiokafka.structs import ConsumerRecord
from mode import Service

from ldpstream.agents import heap, metrics
from ldpstream.agents.control.collection_state import CollectionStates
from ldpstream.agents.control.control_topic import CHECK_S as CONTROL_CHECK_S
from ldpstream.agents.control.control_topic import ControlTopics
from ldpstream.agents.ingest.applier import OFFSET_AUDIT_S, Applier
from ldpstream.agents.ingest.breaker import Breaker
from ldpstream.agents.ingest.clients import Clients, RedisGate, watch_connections
from ldpstream.agents.ingest.faults import Load, Take
from ldpstream.agents.ingest.log_check import LogCheck
from ldpstream.agents.ingest.log_identity import KINDS as LOG_KINDS
from ldpstream.agents.ingest.partition import Partitions, PartitionState
from ldpstream.agents.ingest.rebalance import Listener, Rebalancer
from ldpstream.agents.ingest.stats import IngestStats
from ldpstream.config import Collection, IngestConfig
from ldpstream.kafka_admin import create_topics
from ldpstream.names import BUDGET_FIELD, COMPACTED_TOPICS, CONFIG_TOPIC, SERVICE_TOPICS
from ldpstream.producers.bounded_fetch import GUARD_MARKER
from ldpstream.producers.device import ConfigWatcher
from ldpstream.producers.kafka_security import KafkaSecurity
from ldpstream.producers.signing import SigningKey

log = logging.getLogger(__name__)

#: refusal reasons of an ldp.config record that only a forger produces (producers/signing.py)
FORGERY_REASONS = ("unsigned", "wrong_key", "bad_signature", "wrong_collection")

#: a delta is due by size at ``batch_reports`` reports or, holding many cells, at this many
#: reports per cell: its apply costs Redis an operation per cell and level (a numeric
#: attribute's 259 outputs against a category's 16), the counting a few per report
REPORTS_PER_CELL = 64
#: ... at most this many times ``batch_reports`` (what a delta holds per report, memoized rows
#: and batch-dedupe and quota entries, stays bounded)
WIDE_DELTA_MAX = 8
#: reports taken per poll, in deltas (``batch_reports``): 4 measured ~14 % more ingest than 1
#: (``ldpstream bench pipeline``, 4M reports of 500 per message: 4.85M vs 4.25M reports/s)
POLL_DELTAS = 4

#: longest a fetch waits in the broker for new records (aiokafka's default is 500 ms). Apache
#: Kafka answers a waiting fetch as soon as a record arrives; Tansu answers it on its own
#: schedule, about 80 ms after the record (measured on loopback), which alone would take most of
#: a quiet stream's 100 ms from publish to counted (docs/pipeline.md "Adaptive flushing"). Idle,
#: it costs one fetch request per partition leader every 20 ms.
FETCH_MAX_WAIT_MS = 20


#: bytes of messages one take holds at most: under the heap's mmap threshold
#: (agents/heap.py), so that a take's buffers (the joined reports, their columns) come from
#: the heap, not from fresh mappings paid in page faults each time. Wider reports (a numeric
#: attribute's uint16 grid points) make for fewer reports a take.
TAKE_BYTES = 3 * heap.MMAP_THRESHOLD // 4


#: messages one poll takes at most (``getmany(max_records=...)``): the fetcher sends its next fetch
#: to a broker only once every record it holds from that broker was taken
POLL_MAX_RECORDS = 5000


def fetch_settings(max_message_bytes: int) -> dict[str, int]:
    """How the report consumer fetches (aiokafka keyword arguments): the worker's, and the raw
    consumer's of ``ldpstream bench pipeline``, so that both read a topic alike
    (docs/pipeline.md "Measured")."""
    return {"max_partition_fetch_bytes": max(4 * 1_048_576, 2 * int(max_message_bytes)),
            "fetch_max_bytes": 64 * 1_048_576, "fetch_max_wait_ms": FETCH_MAX_WAIT_MS}


def due_reports(batch_reports: int, cells: int) -> int:
    """Reports at which a delta of ``cells`` count cells is due by size: ``batch_reports``, or
    :data:`REPORTS_PER_CELL` per cell for a wide one, at most :data:`WIDE_DELTA_MAX` times
    ``batch_reports`` (docs/pipeline.md "Adaptive flushing")."""
    return min(WIDE_DELTA_MAX * batch_reports, max(batch_reports, REPORTS_PER_CELL * cells))


def caught_up(data: Mapping[TopicPartition, list[ConsumerRecord]],
              highwater: Callable[[TopicPartition], int | None], short: bool) -> bool:
    """Whether a poll's records reach the end of their logs (docs/pipeline.md "Adaptive
    flushing"): the poll came back ``short`` (fewer records than asked) and every partition's
    last record is the last its log held at the fetch (``highwater``, the log end offset the
    broker sent with it; unknown counts as reached). A poll is short during a backlog too, when
    the fetcher holds less than a poll asks (one fetch per partition, a few MiB): only the log
    end says the worker is not behind."""
    if not short:
        return False
    for tp, msgs in data.items():
        end = highwater(tp)
        if msgs and end is not None and msgs[-1].offset + 1 < end:
            return False
    return True


def starts_where_expected(state: PartitionState, msgs: list[ConsumerRecord]) -> bool:
    """The first record taken after positioning must be the one positioned at
    (``state.expect``): a later one means the consumer's position is not the one the log check
    set (the records between would be skipped unseen), so the partition is marked for a check
    (which seeks it again) and False is returned. A decompression-bomb replacement
    (producers/bounded_fetch.py) stands at its batch's last offset and is taken. Once met,
    ``expect`` is cleared."""
    first = next((m for m in msgs if state.seen is None or m.offset > state.seen), None)
    if first is None or state.expect is None:
        return True
    if first.offset > state.expect and not (first.value or b"").startswith(GUARD_MARKER):
        log.warning("ingest: %s[%d]: first record at offset %d, expected %d; checking the log "
                    "again", state.tp.topic, state.tp.partition, first.offset, state.expect)
        metrics.POSITION_GAPS.labels(state.collection).inc()
        state.suspect = True
        return False
    state.expect = None
    return True


class IngestService(Service):
    """The consumer loop: poll the report topics, hand each partition's records to the intake
    (or the breaker), start flushes when due; lag, offset audit and Kafka commits on the side.
    Owns the Kafka clients' lifecycle (started and stopped with the faust app)."""

    def __init__(self, *, collections: dict[str, Collection], states: CollectionStates,
                 options: IngestConfig, clients: Clients, gate: RedisGate,
                 partitions: Partitions, load: Load, take: Take, breaker: Breaker,
                 applier: Applier, rebalancer: Rebalancer, log_check: LogCheck,
                 stats: IngestStats, bootstrap: str, kafka_security: KafkaSecurity,
                 signing_key: SigningKey, group_id: str = "ldpstream-ingest",
                 session_timeout_ms: int = 10_000, publish_config: bool = True,
                 create_topics: bool = True, poll_ms: int = 100,
                 max_records: int = POLL_MAX_RECORDS,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.collections = collections
        self.states = states
        self.batch_reports = int(options.batch_reports)
        self.batch_seconds = float(options.batch_seconds)
        self.max_message_bytes = int(options.max_message_bytes)
        self.clients, self.gate, self.partitions = clients, gate, partitions
        self.load, self.take, self.breaker = load, take, breaker
        self.applier, self.rebalancer, self.log_check = applier, rebalancer, log_check
        applier.on_failure = self.crash  # a flush that failed stops the worker (module docstring)
        self.stats = stats
        self.bootstrap, self.signing_key = bootstrap, signing_key
        self.kafka_security = kafka_security
        self.security = kafka_security.client_kwargs()
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
        self._bytes_seen = 0
        self.cid_of = {c.topic: cid for cid, c in collections.items()}
        self.config_watch: ConfigWatcher | None = None
        #: recreates missing topics and republishes the signed states after broker log loss or
        #: before they expire (agents/control/control_topic.py); set on start
        self.control: ControlTopics | None = None
        #: awaited on start before ldp.config is published: the adaptive states stored so far,
        #: returns the collections whose state cannot be read now (agents/control/controller.py)
        self.follow_all: Callable[[], Awaitable[set[str]]] | None = None
        self._last_commit = 0.0
        self._last_lag = 0.0
        self._last_check = 0.0
        self._last_audit = 0.0
        for cid in collections:  # series at 0, so that the LogReset alert sees the first one
            for kind in LOG_KINDS:
                metrics.LOG_RESETS.labels(cid, kind)

    # --- lifecycle ------------------------------------------------------------------------------
    async def on_start(self) -> None:
        try:
            await self._start()
        finally:
            if self.should_stop:   # stopped while starting: what started after on_stop ran
                await self._stop_control()
                await self._close_clients()

    async def _start(self) -> None:
        boot = self.bootstrap
        topics = {c.topic: int(c.partitions) for c in self.collections.values()} | SERVICE_TOPICS
        if self.create_topics_on_start:
            await self._create_topics(topics)
        self.clients.producer = producer = AIOKafkaProducer(
            bootstrap_servers=boot, acks="all", linger_ms=5,
            max_request_size=max(1_048_576, 2 * 65_536 + 4096), client_id="ldpstream-worker",
            **self.security)
        await producer.start()
        if self.clients.producer is not producer:   # taken by a stop while it started
            await producer.stop()
            return
        if self.publish_config_on_start:
            # the adaptive states stored so far; one that cannot be read now is not republished
            # (its stored version may be newer than the config's) until the controller can
            unread = await self.follow_all() if self.follow_all is not None else ()
            await self.publish_config(skip=unread)
            if self.create_topics_on_start:  # recreated and republished after broker log loss
                self.control = await ControlTopics(
                    boot, topics, CONFIG_TOPIC, self._republish, self._create_topics,
                    self.security, len(self.collections)).start()
                self.applier.dlq.control = self.control
        # read ldp.config as devices do: a forged or foreign record shows in a metric and alert
        for reason in FORGERY_REASONS:
            metrics.CONFIG_REFUSED.labels(reason)
        self.config_watch = await ConfigWatcher(
            boot, verify_key=self.signing_key.verify_key, security=self.kafka_security,
            on_refused=lambda exc: metrics.CONFIG_REFUSED.labels(exc.reason).inc(),
            collections=self.collections, max_epsilon=None).start()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=boot, group_id=self.group_id, enable_auto_commit=False,
            # never reset a position silently: an out-of-range position means the log is not the
            # one the stored offset came from (agents/ingest/log_identity.py checks it)
            auto_offset_reset="none", session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(100, self.session_timeout_ms // 4),
            rebalance_timeout_ms=max(self.session_timeout_ms, 30_000),
            client_id="ldpstream-ingest", **fetch_settings(self.max_message_bytes),
            # a report topic deleted and recreated on Apache Kafka is seen (and its new log
            # judged) at the next metadata refresh: 10 s, not aiokafka's 5 min
            metadata_max_age_ms=10_000, **self.security)
        self.clients.consumer = consumer
        watch_connections(
            consumer, lambda: self.rebalancer.suspect(self.clients.assignment()))
        consumer.subscribe(sorted(self.cid_of), listener=Listener(self.rebalancer))
        await consumer.start()
        if self.clients.consumer is not consumer:   # taken by a stop while it started
            await consumer.stop()
            return
        heap.freeze()   # the start-up's objects out of every later collection (agents/heap.py)

    async def on_stop(self) -> None:
        await self._stop_control()
        await self.applier.stop(10.0)
        # an apply that failed for a reason other than Redis being unreachable: the partitions
        # stay held, so the next owner's poison-pill breaker processes them carefully
        if self.applier.failed is None:
            await self.rebalancer.release(self.clients.assignment())
        await self._close_clients()

    async def _stop_control(self) -> None:
        if self.control is not None:
            await self.control.stop()
            self.control = self.applier.dlq.control = None

    async def _close_clients(self) -> None:
        """Stop the config watcher and the Kafka clients, each once (taken, then stopped)."""
        if self.config_watch is not None:
            await self.config_watch.stop()
            self.config_watch = None
        consumer, self.clients.consumer = self.clients.consumer, None
        producer, self.clients.producer = self.clients.producer, None
        for what, client in (("consumer", consumer), ("producer", producer)):
            if client is not None:
                try:
                    await client.stop()
                except Exception:  # noqa: BLE001
                    log.warning("ingest: %s stop failed", what, exc_info=True)

    async def publish_config(self, skip: Iterable[str] = ()) -> None:
        """Publish every collection's mechanism state (but ``skip``'s), signed with the worker's
        key (producers/signing.py), to the compacted ``ldp.config``."""
        producer = self.clients.producer
        assert producer is not None, "ldp.config is published only while the service runs"
        futs = []
        skipped = set(skip)
        for cid in [c for c in self.collections if c not in skipped]:
            state = self.states[cid].current.device_state()
            budget = self.collections[cid].max_epsilon_per_day
            if budget is not None:  # the device ledger enforces it (docs/privacy-over-time.md)
                state[BUDGET_FIELD] = budget
            value = self.signing_key.sign_state(state, cid)
            futs.append(await producer.send(CONFIG_TOPIC, value, key=cid.encode()))
        await asyncio.gather(*futs)

    async def _republish(self) -> None:
        """Publish every state again (the adaptive ones as stored: agents/control/controller.py)."""
        await self.publish_config(skip=await self.follow_all() if self.follow_all is not None
                                  else ())

    async def _create_topics(self, topics: Mapping[str, int]) -> list[str]:
        return await create_topics(self.bootstrap, topics, compacted=COMPACTED_TOPICS)

    @Service.task
    async def _keep_control_topics(self) -> None:
        """agents/control/control_topic.py: every CHECK_S, recreate missing topics and republish the
        signed states after log loss or before they expire."""
        while not self.should_stop:
            await asyncio.sleep(CONTROL_CHECK_S)
            if self.control is not None:
                try:
                    await self.control.check()
                except Exception as exc:  # noqa: BLE001 - the broker may be down: next check
                    metrics.CONTROL_CHECK_FAILED.inc()
                    log.warning("ingest: control-topic check failed: %s", exc)

    async def flush(self) -> None:
        """Apply every partition's pending delta now and wait for it."""
        await self.applier.flush()

    # --- consuming ------------------------------------------------------------------------------
    @Service.task
    async def _consume(self) -> None:
        while not self.should_stop:
            consumer = self.clients.consumer
            if consumer is None:
                await asyncio.sleep(0.05)
                continue
            if self.rebalancer.has_suspects() and time.monotonic() - self._last_check >= 0.5:
                # a log to check before anything more is taken from it (a broken broker
                # connection, an out-of-range position): its records wait, re-sought after
                self._last_check = time.monotonic()
                await self.rebalancer.check_suspects(self.applier.wait_flushed)
            t0 = time.perf_counter()
            try:
                # drain what the fetcher holds (up to max_records), so that it sends the next
                # fetch now and the broker serves it while these records are counted
                data = await consumer.getmany(
                    timeout_ms=self.poll_ms if not self.partitions.pending_reports
                    else min(self.poll_ms, 20), max_records=self.max_records)
            except asyncio.CancelledError:
                raise
            except NoOffsetForPartitionError:
                # a partition just assigned, not positioned yet: the rebalancer seeks it to the
                # offset stored in Redis (the consumer never picks a position by itself)
                await asyncio.sleep(0.01)
                continue
            except OffsetOutOfRangeError as exc:  # the log is not where the offsets say
                self.rebalancer.suspect(
                    exc.args[0] if exc.args and isinstance(exc.args[0], dict)
                    else self.clients.assignment())
                await self.rebalancer.check_suspects(self.applier.wait_flushed)
                continue
            except Exception:  # noqa: BLE001 - keep the worker alive; aiokafka reconnects
                log.warning("ingest: poll failed", exc_info=True)
                await asyncio.sleep(0.5)
                continue
            t1 = time.perf_counter()
            got = sum(len(msgs) for msgs in data.values())
            between = await self._take_all(data)
            t2 = time.perf_counter()
            now = time.monotonic()
            await self._flush_if_due(now, caught_up=caught_up(
                data, consumer.highwater, got < self.max_records))
            t3 = time.perf_counter()
            if data:
                timings = self.stats.timings
                timings["poll"] += t1 - t0 + between
                timings["decode"] += t2 - t1 - between
                timings["flush_wait"] += t3 - t2
            await self._housekeeping(now)

    async def _take_all(self, data: Mapping[TopicPartition, list[ConsumerRecord]]) -> float:
        """Hand each partition's records to the intake (or the breaker) in takes of about
        :data:`POLL_DELTAS` deltas (:meth:`_poll_records`), so the per-take arrays stay
        cache-sized. Between takes the event loop runs (the fetcher's next response, a flush
        that is due); a partition revoked or reset meanwhile keeps none of the rest (it was
        re-sought: its records come again). Returns the seconds spent between takes."""
        between = 0.0
        for tp, msgs in data.items():
            state = self.partitions.get(tp)
            if state is None:
                continue  # revoked meanwhile: its records come again to the next owner
            if state.suspect:
                continue  # its log is checked first; the check seeks it, the records come again
            if state.expect is not None and not starts_where_expected(state, msgs):
                continue
            epoch = state.epoch
            step = self._poll_records() if state.careful is None else len(msgs)
            for at in range(0, len(msgs), step):
                if at:
                    t = time.perf_counter()
                    await self._flush_if_due(time.monotonic())
                    await asyncio.sleep(0)
                    between += time.perf_counter() - t
                chunk = msgs[at:at + step]
                before = self.partitions.pending_reports
                await self.load(state, chunk)
                if self.partitions.get(tp) is not state or state.epoch != epoch or state.suspect:
                    break
                if state.careful is not None:
                    await self.breaker.take_carefully(state, chunk)
                else:
                    self.take(state, chunk)
                self._msgs_seen += len(chunk)
                self._reports_seen += self.partitions.pending_reports - before
                self._bytes_seen += sum(len(m.value or b"") for m in chunk)
        return between

    async def _flush_if_due(self, now: float, caught_up: bool = False) -> None:
        """Every partition with something pending goes when one is due (their applies run
        concurrently: one Redis fsync serves them all); while a flush is in flight the deltas
        grow instead, up to ``max_pending_reports``, so slow applies mean bigger deltas.

        Adaptive (docs/pipeline.md "Adaptive flushing"): a delta is due at ``batch_reports``
        reports (more for one of many cells: :func:`due_reports`) or ``batch_seconds``, or as
        soon as the worker has ``caught_up`` (its poll returned fewer records than asked) and no
        flush is in flight: a quiet stream is applied when its poll returns, a busy one (full
        polls, or a flush still on the wire) batches."""
        in_flight = self.applier.in_flight()
        due = (caught_up and not in_flight) or any(
            s.pending is not None and (
                (s.pending.n >= self.batch_reports
                 and s.pending.n >= due_reports(self.batch_reports, s.pending.cells()))
                or now - s.pending.since >= self.batch_seconds)
            for s in self.partitions)
        if due and (not in_flight or self.partitions.pending_reports >= self.max_pending_reports):
            tps = self.partitions.with_pending()
            if tps:
                await self.applier.start_flush(tps)

    async def _housekeeping(self, now: float) -> None:
        if now - self._last_lag >= 1.0:
            self._last_lag = now
            self._update_lag()
            if self.rebalancer.has_suspects():
                await self.rebalancer.check_suspects(self.applier.wait_flushed)
        if now - self._last_audit >= OFFSET_AUDIT_S:
            self._last_audit = now
            await self.applier.audit_offsets()
        if now - self._last_commit >= 5.0:
            self._last_commit = now
            await self._commit()
            heap.trim()   # freed poll and delta buffers back to the OS (agents/heap.py)

    def _poll_records(self) -> int:
        """Messages per take: about :data:`POLL_DELTAS` deltas' worth (``batch_reports`` each)
        at the mean reports per message seen so far, and at most :data:`TAKE_BYTES` at the mean
        message size, so the per-take arrays stay cache-sized and on the heap whatever the batch
        size and report width, while the fixed cost of a take is paid rarely."""
        if self._msgs_seen < 100:
            return min(self.max_records, 200)
        per_msg = max(1.0, self._reports_seen / self._msgs_seen)
        by_bytes = TAKE_BYTES * self._msgs_seen / max(1, self._bytes_seen)
        return int(max(16, min(self.max_records, POLL_DELTAS * self.batch_reports / per_msg,
                               by_bytes)))

    def _update_lag(self) -> None:
        consumer = self.clients.consumer
        if consumer is None:
            return
        lag: dict[str, int] = defaultdict(int)
        for tp in self.clients.assignment():
            hw = consumer.highwater(tp)
            state = self.partitions.get(tp)
            if hw is None or state is None:
                continue
            behind = hw - (0 if state.stored is None else state.stored + 1)
            if behind < 0 and state.seen is not None:
                state.suspect = True  # the log ends below what was counted: never hidden
            lag[state.collection] += behind
        for cid in self.collections:
            metrics.CONSUMER_LAG.labels(cid).set(lag.get(cid, 0))

    async def _commit(self) -> None:
        """Best-effort Kafka commit of the applied offsets (tooling only; Redis is the record)."""
        consumer = self.clients.consumer
        if consumer is None:
            return
        assigned = self.clients.assignment()
        offsets = {s.tp: s.stored + 1 for s in self.partitions
                   if s.stored is not None and s.tp in assigned}
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except Exception as exc:  # noqa: BLE001 - rebalancing etc.; Redis is the record anyway
            log.debug("ingest: Kafka commit skipped: %s", exc)

    # --- introspection for tests / health -------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The ``checks.ingest`` part of ``/healthz``."""
        s = self.stats
        return {"assigned": sorted(f"{tp.topic}[{tp.partition}]"
                                   for tp in self.clients.assignment()),
                "blocked": self.gate.blocked, "pending_reports": self.partitions.pending_reports,
                "applied_batches": s.applied_batches, "skipped_batches": s.skipped_batches,
                "conflicts": s.conflicts, "lost_rereads": s.lost_rereads,
                "applied_reports": s.applied_reports, "assigned_at": self.rebalancer.assigned_at,
                "last_apply_at": s.last_apply_at,
                # the worker's CPU seconds from the last assignment to the last apply (every
                # thread: ingest, refreshes, HTTP): what ``bench pipeline`` divides by reports
                "cpu_s": None if s.last_apply_cpu is None or self.rebalancer.assigned_cpu is None
                else round(s.last_apply_cpu - self.rebalancer.assigned_cpu, 4),
                "log_resets": self.log_check.resets[-20:],
                "poison_pills": s.poison_pills, "device_state_full": dict(s.device_state_full),
                "config_republished": [] if self.control is None else self.control.republished,
                "careful": sorted(f"{st.tp.topic}[{st.tp.partition}]" for st in self.partitions
                                  if st.careful is not None),
                "timings_s": {k: round(v, 4) for k, v in s.timings.items()}}
