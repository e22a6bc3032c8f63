"""The device client: randomize on the device, buffer reports, publish report batches.

* :class:`ConfigWatcher` reads the compacted topic ``ldp.config`` (key = collection id, value =
  a signed ``Mechanism.state()``, producers/signing.py) from its beginning and keeps following
  it, so devices always randomize with the mechanism state in force and stamp every report with
  its ``version`` (RRBA tables, Corr-RR phases change it). It accepts only states signed by the
  pinned key, never an older one than it has (replay; across restarts with a ``floor``, e.g. the
  device's ledger), never an expired one, never an identity channel (ε = ∞) and never one whose
  computed ε exceeds the device's ceiling (:data:`DEFAULT_MAX_EPSILON` unless it sets one).
* :class:`Device` randomizes its own records with ``mechanism.randomize(records, rng)`` (the true
  values never leave it), buffers the reports and publishes them as one report batch when the
  buffer is full or on :meth:`Device.flush`.
* :class:`Gateway` batches many devices' already-randomized reports into one message (with their
  device ids): the shape the fleet simulator uses, since one message per report caps a Faust
  worker at ≈ 15k reports/s (docs/pipeline.md).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from typing import Any, Callable, Collection, Iterable, Mapping, Protocol

import numpy as np

from ldpstream.credentials.device_keys import DeviceSigner
from ldpstream.estimators.mechanism import Mechanism, from_state
from ldpstream.names import BUDGET_FIELD, CONFIG_TOPIC, reports_topic
from ldpstream.producers import bounded_fetch
from ldpstream.producers.codec import encode_batch
from ldpstream.producers.kafka_security import KafkaSecurity, kafka_security
from ldpstream.producers.publisher import Publisher
from ldpstream.producers.signing import (
    ENV_PUBLIC_KEY,
    ENV_PUBLIC_KEY_FILE,
    SignedState,
    StateRejected,
    VerifyKey,
    load_verify_key,
)

log = logging.getLogger(__name__)

#: bound on the decompressed size of one fetched ldp.config batch (states are kilobytes)
CONFIG_MAX_DECOMPRESSED = 16 * 1_048_576


#: relative slack of the ε ceiling (float rounding of the computed ε, never a real excess)
CEILING_RTOL = 1e-9
#: a device's ceiling on the ε per report of a state it adopts, unless it sets one
DEFAULT_MAX_EPSILON = 8.0
#: records a watcher of given collections reads back from the end of ldp.config at first
TAIL_RECORDS = 2000
#: the longest the watcher verifies records before yielding to the event loop (docs/security.md
#: "A flood of ldp.config costs a bounded time")
SLICE_S = 0.01
#: a refused record is logged at most once per this many seconds (with a count of the others)
REFUSAL_LOG_S = 10.0
#: refused records remembered (by a hash of key and value) so that the same bytes again are
#: refused without a second signature check; every refusal stays one for a watcher (its key is
#: fixed, the newest adopted state only moves forward, an expiry does not come back)
REFUSED_REMEMBERED = 4096


class StateFloor(Protocol):
    """Where a device persists the newest ``(version, issued_at)`` it adopted per collection
    (producers/ledger.py ``Ledger``), so that a restart does not accept an older state."""

    def state_floor(self, collection: str) -> tuple[int, float] | None: ...

    def raise_state_floor(self, collection: str, version: int, issued_at: float) -> None: ...


def mechanism_from_state(signed: SignedState, *, max_epsilon: float | None = None) -> Mechanism:
    """Rebuild the mechanism of a verified ``ldp.config`` state (:meth:`VerifyKey.open`);
    refuses (:class:`StateRejected` ``over_ceiling``) a state whose ε, computed from the channel
    it would apply, exceeds ``max_epsilon``, and always one whose ε is infinite (an identity
    channel: the report would be the true record)."""
    if not isinstance(signed, SignedState):
        raise StateRejected("unsigned", f"expected a verified SignedState, got "
                                        f"{type(signed).__name__}")
    body = {k: v for k, v in signed.state.items()
            if k not in ("collection", "issued_at", "expires_at", BUDGET_FIELD)}
    try:
        mech = from_state(body)
        eps = float(mech.epsilon)
    except Exception as exc:  # noqa: BLE001 - any unusable state is refused, never adopted
        raise StateRejected("unusable", f"{exc.__class__.__name__}: {exc}") from None
    check_ceiling(signed, eps, max_epsilon)
    return mech


def check_ceiling(signed: SignedState, eps: float, max_epsilon: float | None) -> None:
    """Refuse (``over_ceiling``) the state ``signed`` whose mechanism costs ``eps`` per report
    (computed from its channel): always when infinite (an identity channel), and above
    ``max_epsilon`` (None: no ceiling)."""
    if not eps < float("inf"):
        raise StateRejected("over_ceiling", f"state version {signed.version} of "
                                            f"{signed.collection!r} has an identity channel (ε = "
                                            f"{eps:g}): it would send the true records")
    if max_epsilon is not None and not eps <= max_epsilon * (1 + CEILING_RTOL):
        raise StateRejected("over_ceiling", f"state version {signed.version} of "
                                            f"{signed.collection!r} costs ε = {eps:g} per report, "
                                            f"above this device's ceiling {max_epsilon:g}")


class ConfigWatcher:
    """Follow ``ldp.config`` from the beginning (no consumer group), keeping the newest verified
    state per collection id. ``on_change(collection, signed)`` is called for every new or newer
    accepted state; ``mechanisms[collection]`` is the mechanism rebuilt from it.

    ``verify_key``: the pinned public key (default: ``LDP_CONFIG_PUBLIC_KEY(_FILE)``; without one
    every state is refused). ``max_epsilon``: this device's ceiling on the computed ε per report
    (one number, or per collection id; default :data:`DEFAULT_MAX_EPSILON`; None: no ceiling, for
    readers that are not devices: the worker, the gateway). An identity channel is refused
    whatever the ceiling. ``floor``: where the newest adopted ``(version, issued_at)`` per
    collection is persisted (the device's ``Ledger``): a restarted device refuses older states
    as ``replayed``. ``clock``: unix seconds (expiry). Refused records are counted in
    ``rejected`` (reason → count), the last ones kept in ``refusals`` and passed to
    ``on_refused``.

    :meth:`start` returns once the topic has been read up to the end offsets it had when the
    watcher started, so :attr:`states` then holds every collection published so far."""

    def __init__(self, bootstrap: str, *, topic: str = CONFIG_TOPIC,
                 on_change: Callable[[str, SignedState], None] | None = None,
                 verify_key: VerifyKey | None = None,
                 max_epsilon: float | Mapping[str, float] | None = DEFAULT_MAX_EPSILON,
                 security: KafkaSecurity | None = None,
                 on_refused: Callable[[StateRejected], None] | None = None,
                 collections: Collection[str] | None = None, floor: StateFloor | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.bootstrap = bootstrap
        self.floor = floor
        self.clock = clock
        #: the collections to follow (None: all); records keyed for others are not even verified
        self.collections = None if collections is None else frozenset(collections)
        self.on_refused = on_refused
        self.security = security if security is not None else kafka_security()
        self.topic = topic
        self.on_change = on_change
        self.verify_key = verify_key if verify_key is not None else load_verify_key()
        self.max_epsilon = max_epsilon
        self.states: dict[str, SignedState] = {}
        self.mechanisms: dict[str, Mechanism] = {}
        #: the accepted record values as published (relayed by the HTTP gateway, re-verified by
        #: the devices that fetch them)
        self.records: dict[str, bytes] = {}
        self.rejected: dict[str, int] = {}
        self.refusals: list[StateRejected] = []
        self._consumer = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._changed = asyncio.Event()
        self._refused: OrderedDict[bytes, StateRejected] = OrderedDict()
        #: refusals not logged yet (logged at most once per REFUSAL_LOG_S: a flood is one line)
        self._unlogged = 0
        self._logged_at = -REFUSAL_LOG_S
        if self.verify_key is None:
            log.warning("no public key pinned (LDP_CONFIG_PUBLIC_KEY): every %s state will be "
                        "refused", topic)

    def ceiling(self, collection: str) -> float | None:
        if self.max_epsilon is None or isinstance(self.max_epsilon, (int, float)):
            return self.max_epsilon
        return self.max_epsilon.get(collection)

    async def start(self, timeout_s: float = 30.0) -> "ConfigWatcher":
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.errors import KafkaError

        bounded_fetch.install(CONFIG_MAX_DECOMPRESSED)  # a bomb on ldp.config is refused
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                        enable_auto_commit=False, auto_offset_reset="earliest",
                                        **self.security.client_kwargs())
            try:
                await consumer.start()
                parts = consumer.partitions_for_topic(self.topic)
                if not parts:
                    await consumer._client.force_metadata_update()  # noqa: SLF001
                    parts = consumer.partitions_for_topic(self.topic)
                if parts:
                    break
                err = f"topic {self.topic!r} does not exist"
            except KafkaError as exc:
                err = str(exc)
            except BaseException:   # cancelled while starting: nothing left open
                await consumer.stop()
                raise
            await consumer.stop()
            if loop.time() > deadline:
                raise ConnectionError(f"cannot read {self.topic} at {self.bootstrap}: {err}")
            await asyncio.sleep(0.5)
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        self._consumer = consumer
        try:
            await self._catch_up(tps, deadline)
        except BaseException:
            await consumer.stop()
            self._consumer = None
            raise
        self._stopping = False
        self._task = asyncio.create_task(self._follow(consumer), name="ldp-config-watcher")
        self._task.add_done_callback(self._ended)
        return self

    def _ended(self, task: asyncio.Task) -> None:
        """The following task's end: a crash is logged (and :attr:`running` turns False), never
        left unretrieved."""
        if not task.cancelled() and task.exception() is not None:
            log.error("%s watcher stopped: %r", self.topic, task.exception(),
                      exc_info=task.exception())

    @property
    def running(self) -> bool:
        """True while the watcher follows the topic (started, not stopped, not crashed)."""
        return self._task is not None and not self._task.done()

    async def _catch_up(self, tps: list, deadline: float) -> None:
        """Read up to the end offsets at the time of the call. A watcher that follows given
        ``collections`` reads the newest :data:`TAIL_RECORDS` records first and goes further
        back (4 times as far each time) only while one of its collections has no state yet, so
        a flood of junk before the newest valid states costs nothing (the worker republishes
        after a flood, agents/control/control_topic.py); one that follows every collection reads all."""
        assert self._consumer is not None
        begins = await self._consumer.beginning_offsets(tps)
        ends = await self._consumer.end_offsets(tps)
        upto = dict(ends)
        window = TAIL_RECORDS
        after: dict[Any, int] = {}
        while True:
            start = {tp: begins[tp] if self.collections is None else
                     max(begins[tp], upto[tp] - window) for tp in tps}
            await self._read_range(tps, start, upto, deadline, newest=not after)
            if not after:  # where following continues (past whatever the newest read took)
                after = {tp: await self._consumer.position(tp) for tp in tps}
            missing = self.collections is None or not set(self.collections) <= set(self.states)
            if not missing or all(start[tp] <= begins[tp] for tp in tps):
                break
            upto, window = start, window * 4
        for tp in tps:
            self._consumer.seek(tp, after[tp])

    async def _read_range(self, tps: list, start: Mapping[Any, int], upto: Mapping[Any, int],
                          deadline: float, *, newest: bool) -> None:
        """Take the records in ``[start, upto)`` of each partition (``newest``: up to the end
        offsets, and whatever the last fetched batch holds beyond them); a collection that has
        a state already (from newer records) skips the older ones silently."""
        loop = asyncio.get_running_loop()
        have = set(self.states)
        consumer = self._consumer
        assert consumer is not None, "read only while the watcher runs"
        for tp in tps:
            consumer.seek(tp, start[tp])
        while True:
            behind = [tp for tp in tps if await consumer.position(tp) < upto[tp]]
            if not behind:
                return
            if loop.time() > deadline:
                raise ConnectionError(f"cannot read {self.topic} at {self.bootstrap} up to its "
                                      f"end offsets {dict(upto)} in time")
            batches = await consumer.getmany(*behind, timeout_ms=200, max_records=1000)
            await self._take_all(
                msg for tp, msgs in batches.items() for msg in msgs
                if (newest or msg.offset < upto[tp])
                and (msg.key or b"").decode("utf-8", "replace") not in have)

    async def _take_all(self, msgs: Iterable[Any]) -> None:
        """Take records in slices of at most :data:`SLICE_S` of verification each, yielding to
        the event loop between slices: a flood of records to verify delays the process's other
        work (HTTP, timers, Kafka heartbeats) by one slice at a time, never by the flood."""
        start = time.perf_counter()
        for i, msg in enumerate(msgs):
            self._take(msg.key, msg.value)
            if i % 16 == 15 and time.perf_counter() - start > SLICE_S:
                await asyncio.sleep(0)
                start = time.perf_counter()
        await asyncio.sleep(0)  # getmany returns prefetched records without yielding

    async def _follow(self, consumer: Any) -> None:
        """Follow the topic with ``consumer`` (its own reference: :meth:`stop` may drop the
        watcher's while this task ends) until :meth:`stop`."""
        from aiokafka.errors import KafkaError

        while not self._stopping:
            try:
                batches = await consumer.getmany(timeout_ms=500, max_records=1000)
            except KafkaError as exc:  # the broker is away: keep the states, keep trying
                log.warning("cannot read %s (%s); retrying", self.topic, exc)
                await asyncio.sleep(1.0)
                continue
            await self._take_all(msg for msgs in batches.values() for msg in msgs)

    def refusal_summary(self) -> str:
        """The refusals in words, each reason with its count and its latest detail (which names
        what to fix, e.g. the variable of the public key), or "" when none."""
        latest = {r.reason: r.detail for r in self.refusals}
        return "; ".join(f"{reason} ×{n}: {latest.get(reason, '')}".rstrip(": ")
                         for reason, n in sorted(self.rejected.items()))

    def _take(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:
            return  # tombstone: keep what we had (devices must not stop reporting)
        if self.collections is not None and (key or b"").decode("utf-8", "replace") \
                not in self.collections:
            return  # another collection's state (a record whose key lies is refused below)
        h = hashlib.blake2b(len(key or b"").to_bytes(4, "big"), digest_size=16)
        h.update(key or b"")
        h.update(value)
        digest = h.digest()
        try:
            known = self._refused.get(digest)
            if known is not None:
                self._refused.move_to_end(digest)
                raise known
            signed, mech = self._verify(key, value)
        except StateRejected as exc:
            self._refused[digest] = exc
            if len(self._refused) > REFUSED_REMEMBERED:
                self._refused.popitem(last=False)
            self.rejected[exc.reason] = self.rejected.get(exc.reason, 0) + 1
            self.refusals = (self.refusals + [exc])[-100:]
            self._log_refusal(key, exc)
            if self.on_refused is not None:
                self.on_refused(exc)
            return
        self.states[signed.collection] = signed
        self.mechanisms[signed.collection] = mech
        if self.floor is not None:
            self.floor.raise_state_floor(signed.collection, signed.version, signed.issued_at)
        self.records[signed.collection] = value
        self._changed.set()
        if self.on_change is not None:
            self.on_change(signed.collection, signed)

    def _log_refusal(self, key: bytes | None, exc: StateRejected) -> None:
        """Log a refused record, at most once per :data:`REFUSAL_LOG_S` (with how many were
        refused meanwhile): a flood of junk is counted in full (:attr:`rejected`), logged in a
        few lines."""
        now = time.monotonic()
        if now - self._logged_at < REFUSAL_LOG_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more refused in the last {REFUSAL_LOG_S:g} s)" \
            if self._unlogged else ""
        log.warning("refusing a %s record (key %r): %s%s", self.topic, key, exc, more)
        self._logged_at, self._unlogged = now, 0

    def _verify(self, key: bytes | None, value: bytes) -> tuple[SignedState, Mechanism]:
        if self.verify_key is None:
            raise StateRejected("no_public_key", f"no public key pinned: set {ENV_PUBLIC_KEY} "
                                                 f"(the key's base64 line) or "
                                                 f"{ENV_PUBLIC_KEY_FILE} (a file holding it; "
                                                 f"`ldpstream keygen` writes one)")
        try:
            collection = key.decode("utf-8") if key else None
        except UnicodeDecodeError:
            raise StateRejected("malformed", "record key is not UTF-8") from None
        signed = self.verify_key.open(value, collection=collection, now=self.clock())
        old = self.states.get(signed.collection)
        newest = None if old is None else old.order
        if self.floor is not None:
            kept = self.floor.state_floor(signed.collection)
            if kept is not None and (newest is None or kept > newest):
                newest = kept
        if newest is not None and signed.order < newest:
            raise StateRejected("replayed", f"version {signed.version} issued at "
                                            f"{signed.issued_at:.3f} is older than the newest "
                                            f"adopted (version {newest[0]} issued at "
                                            f"{newest[1]:.3f})")
        return signed, mechanism_from_state(signed, max_epsilon=self.ceiling(signed.collection))

    async def wait_for(self, collection: str, timeout_s: float) -> SignedState | None:
        """The newest state of ``collection``, waiting up to ``timeout_s`` for one to appear."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while collection not in self.states:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return None
        return self.states[collection]

    async def stop(self) -> None:
        """Stop following and close the consumer. The following task has ended when this
        returns (its crash, if any, was logged by :meth:`_ended`); a cancellation of the caller
        is passed on, never swallowed (call again to finish)."""
        self._stopping = True
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
            self._task = None
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            from aiokafka.errors import KafkaError

            try:
                await consumer.stop()
            except KafkaError as exc:  # a fetch from a broker that just died, re-raised by stop
                log.warning("config watcher: %s while stopping its consumer", exc)
            except asyncio.CancelledError:
                # aiokafka's fetcher lets the cancellation of its own fetch task escape when the
                # broker is gone; only a cancellation of this task is passed on
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise


class Gateway:
    """Batch many devices' reports into report-batch messages of ``batch`` reports.

    Reports of one message share the mechanism version; :meth:`add` flushes first when the version
    changes. With ``by_device``, a device's reports always go to partition
    ``device_id % n`` (``n``: the topic's partitions on the broker, read once), each partition
    with its own buffer, so a device is one device to the worker: a memoized collection counts it
    once, not once per partition it happened to land in (docs/privacy-over-time.md, "Memoized
    collections count devices").
    """

    def __init__(self, collection: str, publisher: Publisher, *, batch: int = 500,
                 topic: str | None = None, with_device_ids: bool = True,
                 by_device: bool = False,
                 signer: DeviceSigner | None = None) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.collection = collection
        self.publisher = publisher
        self.batch = int(batch)
        self.topic = topic or reports_topic(collection)
        self.with_device_ids = with_device_ids
        self.by_device = by_device
        #: the topic's partitions (read from the broker before the first routed send)
        self.partitions: int | None = None
        #: per destination partition (None: the producer's choice): buffered reports and ids
        self._reports: dict[int | None, list[np.ndarray]] = {}
        self._ids: dict[int | None, list[np.ndarray]] = {}
        self._buffered: dict[int | None, int] = {}
        #: with a signer, every device's reports leave as its own authenticated batch
        self.signer = signer
        self._version: int | None = None
        self.sent_reports = 0
        self.sent_messages = 0

    async def add(self, reports: np.ndarray, version: int,
                  device_ids: np.ndarray | None = None) -> None:
        """Buffer ``reports`` (``(n, width)``) stamped with ``version``; send every full batch."""
        if self._version is not None and version != self._version and any(self._buffered.values()):
            await self.flush()
        self._version = int(version)
        n = len(reports)
        if n == 0:
            return
        reports = np.asarray(reports)
        ids = (np.zeros(n, dtype=np.uint64) if device_ids is None
               else np.asarray(device_ids, dtype=np.uint64))
        if not self.by_device:
            await self._buffer(None, reports, ids)
            return
        if self.partitions is None:
            self.partitions = await self.publisher.partition_count(self.topic)
        part = (ids % np.uint64(self.partitions)).astype(np.int64)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.partitions + 1))
        for p in range(self.partitions):  # one slice per partition, no loop over reports
            rows = order[bounds[p]:bounds[p + 1]]
            if len(rows):
                await self._buffer(p, reports[rows], ids[rows])

    async def _buffer(self, part: int | None, reports: np.ndarray, ids: np.ndarray) -> None:
        self._reports.setdefault(part, []).append(reports)
        self._ids.setdefault(part, []).append(ids)
        buffered = self._buffered.get(part, 0) + len(reports)
        if buffered >= self.batch:
            reports_all = np.concatenate(self._reports[part])
            ids_all = np.concatenate(self._ids[part])
            full = (buffered // self.batch) * self.batch
            for start in range(0, full, self.batch):
                await self._send(reports_all[start:start + self.batch],
                                 ids_all[start:start + self.batch], part)
            self._reports[part] = [reports_all[full:]] if full < buffered else []
            self._ids[part] = [ids_all[full:]] if full < buffered else []
            buffered -= full
        self._buffered[part] = buffered

    async def _send(self, reports: np.ndarray, ids: np.ndarray, part: int | None) -> None:
        assert self._version is not None
        if self.signer is not None:
            await self._send_signed(reports, ids)
            return
        payload = encode_batch(self.collection, self._version, reports,
                               device_ids=ids if self.with_device_ids else None, sent_at=time.time())
        await self.publisher.send(self.topic, payload, partition=part)
        self.sent_reports += len(reports)
        self.sent_messages += 1

    async def _send_signed(self, reports: np.ndarray, ids: np.ndarray) -> None:
        """One authenticated batch per device of the batch (one HMAC each)."""
        assert self._version is not None and self.signer is not None
        order = np.argsort(ids, kind="stable")
        ids, reports = ids[order], reports[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        now = time.time()
        for s, e in zip(starts, np.r_[starts[1:], len(ids)]):
            dev, seq, key = self.signer.next(int(ids[s]))
            payload = encode_batch(self.collection, self._version, reports[s:e], sent_at=now,
                                   device_ids=np.full(e - s, dev, np.uint64), key=(dev, seq),
                                   auth=(self.signer.fleet, key))
            await self.publisher.send(self.topic, payload, key=dev.to_bytes(8, "big"))
            self.sent_messages += 1
        self.sent_reports += len(reports)

    async def flush(self) -> None:
        """Send what is buffered (short batches) and wait for every acknowledgement."""
        for part, count in list(self._buffered.items()):
            if count:
                await self._send(np.concatenate(self._reports[part]),
                                 np.concatenate(self._ids[part]), part)
        self._reports, self._ids, self._buffered = {}, {}, {}
        await self.publisher.flush()


class Device:
    """One device: randomizes its true records locally and publishes buffered report batches."""

    def __init__(self, collection: str, mechanism: Mechanism, publisher: Publisher, *,
                 device_id: int = 0, buffer_size: int = 1, rng: np.random.Generator | None = None,
                 topic: str | None = None) -> None:
        self.collection = collection
        self.mechanism = mechanism
        self.device_id = int(device_id)
        self.rng = rng if rng is not None else np.random.default_rng()
        self._gateway = Gateway(collection, publisher, batch=buffer_size, topic=topic)

    def use(self, mechanism: Mechanism) -> None:
        """Switch to a newer mechanism state (from ``ldp.config``)."""
        self.mechanism = mechanism

    async def observe(self, records: np.ndarray) -> np.ndarray:
        """Randomize ``records`` (``(n, m)`` category indices) on the device and buffer the reports;
        returns the reports (what left the device)."""
        records = np.atleast_2d(np.asarray(records))
        reports = self.mechanism.randomize(records, self.rng)
        ids = np.full(len(reports), self.device_id, dtype=np.uint64)
        await self._gateway.add(reports, self.mechanism.version, ids)
        return reports

    async def flush(self) -> None:
        await self._gateway.flush()

    @property
    def sent_reports(self) -> int:
        return self._gateway.sent_reports
