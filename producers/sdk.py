"""The device SDK: report records as category labels under local differential privacy.

:class:`DeviceClient` takes records as labels (``{"sex": "Male", "Salary": ">50K"}``), checks
them against the collection's schema (an unknown attribute or category is a
:class:`~ldpstream.estimators.kernels.domain.SchemaError` naming it and the allowed ones), randomizes them
with the mechanism of the version published on ``ldp.config`` (read through
:class:`~.device.ConfigWatcher`, which accepts only states signed by the pinned key), accounts for
the ε they cost in the device's :class:`~.ledger.Ledger`
and sends buffered report batches through a transport: :class:`KafkaTransport` (the device speaks
Kafka) or :class:`HttpTransport` (``ldpstream gateway``).

Longitudinal privacy [RAPPOR §3]: when the collection memoizes (``memoize`` in its config), the
permanent randomized response of every (attribute, true value) is drawn once per rotation period
and kept in the ledger (also across restarts), the instantaneous randomization (if any) is applied
afresh to every report, and a record the device already reported in the current period is not
sent again (``status="duplicate"``) unless ``resend_every_s`` has passed. A report that would
break the ledger's budget is not sent (``status="refused"`` with the reason). Every result states
the ε it cost. Every batch carries the batch key (device id, a sequence number persisted in the
ledger), and a batch whose send failed is re-sent unchanged, so it is counted once
(docs/security.md "Idempotent batches").
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Literal, Mapping, Protocol

import numpy as np

from ldpstream.credentials.device_keys import DeviceCredential
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.mechanism import Mechanism
from ldpstream.names import BUDGET_FIELD, reports_topic
from ldpstream.producers.codec import ReportBatch, decode_batch, encode_batch
from ldpstream.producers.device import DEFAULT_MAX_EPSILON, ConfigWatcher, check_ceiling
from ldpstream.producers.ledger import Ledger, channel_fingerprint
from ldpstream.producers.program import (
    DrawSource,
    Memo,
    NumpyDraws,
    OsRandom,
    PartitionMemo,
    Program,
    ProgramError,
    SelectMemo,
    encode_record,
)
from ldpstream.producers.publisher import Publisher
from ldpstream.producers.sequence import BatchSequence
from ldpstream.producers.signing import StateRejected

log = logging.getLogger(__name__)

__all__ = ["DeviceClient", "ReportResult", "Transport", "KafkaTransport", "HttpTransport",
           "RecordingTransport", "GatewayConfigWatcher", "GatewayError", "UnknownCollectionError",
           "device_key", "BatchSequence"]


class UnknownCollectionError(LookupError):
    """The collection has no mechanism state on ``ldp.config``."""


class GatewayError(RuntimeError):
    """The HTTP gateway refused a batch: ``status`` and its JSON ``error``."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(f"gateway answered {status}: {error}")
        self.status = status
        self.error = error


def device_key(device_id: int) -> bytes:
    """The Kafka message key of a device's batches (8 bytes big-endian): all of a device's
    reports go to one partition."""
    return int(device_id).to_bytes(8, "big")


class Transport(Protocol):
    """Where report batches go (binary batches of :mod:`.codec`)."""

    async def send(self, collection: str, batch: bytes, device_id: int) -> None: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


class KafkaTransport:
    """Produce batches to ``ldp.reports.<collection>`` keyed by the device id."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher

    async def send(self, collection: str, batch: bytes, device_id: int) -> None:
        await self.publisher.send(reports_topic(collection), batch, key=device_key(device_id))

    async def flush(self) -> None:
        await self.publisher.flush()

    async def close(self) -> None:
        await self.publisher.flush()


async def _gateway_error(resp: Any) -> GatewayError:
    """The gateway's JSON error of a non-2xx answer."""
    import aiohttp

    try:
        error = str((await resp.json()).get("error"))
    except (ValueError, aiohttp.ContentTypeError):
        error = (await resp.text())[:200]
    return GatewayError(resp.status, error)


def _session(timeout_s: float) -> Any:
    import aiohttp

    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))


