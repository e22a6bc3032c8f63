"""Security for real, on Apache Kafka: the client listener takes SASL_SSL only (SCRAM-SHA-512,
certificates of a test CA with host name verification), the StandardAuthorizer enforces the ACLs
of ldpstream/kafka_acls.py (created with Kafka's AclCommand). A worker and a device fleet do their
jobs as their principals (every report counted, exactly); a device writing ldp.config, reading the
reports or the dead letters is refused; a wrong password or a wrong host name never connects."""
from __future__ import annotations

import asyncio
import socket
import ssl
import uuid

import pytest
from conftest import write_config
from kafka_counts import assert_counted

pytestmark = [pytest.mark.pipeline, pytest.mark.kafka]



def _as(kafka, who, monkeypatch) -> dict:
    """Point this process's Kafka clients at ``kafka`` as principal ``who``; returns aiokafka
    keyword arguments for the same."""
    from ldpstream.producers.kafka_security import kafka_security

    env = kafka.client_env(who)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return kafka_security(env).client_kwargs()


def test_worker_and_device_fleet_do_their_jobs_over_sasl_ssl(
        tmp_path, secure_kafka, redis_server, service_env, spawn_worker, unique_name, monkeypatch):
    from ldpstream.config import load_config
    from ldpstream.producers.fleet import run_fleet

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, partitions=2)
    coll = load_config(path).collections[cid]
    env = dict(service_env, KAFKA_BOOTSTRAP_SERVERS=secure_kafka.bootstrap,
               LDP_APP_ID=f"ldpstream-acl-{uuid.uuid4().hex[:8]}",
               **secure_kafka.client_env(secure_kafka.worker))
    worker = spawn_worker(path, env)
    worker.wait_ready(90)
    _as(secure_kafka, secure_kafka.device, monkeypatch)

    async def run():
        stats = await run_fleet(secure_kafka.bootstrap, coll, rate=0, total=6000, batch=200,
                                seed=3, keep_counts=True, config_timeout_s=60.0)
        await assert_counted(redis_server.url, coll, stats.counts, 6000, worker.log_tail)

    asyncio.run(run())
    health = worker.get("/healthz")
    assert "SASL_SSL" in health and "worker" in health, health


def test_device_is_refused_what_it_must_not_do(secure_kafka, monkeypatch, unique_name, caplog):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.errors import TopicAuthorizationFailedError

    from ldpstream.kafka_admin import create_topics
    from ldpstream.names import CONFIG_TOPIC, DLQ_TOPIC
    from ldpstream.names import reports_topic as report_topic

    topic = report_topic(unique_name)
    admin_kw = _as(secure_kafka, secure_kafka.admin, monkeypatch)
    asyncio.run(create_topics(secure_kafka.bootstrap, {topic: 1, DLQ_TOPIC: 1, CONFIG_TOPIC: 1},
                              compacted={CONFIG_TOPIC}))
    device_kw = _as(secure_kafka, secure_kafka.device, monkeypatch)

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=secure_kafka.bootstrap, **device_kw)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"allowed")      # its own job
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait(CONFIG_TOPIC, b"forged state", key=b"x")
        finally:
            await producer.stop()
        # the report topic: Describe is allowed (devices write it), the fetch is refused
        consumer = AIOKafkaConsumer(bootstrap_servers=secure_kafka.bootstrap, group_id=None,
                                    auto_offset_reset="earliest", **device_kw)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            with pytest.raises(TopicAuthorizationFailedError):
                await asyncio.wait_for(consumer.getmany(timeout_ms=5000), 30)
        finally:
            await consumer.stop()
        # the dead letters: not even described; aiokafka logs the broker's
        # TOPIC_AUTHORIZATION_FAILED answer to its metadata request and fetches nothing
        caplog.clear()
        consumer = AIOKafkaConsumer(bootstrap_servers=secure_kafka.bootstrap, group_id=None,
                                    auto_offset_reset="earliest", **device_kw)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(DLQ_TOPIC, 0)])
            assert await consumer.getmany(timeout_ms=4000) == {}
        finally:
            await consumer.stop()
        assert any(f"Topic {DLQ_TOPIC} is not authorized" in r.getMessage()
                   for r in caplog.records), caplog.text[-2000:]
        # ... while the admin sees the device's one record in the report topic
        consumer = AIOKafkaConsumer(bootstrap_servers=secure_kafka.bootstrap, group_id=None,
                                    auto_offset_reset="earliest", **admin_kw)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            msg = await asyncio.wait_for(consumer.getone(), 30)
            assert msg.value == b"allowed"
        finally:
            await consumer.stop()

    asyncio.run(run())


def test_wrong_password_and_wrong_host_name_never_connect(secure_kafka, monkeypatch):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    from ldpstream.dev.kafka import Principal
    from ldpstream.producers.kafka_security import kafka_security

    bad = kafka_security(secure_kafka.client_env(Principal("device", "not-the-password")))

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=secure_kafka.bootstrap,
                                    request_timeout_ms=5000, **bad.client_kwargs())
        with pytest.raises(KafkaError):
            await asyncio.wait_for(producer.start(), 30)
        await producer.stop()

    asyncio.run(run())
    # the clients' TLS context verifies the broker's certificate against the CA *and* the name
    ctx = bad.ssl_context()
    host, port = secure_kafka.bootstrap.split(",")[0].rsplit(":", 1)
    for name, ok in (("localhost", True), ("127.0.0.1", True), ("broker.example", False)):
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            if ok:
                with ctx.wrap_socket(raw, server_hostname=name) as tls:
                    assert tls.version() in ("TLSv1.2", "TLSv1.3")
            else:
                with pytest.raises(ssl.SSLCertVerificationError, match="match|mismatch"):
                    ctx.wrap_socket(raw, server_hostname=name)
