"""Runtime Kafka administration through aiokafka: create the topics (docs/pipeline.md, "What runs")
and probe a broker for ``/healthz`` (docs/api.md, "Endpoints"). One path for plaintext, TLS and SASL: every
client takes :func:`~ldpstream.producers.kafka_security.kafka_security` (docs/security.md)."""
from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from typing import Awaitable, Callable, Collection, Iterable, Mapping, Protocol, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError

from ldpstream.errors import ServiceError
from ldpstream.names import COMPACTED_TOPICS, SERVICE_TOPICS
from ldpstream.producers.kafka_security import KafkaSecurity, kafka_security

__all__ = ["TOPIC_REPLICATION_ENV", "create_topics", "create_ldp_topics", "broker_ok", "BrokerProbe",
           "blocking"]

T = TypeVar("T")


async def broker_ok(bootstrap: str, security: KafkaSecurity,
                    timeout_s: float = 2.0) -> tuple[bool, str]:
    """(ok, detail): a metadata request to ``bootstrap`` (``host:port[,host:port]``) over
    ``security`` answered and listed at least one broker. Raises the client's error (e.g.
    :class:`~aiokafka.errors.KafkaConnectionError`) when no bootstrap server answers."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                            **security.client_kwargs())
    try:
        await asyncio.wait_for(client.bootstrap(), 2 * timeout_s)
        brokers = len(client.cluster.brokers())
        return brokers > 0, f"{brokers} broker(s) answered metadata ({security.describe()})"
    finally:
        await client.close()


class BrokerProbe:
    """:func:`broker_ok` for a health endpoint polled often: one probe at a time, its answer (or
    error) reused for ``max_age_s``, so a tight poll loop does not open a client per request."""

    def __init__(self, bootstrap: str, security: KafkaSecurity, timeout_s: float = 2.0,
                 max_age_s: float = 1.0) -> None:
        self.bootstrap, self.security = bootstrap, security
        self.timeout_s, self.max_age_s = timeout_s, max_age_s
        self._at = -math.inf
        self._answer: tuple[bool, str] | BaseException = (False, "not probed yet")
        self._lock = asyncio.Lock()

    async def check(self) -> tuple[bool, str]:
        """(ok, detail) of a probe at most ``max_age_s`` old; re-raises the probe's error."""
        async with self._lock:
            if time.monotonic() - self._at >= self.max_age_s:
                try:
                    self._answer = await broker_ok(self.bootstrap, self.security, self.timeout_s)
                except Exception as exc:  # noqa: BLE001 - kept, re-raised to every caller
                    self._answer = exc
                self._at = time.monotonic()
        if isinstance(self._answer, BaseException):
            raise self._answer
        return self._answer


def blocking(make: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine ``make()`` to completion on a private event loop in a thread, so a
    blocking caller may also sit inside a running loop; its exception is re-raised."""
    result: list[T] = []
    error: list[BaseException] = []

    async def main() -> T:
        return await make()

    def run() -> None:
        try:
            result.append(asyncio.run(main()))
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            error.append(exc)

    t = threading.Thread(target=run, name="ldpstream-kafka-admin")
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


TOPIC_REPLICATION_ENV = "LDP_TOPIC_REPLICATION"


async def create_topics(bootstrap: str, topics: Mapping[str, int],
                        compacted: Collection[str] = (), *, replication: int | None = None,
                        timeout_s: float = 30.0) -> list[str]:
    """Create the missing topics (``{name: partitions}``); topics in ``compacted`` get
    ``cleanup.policy=compact``. Existing topics are left as they are. Returns the names created.
    ``replication`` (copies of each partition) defaults to ``$LDP_TOPIC_REPLICATION`` or 1 (one
    embedded broker); a 3-broker Kafka wants 3.

    Tansu accepts and records ``cleanup.policy=compact`` (DescribeConfigs returns it).
    """

    if replication is None:
        raw = os.environ.get(TOPIC_REPLICATION_ENV, "1")
        if not raw.isdigit() or int(raw) < 1:
            raise ServiceError(f"{TOPIC_REPLICATION_ENV}: must be an integer >= 1 (got {raw!r})")
        replication = int(raw)

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                                **kafka_security().client_kwargs())
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await admin.start()
            break
        except KafkaError as exc:
            if time.monotonic() > deadline:
                raise ServiceError(f"cannot reach Kafka at {bootstrap}: {exc}") from None
            await asyncio.sleep(0.5)
    try:
        existing = set(await admin.list_topics())
        todo = [NewTopic(name, int(parts), replication,
                         topic_configs={"cleanup.policy": "compact"} if name in compacted else {})
                for name, parts in topics.items() if name not in existing]
        if not todo:
            return []
        resp = await admin.create_topics(todo)
        created: list[str] = []
        for err in resp.topic_errors:
            name, code, message = err[0], err[1], (err[2] if len(err) > 2 else None)
            if code == 0:
                created.append(name)
            elif code != 36:  # TOPIC_ALREADY_EXISTS: someone else was quicker
                raise ServiceError(f"create topic {name!r} on {bootstrap}: error {code} {message}")
        return created
    finally:
        await admin.close()


class _HasTopic(Protocol):
    @property
    def topic(self) -> str: ...

    @property
    def partitions(self) -> int: ...


async def create_ldp_topics(bootstrap: str, collections: Iterable[_HasTopic]) -> list[str]:
    """Create every topic ldpstream uses: each collection's reports topic with its partitions,
    ``ldp.dlq`` and the compacted ``ldp.config`` (docs/pipeline.md, "What runs")."""
    topics = {c.topic: int(c.partitions) for c in collections} | SERVICE_TOPICS
    return await create_topics(bootstrap, topics, compacted=COMPACTED_TOPICS)
