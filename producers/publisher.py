"""Publishing report batches to Kafka with aiokafka (device side).

One :class:`Publisher` wraps an :class:`aiokafka.AIOKafkaProducer` tuned for report batches:
compression (lz4 when aiokafka's codec supports it, else gzip), a small linger so concurrent
batches share produce requests, and back-pressure: at most ``max_in_flight`` unacknowledged
messages, so a fast fleet never queues unbounded memory. :meth:`Publisher.flush` waits until every
message sent so far is acknowledged (or raises the first delivery error).

Idempotence (docs/pipeline.md "Failover"): a batch the leader wrote but could not acknowledge
before it died is sent again by the producer; an idempotent producer (Kafka's producer id and
per-partition sequence numbers) lets the new leader drop that copy. ``LDP_KAFKA_IDEMPOTENCE``:
``auto`` (default) asks for it and, when the broker refuses ``InitProducerId`` (the embedded
Tansu 0.6 does), publishes without it and says so in a warning and :attr:`Publisher.idempotent`;
``on`` fails instead; ``off`` never asks.
"""
from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any, Mapping

from ldpstream.names import ENV_KAFKA_IDEMPOTENCE
from ldpstream.producers.kafka_security import KafkaSecurity, kafka_security

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST = 4 * 1024 * 1024


def default_compression() -> str:
    """``"lz4"`` when aiokafka can compress with it (needs ``cramjam``), else ``"gzip"``."""
    try:
        from aiokafka.codec import has_lz4
        if has_lz4():
            return "lz4"
    except ImportError:  # pragma: no cover - very old aiokafka
        pass
    return "gzip"


class PublishError(RuntimeError):
    """A report batch could not be delivered to Kafka."""


IDEMPOTENCE_MODES = ("auto", "on", "off")


def idempotence_mode(env: Mapping[str, str] | None = None) -> str:
    """``LDP_KAFKA_IDEMPOTENCE`` of ``env`` (default: the process's): auto, on or off."""
    value = (os.environ if env is None else env).get(ENV_KAFKA_IDEMPOTENCE, "").strip().lower()
    if value and value not in IDEMPOTENCE_MODES:
        raise PublishError(f"{ENV_KAFKA_IDEMPOTENCE} must be one of {', '.join(IDEMPOTENCE_MODES)}"
                           f", got {value!r}")
    return value or "auto"


