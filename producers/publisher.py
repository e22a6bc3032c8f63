"""Publishing report batches to Kafka with aiokafka (device side).

One :class:`Publisher` wraps an :class:`aiokafka.AIOKafkaProducer` tuned for report batches:
compression (lz4 when aiokafka's codec supports it, else gzip), a small linger so concurrent
batches share produce requests, and back-pressure: at most ``max_in_flight`` unacknowledged
messages, so a fast fleet never queues unbounded memory. :meth:`Publisher.flush` waits until every
message sent so far is acknowledged (or raises the first delivery error).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from ldpstream.producers.kafka_security import KafkaSecurity, kafka_security

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


class Publisher:
    """Send report-batch messages (bytes) to Kafka topics.

    ``compression``: ``"auto"`` (lz4, else gzip), ``None``/``"none"``, or an aiokafka codec name;
    ``security``: TLS/SASL (default: from the environment, producers/kafka_security.py).
    """

    def __init__(self, bootstrap: str, *, compression: str | None = "auto", linger_ms: int = 5,
                 max_request_size: int = DEFAULT_MAX_REQUEST, acks: Any = "all",
                 max_in_flight: int = 2000, client_id: str = "ldpstream-producer",
                 security: KafkaSecurity | None = None) -> None:
        self.bootstrap = bootstrap
        self.security = security if security is not None else kafka_security()
        if compression == "auto":
            compression = default_compression()
        self.compression = None if compression in (None, "none") else compression
        self.linger_ms = linger_ms
        self.max_request_size = max_request_size
        self.acks = acks
        self.client_id = client_id
        self._producer = None
        self._pending: set[asyncio.Future] = set()
        self._sem = asyncio.Semaphore(max_in_flight)
        self._error: BaseException | None = None
        self.sent_messages = 0
        self.acked_messages = 0

    async def start(self, timeout_s: float = 30.0) -> "Publisher":
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import KafkaError

        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap, compression_type=self.compression,
                linger_ms=self.linger_ms, max_request_size=self.max_request_size, acks=self.acks,
                client_id=self.client_id, max_batch_size=max(16384, min(self.max_request_size,
                                                                        1024 * 1024)),
                **self.security.client_kwargs())
            try:
                await producer.start()
                break
            except KafkaError as exc:
                await producer.stop()
                if asyncio.get_running_loop().time() > deadline:
                    raise PublishError(f"cannot reach Kafka at {self.bootstrap}: {exc}") from None
                await asyncio.sleep(0.5)
        self._producer = producer
        return self

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