class HttpTransport:
    """POST batches to an ``ldpstream gateway`` (``Authorization: Bearer <fleet token>``)."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self._session: Any = None

    async def send(self, collection: str, batch: bytes, device_id: int) -> None:
        if self._session is None:
            self._session = _session(self.timeout_s)
        async with self._session.post(
                f"{self.url}/v1/collections/{collection}/reports", data=batch,
                headers={"Authorization": f"Bearer {self.token}",
                         "Content-Type": "application/octet-stream"}) as resp:
            if resp.status >= 300:
                raise await _gateway_error(resp)

    async def flush(self) -> None:
        return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class GatewayConfigWatcher(ConfigWatcher):
    """Mechanism states fetched from an ``ldpstream gateway`` over HTTP instead of Kafka: the
    gateway relays the signed ``ldp.config`` records unchanged (``GET
    /v1/collections/<id>/config``) and this watcher verifies them exactly as
    :class:`~.device.ConfigWatcher` does (pinned key, replay and ε-ceiling checks), so a
    compromised gateway cannot hand devices a forged mechanism.

    :meth:`start` fetches every collection once (an HTTP error raises :class:`GatewayError`),
    then re-fetches them every ``poll_s`` seconds."""

    def __init__(self, url: str, token: str, collections: Iterable[str], *,
                 poll_s: float = 60.0, timeout_s: float = 10.0, **kw: Any) -> None:
        self.url = url.rstrip("/")
        super().__init__(self.url, topic=f"{self.url}/v1/collections/<id>/config", **kw)
        self.token = token
        self.collections = frozenset(collections)
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self._session: Any = None

    async def start(self, timeout_s: float = 30.0) -> "GatewayConfigWatcher":
        self._session = _session(self.timeout_s)
        await self._fetch_all()
        self._task = asyncio.create_task(self._run(), name="ldp-gateway-config-watcher")
        return self

    async def _fetch_all(self) -> None:
        for cid in sorted(self.collections or ()):
            async with self._session.get(f"{self.url}/v1/collections/{cid}/config",
                                         headers={"Authorization": f"Bearer {self.token}"}
                                         ) as resp:
                if resp.status != 200:
                    raise await _gateway_error(resp)
                self._take(cid.encode("utf-8"), await resp.read())

    async def _run(self) -> None:
        import aiohttp

        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self._fetch_all()
            except (GatewayError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                log.warning("cannot refresh mechanism states from %s: %s", self.url, exc)

    async def stop(self) -> None:
        await super().stop()
        if self._session is not None:
            await self._session.close()
            self._session = None


class RecordingTransport:
    """Keep the batches in memory instead of sending them (dry runs: what would this device
    send?). ``batches`` holds the decoded :class:`~.codec.ReportBatch` objects."""

    def __init__(self) -> None:
        self.batches: list[ReportBatch] = []

    async def send(self, collection: str, batch: bytes, device_id: int) -> None:
        self.batches.append(decode_batch(batch))

    def reports(self) -> np.ndarray:
        """Every report sent so far, ``(n, width)``."""
        return np.concatenate([b.reports for b in self.batches]) if self.batches else \
            np.empty((0, 0), dtype=np.int64)

    async def flush(self) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass(frozen=True)
class ReportResult:
    """What became of one record: ``queued`` (randomized, buffered for sending), ``duplicate``
    (memoized record already reported in this rotation period: nothing sent, nothing spent) or
    ``refused`` (would break the budget: nothing sent, nothing spent; ``reason`` says why).
    ``epsilon`` is the ε the record cost."""

    status: Literal["queued", "duplicate", "refused"]
    epsilon: float
    version: int
    reason: str = ""
    report: np.ndarray | None = None
    #: the numeric attributes whose value was clipped into its range (docs/numeric.md)
    clipped: tuple[str, ...] = ()

    @property
    def sent(self) -> bool:
        return self.status == "queued"


class DeviceClient:
    """One device reporting to one collection.

    ``watcher`` must be started (its states are then current, see :meth:`ConfigWatcher.start`).
    ``batch_size`` reports are sent per message (and on :meth:`flush`); ``clock`` gives seconds
    since the epoch (rotation periods, budget windows). Whatever the watcher accepted, the client
    refuses (:class:`~.signing.StateRejected`) a state above ``max_epsilon`` per report (default
    :data:`~.device.DEFAULT_MAX_EPSILON`), an identity channel, and one older than the newest it
    adopted before (kept in the ledger: ``replayed``). With a ``credential`` (this device's own
    key, ``ldpstream device-credentials``; docs/credentials.md) every batch carries its fleet and
    MAC, and the device id is the credential's (docs/security.md "Per-device identity").
    """

    def __init__(self, collection: str, *, watcher: ConfigWatcher, transport: Transport,
                 ledger: Ledger, device_id: int = 0, batch_size: int = 100,
                 resend_every_s: float | None = None,
                 rng: np.random.Generator | DrawSource | None = None,
                 clock: Callable[[], float] = time.time,
                 max_epsilon: float = DEFAULT_MAX_EPSILON,
                 sequence: BatchSequence | None = None,
                 credential: DeviceCredential | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if credential is not None and device_id not in (0, credential.device_id):
            raise ValueError(f"device_id {device_id} is not the credential's "
                             f"{credential.device_id}")
        self.credential = credential
        if credential is not None:
            device_id = credential.device_id
        self.max_epsilon = float(max_epsilon)
        self._adopted: tuple[int, float] | None = None  # the state last checked (and recorded)
        self.collection = collection
        self.watcher = watcher
        self.transport = transport
        self.ledger = ledger
        self.device_id = int(device_id)
        self.batch_size = int(batch_size)
        self.resend_every_s = resend_every_s
        #: the draws of the randomization description (docs/device-protocol.md); numpy draws
        #: for the families it cannot express yet
        self.draws: DrawSource = (OsRandom() if rng is None else NumpyDraws(rng)
                                  if isinstance(rng, np.random.Generator) else rng)
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng()
        #: where batch sequence numbers come from: the ledger's (persisted with the ε spent), or
        #: a file of their own (a device without a ledger database)
        self.sequence = sequence
        self._programs: dict[tuple[str, int], Program | None] = {}
        self.clock = clock
        self._buffer: list[np.ndarray] = []
        self._version: int | None = None
        #: a batch formed (its key taken from the ledger) but not delivered yet: sent again
        #: unchanged, so the worker counts it once (docs/security.md "Idempotent batches")
        self._outgoing: tuple[bytes, int] | None = None
        self.sent_reports = 0
        self.sent_batches = 0
        #: per numeric attribute, how many reported values were clipped into its range (the
        #: count the server's quantize keeps: docs/numeric.md)
        self.clipped: dict[str, int] = {}

    async def __aenter__(self) -> "DeviceClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def mechanism(self) -> Mechanism:
        """The mechanism of the newest published version whose signature the watcher verified
        (:mod:`.signing`)."""
        mech = self.watcher.mechanisms.get(self.collection)
        if mech is None:
            summary = self.watcher.refusal_summary()
            refused = f"; refused records: {summary}" if summary else ""
            raise UnknownCollectionError(
                f"collection {self.collection!r} is not published on {self.watcher.topic} "
                f"(published: {', '.join(sorted(self.watcher.mechanisms)) or 'none'}{refused})")
        signed = self.watcher.states[self.collection]
        if signed.order != self._adopted:
            check_ceiling(signed, float(mech.epsilon), self.max_epsilon)
            kept = self.ledger.state_floor(self.collection)
            if kept is not None and signed.order < kept:
                raise StateRejected("replayed", f"version {signed.version} issued at "
                                                f"{signed.issued_at:.3f} is older than the newest "
                                                f"this device adopted ({kept[0]}, {kept[1]:.3f})")
            self.ledger.raise_state_floor(self.collection, signed.version, signed.issued_at)
            self._adopted = signed.order
        return mech

    async def report(self, record: Mapping[str, Any]) -> ReportResult:
        """Randomize and queue one record ``{attribute: category label}``."""
        return (await self.report_many([record]))[0]

    async def report_many(self, records: Iterable[Mapping[str, Any]] | Mapping[str, Any]
                          ) -> list[ReportResult]:
        """Randomize and queue records (rows ``{attribute: label}`` or one mapping of columns
        ``{attribute: [label, ...]}``); the whole call is checked against the schema first, so a
        bad record queues nothing. A transport error propagates: reports already queued stay
        buffered (and charged) and go out with the next :meth:`flush`."""
        mech = self.mechanism
        rows: list[tuple[Any, tuple[str, ...]]]
        if mech.domain.ranges is None:
            rows = [(x, ()) for x in mech.domain.encode(records)]
        else:
            rows = self._encode_numeric(mech, records)
        out = []
        for row, clipped in rows:
            res = self._randomize(mech, np.asarray(row, dtype=np.int64), self.clock())
            if res.report is not None:
                await self._queue(res.report, res.version)
                if clipped:
                    res = replace(res, clipped=clipped)
                    for a in clipped:
                        self.clipped[a] = self.clipped.get(a, 0) + 1
            out.append(res)
        return out

    def _encode_numeric(self, mech: Mechanism,
                        records: Iterable[Mapping[str, Any]] | Mapping[str, Any]
                        ) -> list[tuple[list[int], tuple[str, ...]]]:
        """Records of a domain with numeric attributes: labels and values → indices (a value
        clipped into its range and put on its grid, as every SDK does:
        docs/device-protocol.md), with the attributes clipped."""
        if isinstance(records, Mapping):
            cols = {a: list(v) for a, v in records.items()}
            n = len(next(iter(cols.values()))) if cols else 0
            rows: list[Mapping[str, Any]] = [{a: v[i] for a, v in cols.items()}
                                             for i in range(n)]
        else:
            rows = list(records)
        prog = self.program()
        if prog is not None:
            return [prog.encode_clipped(r) for r in rows]
        dom = mech.domain
        index = [{lab: i for i, lab in enumerate(dom.categories(a))} for a in dom.attrs]
        ranges = [None if dom.numeric_range(a) is None else
                  (*dom.numeric_range(a), dom.shape[j])  # type: ignore[misc]
                  for j, a in enumerate(dom.attrs)]
        return [encode_record(dom.attrs, index, ranges, r) for r in rows]

    def program(self) -> Program | None:
        """The randomization description of the state in force (None: the family has none); a
        description beyond the limits every SDK enforces is refused (:class:`StateRejected`
        ``unusable``, as the C and TypeScript SDKs refuse the state; docs/device-protocol.md,
        "Limits")."""
        signed = self.watcher.states.get(self.collection)
        if signed is None:
            return None
        key = (self.collection, signed.version)
        if key not in self._programs:
            raw = signed.state.get("device")
            try:
                prog = None if raw is None else Program(raw)
            except ProgramError as exc:
                raise StateRejected("unusable", f"version {signed.version}: {exc}") from None
            self._programs = {key: prog}
        return self._programs[key]

    def _randomize(self, mech: Mechanism, x: np.ndarray, now: float) -> ReportResult:
        """One record → its report, charged to the ledger (or why not)."""
        prog = self.program()
        if prog is not None and prog.memo is not None:
            return self._memoized(prog, prog.memo, mech.version, x, now)
        if prog is not None:
            refusal = self._refusal(prog.epsilon, now)
            if refusal is not None:
                return ReportResult("refused", 0.0, mech.version, refusal)
            report = np.asarray(prog.randomize([int(v) for v in x], self.draws, self.device_id),
                                dtype=np.int64)
            self.ledger.commit(self.collection, now, prog.epsilon)
            return ReportResult("queued", prog.epsilon, mech.version, report=report)
        memo = mech.memoization()
        if memo is None:
            cost = mech.epsilon
            refusal = self._refusal(cost, now)
            if refusal is not None:
                return ReportResult("refused", 0.0, mech.version, refusal)
            report = mech.randomize_device(x[None, :], np.array([self.device_id], np.uint64),
                                           self.rng)[0]
            self.ledger.commit(self.collection, now, cost)
            return ReportResult("queued", cost, mech.version, report=report)
        if memo.unit != "attribute":   # cluster and marginal memos exist as descriptions only
            return ReportResult("refused", 0.0, mech.version,
                                f"{mech.name} memoizes per {memo.unit}: its state carries no "
                                f"device description to run")
        period = self._period(memo.rule.period(now))
        fp = channel_fingerprint(memo.permanent)
        record = f"{fp}:" + ",".join(str(int(v)) for v in x)
        last = self.ledger.last_sent(self.collection, period, record)
        if last is not None and (self.resend_every_s is None or now - last < self.resend_every_s):
            return ReportResult("duplicate", 0.0, mech.version,
                                "this record was already reported in this rotation period")
        keys = [(j, int(v)) for j, v in enumerate(x)]
        have = self.ledger.memos(self.collection, fp, period, keys)
        missing = [k for k in keys if k not in have]
        cost = float(sum(ch.epsilon(memo.permanent[j]) for j, _ in missing))
        refusal = self._refusal(cost, now)
        if refusal is not None:
            return ReportResult("refused", 0.0, mech.version, refusal)
        new = {(j, v): int(ch.randomize(np.array([v]), memo.permanent[j], self.rng)[0])
               for j, v in missing}
        permanent = np.array([[have[k] if k in have else new[k] for k in keys]], dtype=np.int64)
        report = memo.instantaneous(permanent, self.rng)[0]
        self.ledger.commit(self.collection, now, cost, channel=fp, period=period, memos=new,
                           record=record)
        return ReportResult("queued", cost, mech.version, report=report)

    def _period(self, period: int) -> int:
        """The rotation period to memoize in: the clock's, or the newest one a memoized report
        was committed in when the clock stepped back (docs/device-protocol.md, "Ledger"), so
        the permanent responses of an older period are never drawn again."""
        newest = self.ledger.newest_period(self.collection)
        return period if newest is None or period >= newest else newest

    def _memoized(self, prog: Program, memo: Memo | PartitionMemo | SelectMemo, version: int,
                  x: np.ndarray, now: float) -> ReportResult:
        """A memoized description (docs/device-protocol.md, "Ledger"): permanent responses drawn
        once per rotation period (a clock stepped back keeps the newest period), a record sent
        once per period unless ``resend_every_s`` passed, only new draws charged (one per memo
        unit: attribute, cluster, or assigned marginal)."""
        period = self._period(memo.period(now))
        xr = memo.rounded([int(v) for v in x], self.device_id)   # what the memos are keyed by
        record = f"{memo.fingerprint}:" + ",".join(str(v) for v in xr)
        last = self.ledger.last_sent(self.collection, period, record)
        resend = self.resend_every_s
        if last is not None and (resend is None or resend <= 0 or now - last < resend):
            return ReportResult("duplicate", 0.0, version,
                                "this record was already reported in this rotation period")
        keys = memo.keys(xr, self.device_id, period)
        have = self.ledger.memos(self.collection, memo.fingerprint, period, keys)
        missing = list(dict.fromkeys(k for k in keys if k not in have))
        cost = float(sum(memo.epsilon_of(k) for k in missing))
        refusal = self._refusal(cost, now)
        if refusal is not None:
            return ReportResult("refused", 0.0, version, refusal)
        new = {k: memo.draw(k, self.draws) for k in missing}
        values = [have[k] if k in have else new[k] for k in keys]
        if isinstance(memo, (PartitionMemo, SelectMemo)):
            report = memo.report(keys, values, self.draws)
        else:
            permanent = memo.permanent_record(values)
            report = prog.randomize(permanent, self.draws) if prog.steps else permanent
        self.ledger.commit(self.collection, now, cost, channel=memo.fingerprint, period=period,
                           memos=new, record=record)
        return ReportResult("queued", cost, version, report=np.asarray(report, dtype=np.int64))

    def _refusal(self, cost: float, now: float) -> str | None:
        """Why the ledger refuses a report costing ``cost``: the device's own budget, or the
        collection's ``max_epsilon_per_day`` from its signed state (docs/privacy-over-time.md)."""
        signed = self.watcher.states.get(self.collection)
        per_day = None if signed is None else signed.state.get(BUDGET_FIELD)
        return self.ledger.refusal(cost, now) or (
            None if per_day is None else
            self.ledger.daily_refusal(self.collection, cost, now, float(per_day)))

    async def _queue(self, report: np.ndarray, version: int) -> None:
        if self._version is not None and version != self._version:
            await self._send()
        self._version = version
        self._buffer.append(report)
        if len(self._buffer) >= self.batch_size:
            await self._send()

    async def _send(self) -> None:
        """Deliver the batch in flight (if a previous send failed), then the buffer as a new
        batch keyed (device id, next sequence number of the ledger)."""
        for _ in range(2):
            if self._outgoing is None:
                if not self._buffer:
                    return
                assert self._version is not None
                reports = np.stack(self._buffer)
                seq = (self.sequence.take() if self.sequence is not None
                       else self.ledger.next_sequence(self.device_id))
                key = (self.device_id, seq)
                self._outgoing = (encode_batch(
                    self.collection, self._version, reports, sent_at=self.clock(), key=key,
                    device_ids=np.full(len(reports), self.device_id, dtype=np.uint64),
                    auth=None if self.credential is None else
                    (self.credential.fleet, self.credential.key)),
                    len(reports))
                self._buffer = []
            payload, n = self._outgoing
            await self.transport.send(self.collection, payload, self.device_id)
            self._outgoing = None
            self.sent_reports += n
            self.sent_batches += 1

    async def flush(self) -> None:
        """Send what is buffered and wait until the transport has delivered it."""
        await self._send()
        await self.transport.flush()

    async def close(self) -> None:
        """Flush and close the transport (the watcher and ledger belong to the caller)."""
        await self.flush()
        await self.transport.close()