class Publisher:
    """Send report-batch messages (bytes) to Kafka topics.

    ``compression``: ``"auto"`` (lz4, else gzip), ``None``/``"none"``, or an aiokafka codec name;
    ``security``: TLS/SASL (default: from the environment, producers/kafka_security.py);
    ``idempotence``: auto, on or off (default: ``LDP_KAFKA_IDEMPOTENCE``, else auto; it needs
    ``acks="all"``). After :meth:`start`, :attr:`idempotent` says whether the producer is.
    ``request_timeout_ms``: a produce request unanswered this long is sent again (aiokafka's).
    """

    def __init__(self, bootstrap: str, *, compression: str | None = "auto", linger_ms: int = 5,
                 max_request_size: int = DEFAULT_MAX_REQUEST, acks: Any = "all",
                 max_in_flight: int = 2000, client_id: str = "ldpstream-producer",
                 security: KafkaSecurity | None = None, idempotence: str | None = None,
                 request_timeout_ms: int = 40_000) -> None:
        self.bootstrap = bootstrap
        self.idempotence = idempotence_mode() if idempotence is None else idempotence
        if self.idempotence not in IDEMPOTENCE_MODES:
            raise PublishError(f"idempotence must be one of {', '.join(IDEMPOTENCE_MODES)}, "
                               f"got {self.idempotence!r}")
        if self.idempotence == "on" and acks not in ("all", -1):
            raise PublishError(f"an idempotent producer ({ENV_KAFKA_IDEMPOTENCE}=on) needs "
                               f"acks='all', got acks={acks!r}")
        #: whether the started producer is idempotent (None: not started)
        self.idempotent: bool | None = None
        self.security = security if security is not None else kafka_security()
        if compression == "auto":
            compression = default_compression()
        self.compression = None if compression in (None, "none") else compression
        self.linger_ms = linger_ms
        self.max_request_size = max_request_size
        self.acks = acks
        self.client_id = client_id
        self.request_timeout_ms = int(request_timeout_ms)
        self._producer: AIOKafkaProducer | None = None
        self._pending: set[asyncio.Future] = set()
        self._sem = asyncio.Semaphore(max_in_flight)
        self._error: BaseException | None = None
        self.sent_messages = 0
        self.acked_messages = 0

    async def start(self, timeout_s: float = 30.0) -> "Publisher":
        from aiokafka.errors import KafkaConnectionError, KafkaError

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        want = self.idempotence != "off" and self.acks in ("all", -1)
        while True:
            producer = self._make_producer(idempotent=want)
            try:
                # InitProducerId is retried inside start() while no broker answers it
                await asyncio.wait_for(producer.start(), max(1.0, deadline - loop.time()))
                break
            except asyncio.TimeoutError:
                await producer.stop()
                raise PublishError(f"cannot start a producer on Kafka at {self.bootstrap} "
                                   f"within {timeout_s:g} s") from None
            except KafkaError as exc:
                await producer.stop()
                if want and not isinstance(exc, KafkaConnectionError):
                    # the broker answered but refused InitProducerId (or is older than 0.11)
                    if self.idempotence == "on":
                        raise PublishError(
                            f"the broker at {self.bootstrap} refuses an idempotent producer "
                            f"({ENV_KAFKA_IDEMPOTENCE}=on): {exc!r}") from None
                    log.warning("publisher: the broker at %s refuses an idempotent producer "
                                "(%r); publishing without: a batch retried after a leader "
                                "failover may be written twice (%s=off silences this)",
                                self.bootstrap, exc, ENV_KAFKA_IDEMPOTENCE)
                    want = False
                    continue
                if loop.time() > deadline:
                    raise PublishError(f"cannot reach Kafka at {self.bootstrap}: {exc}") from None
                await asyncio.sleep(0.5)
        self._producer = producer
        self.idempotent = want
        return self

    def _make_producer(self, *, idempotent: bool) -> "AIOKafkaProducer":
        from aiokafka import AIOKafkaProducer

        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, compression_type=self.compression,
            linger_ms=self.linger_ms, max_request_size=self.max_request_size, acks=self.acks,
            client_id=self.client_id, enable_idempotence=idempotent,
            request_timeout_ms=self.request_timeout_ms,
            max_batch_size=max(16384, min(self.max_request_size, 1024 * 1024)),
            **self.security.client_kwargs())

    async def __aenter__(self) -> "Publisher":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def send(self, topic: str, value: bytes, *, key: bytes | None = None,
                   partition: int | None = None) -> asyncio.Future:
        """Queue one message; returns the delivery future (awaiting it is optional: :meth:`flush`
        waits for all). Blocks while ``max_in_flight`` messages are unacknowledged."""
        if self._producer is None:
            raise PublishError("publisher not started")
        if self._error is not None:
            raise PublishError(f"an earlier message was not delivered: {self._error}")
        await self._sem.acquire()
        try:
            fut = await self._producer.send(topic, value, key=key, partition=partition)
        except BaseException:
            self._sem.release()
            raise
        self.sent_messages += 1
        self._pending.add(fut)
        fut.add_done_callback(self._done)
        return fut

    async def partition_count(self, topic: str) -> int:
        """The partitions ``topic`` has on the broker (waits for its metadata, as a send does)."""
        if self._producer is None:
            raise PublishError("publisher not started")
        return len(await self._producer.partitions_for(topic))

    def _done(self, fut: asyncio.Future) -> None:
        self._pending.discard(fut)
        self._sem.release()
        if fut.cancelled():
            self._error = self._error or PublishError("send cancelled")
        elif fut.exception() is not None:
            self._error = self._error or fut.exception()
        else:
            self.acked_messages += 1

    async def send_and_wait(self, topic: str, value: bytes, *, key: bytes | None = None,
                            partition: int | None = None):
        """Send one message and wait for its acknowledgement (returns aiokafka RecordMetadata)."""
        fut = await self.send(topic, value, key=key, partition=partition)
        return await fut

    async def flush(self) -> None:
        """Wait until every message sent so far is acknowledged; raise the first delivery error."""
        if self._producer is not None:
            await self._producer.flush()
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        if self._error is not None:
            raise PublishError(f"message not delivered: {self._error}")

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await producer.flush()
            finally:
                await producer.stop()
