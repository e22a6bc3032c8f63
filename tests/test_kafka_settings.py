"""Broker-side defences (ldpstream/data/kafka-broker.properties) enforced by Apache Kafka, and the
compose files running the same Kafka version with the same settings and ACLs as the test fixture
(docs/security.md, "Broker-side defences")."""
from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
import yaml

from ldpstream.dev.kafka import KAFKA_VERSION, broker_defences
from ldpstream.kafka_acls import ACLS

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ("docker-compose.yml", "docker-compose.cluster.yml")


def _kafka_services(name: str) -> dict[str, dict]:
    doc = yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))
    return {k: v for k, v in doc["services"].items()
            if str(v.get("image", "")).startswith("apache/kafka:")}


def _env_name(key: str) -> str:
    """The apache/kafka image's variable for a server.properties key."""
    return "KAFKA_" + key.upper().replace(".", "_")


@pytest.mark.parametrize("name", COMPOSE)
def test_compose_runs_the_fixture_kafka_version_and_broker_settings(name):
    services = _kafka_services(name)
    assert services
    for svc_name, svc in services.items():
        assert svc["image"] == f"apache/kafka:{KAFKA_VERSION}", (name, svc_name)
        if "environment" not in svc or not any(k.startswith("KAFKA_PROCESS_ROLES")
                                               for k in svc["environment"]):
            continue  # a one-shot tool container (ACLs), not a broker
        env = {k: str(v) for k, v in svc["environment"].items()}
        for key, value in broker_defences().items():
            assert env.get(_env_name(key)) == value, (name, svc_name, key)


@pytest.mark.parametrize("name", COMPOSE)
def test_compose_acl_job_creates_exactly_the_fixture_acls(name):
    services = _kafka_services(name)
    script = "\n".join(services["kafka-acls"]["command"])
    lines = [line.split("$$acl", 1)[1].split() for line in script.splitlines()
             if line.strip().startswith("$$acl")]
    want = [acl.command_args()[2:] for acl in ACLS]    # without "--add --force"
    assert lines == want


def test_fixture_pom_pins_the_same_kafka_version():
    from ldpstream.dev.kafka import POM

    pom = POM.read_text(encoding="utf-8")
    assert re.search(r"<kafka.version>([^<]+)</kafka.version>", pom).group(1) == KAFKA_VERSION


@pytest.mark.kafka
def test_broker_refuses_far_future_backdated_and_oversized_records(apache_kafka, unique_name):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import InvalidTimestampError, MessageSizeTooLargeError

    from ldpstream.kafka_admin import create_topics

    topic = f"ldp.reports.{unique_name}"
    defences = broker_defences()
    after = int(defences["log.message.timestamp.after.max.ms"])
    before = int(defences["log.message.timestamp.before.max.ms"])
    max_bytes = int(defences["message.max.bytes"])

    async def run():
        await create_topics(apache_kafka.bootstrap, {topic: 1})
        # the client-side size check is lifted: the broker's limit is the one tested
        producer = AIOKafkaProducer(bootstrap_servers=apache_kafka.bootstrap, acks="all",
                                    max_request_size=4 * max_bytes, max_batch_size=4 * max_bytes)
        await producer.start()
        try:
            now = int(time.time() * 1000)
            ok = await producer.send_and_wait(topic, b"now", timestamp_ms=now)
            inside = await producer.send_and_wait(topic, b"a day old", timestamp_ms=now - 86_400_000)
            assert (ok.offset, inside.offset) == (0, 1)
            for stamp in (now + after + 600_000, now - before - 600_000):
                with pytest.raises(InvalidTimestampError):
                    await producer.send_and_wait(topic, b"x", timestamp_ms=stamp)
            with pytest.raises(MessageSizeTooLargeError):
                await producer.send_and_wait(topic, b"\0" * (max_bytes + 1024))
            end = await producer.send_and_wait(topic, b"after the refusals")
            assert end.offset == 2          # nothing refused was written
        finally:
            await producer.stop()

    asyncio.run(run())


@pytest.mark.kafka
def test_client_id_quota_throttles_that_client_only(apache_kafka, unique_name):
    """A producer_byte_rate quota on one client id: its 480 KiB take the broker's throttle time
    (rate over the 10 s quota window 48 KiB/s against 32 KiB/s: about 5 s); the same bytes from
    another client id are not held back."""
    import os
    import uuid

    from aiokafka import AIOKafkaProducer

    from ldpstream.kafka_admin import create_topics

    topic = f"ldp.reports.{unique_name}"
    limited = f"device-{uuid.uuid4().hex[:8]}"
    apache_kafka.set_client_quota(limited, producer_byte_rate=32 * 1024)
    payloads = [os.urandom(16 * 1024) for _ in range(30)]

    async def send(client_id: str) -> float:
        producer = AIOKafkaProducer(bootstrap_servers=apache_kafka.bootstrap,
                                    client_id=client_id, acks=1)
        await producer.start()
        try:
            t0 = time.monotonic()
            for value in payloads:
                await producer.send_and_wait(topic, value)
            return time.monotonic() - t0
        finally:
            await producer.stop()

    async def run() -> tuple[float, float]:
        await create_topics(apache_kafka.bootstrap, {topic: 1})
        return await send(limited), await send(f"other-{uuid.uuid4().hex[:8]}")

    throttled, free = asyncio.run(run())
    assert throttled >= 2.5, (throttled, free)
    assert free < throttled / 2, (throttled, free)


@pytest.mark.kafka
def test_a_broker_that_fails_to_start_names_its_log():
    from ldpstream.dev.kafka import ApacheKafka
    from ldpstream.errors import ServiceError

    kafka = ApacheKafka(overrides={"authorizer.class.name": "org.example.NoSuchAuthorizer"},
                        startup_timeout=90)
    with pytest.raises(ServiceError) as err:
        kafka.start()
    log = re.search(r"log (\S+\.log)", str(err.value)).group(1)
    assert "NoSuchAuthorizer" in Path(log).read_text(encoding="utf-8", errors="replace")
    assert not kafka.nodes
    Path(log).unlink()
