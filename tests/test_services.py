"""Embedded Redis and Tansu broker: start, use for real, restart, stop without orphans."""
from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from ldpstream.dev.broker import EmbeddedBroker
from ldpstream.dev.process import find_redis_server, find_tansu, free_port
from ldpstream.dev.redis import EmbeddedRedis
from ldpstream.errors import ServiceError
from ldpstream.kafka_admin import blocking, broker_ok, create_topics
from ldpstream.producers.kafka_security import KafkaSecurity

pytestmark = pytest.mark.pipeline


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); check its state
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_free_port_is_bindable():
    p = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


def test_binaries_found():
    assert os.access(find_redis_server(), os.X_OK)
    assert os.access(find_tansu(), os.X_OK)


def test_redis_restart_keeps_data_and_stop_leaves_nothing():
    import redis

    r = EmbeddedRedis()
    url = r.start()
    assert url == f"redis://127.0.0.1:{r.port}/0"
    pid, port, data_dir = r.pid, r.port, r.data_dir
    client = redis.Redis.from_url(url)
    client.set("k", b"v1")
    client.bitfield("t").incrby("i64", "#3", 42).execute()
    client.close()
    r.restart()
    assert r.port == port and r.pid != pid and not _alive(pid)
    client = redis.Redis.from_url(r.url)
    assert client.get("k") == b"v1"
    assert client.bitfield("t").get("i64", "#3").execute() == [42]
    client.close()
    pid2 = r.pid
    r.stop()
    assert not _alive(pid2)
    assert not _port_open(port)
    assert not os.path.exists(data_dir)  # temp dir removed on the final stop
    r.stop()  # idempotent


def test_redis_explicit_data_dir_survives_new_instance(tmp_path):
    import redis

    with EmbeddedRedis(data_dir=str(tmp_path)) as r:
        redis.Redis.from_url(r.url).set("x", "1")
    assert (tmp_path).exists()
    with EmbeddedRedis(data_dir=str(tmp_path)) as r2:
        assert redis.Redis.from_url(r2.url).get("x") == b"1"


def test_clear_error_when_binary_fails(tmp_path):
    bad = tmp_path / "fake-redis"
    bad.write_text("#!/bin/sh\necho 'boom: cannot start' >&2\nexit 3\n")
    bad.chmod(0o755)
    r = EmbeddedRedis(binary=str(bad))
    with pytest.raises(ServiceError, match=r"(?s)exited with code 3.*boom"):
        r.start()
    assert r.log_path and os.path.exists(r.log_path) and r.data_dir is None
    r.stop()  # drops the kept log
    assert r.log_path is None


def test_missing_binary_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("LDP_REDIS_SERVER", "/nonexistent/redis-server")
    with pytest.raises(ServiceError, match="LDP_REDIS_SERVER"):
        find_redis_server()


def test_broker_produce_consume_group_commit():
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    broker = EmbeddedBroker()
    bootstrap = broker.start()
    pid, port = broker.pid, broker.port
    ok, detail = blocking(lambda: broker_ok(bootstrap, KafkaSecurity()))
    assert ok, detail
    try:
        created = broker.create_topics({"ldp.reports.t": 3, "ldp.config": 1}, compacted={"ldp.config"})
        assert sorted(created) == ["ldp.config", "ldp.reports.t"]
        assert broker.create_topics({"ldp.reports.t": 3}) == []  # idempotent

        async def scenario() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                desc = await admin.describe_topics(["ldp.reports.t"])
                assert len(desc[0]["partitions"]) == 3
                cfg = await admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, "ldp.config")])
                entries = {e[0]: e[1] for e in cfg[0].resources[0][4]}
                assert entries.get("cleanup.policy") == "compact"
            finally:
                await admin.close()
            assert await create_topics(bootstrap, {"ldp.dlq": 1}) == ["ldp.dlq"]

            prod = AIOKafkaProducer(bootstrap_servers=bootstrap)
            await prod.start()
            try:
                for i in range(9):
                    await prod.send_and_wait("ldp.reports.t", f"m{i}".encode(), partition=i % 3)
            finally:
                await prod.stop()

            cons = AIOKafkaConsumer("ldp.reports.t", bootstrap_servers=bootstrap, group_id="g",
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    session_timeout_ms=6000, heartbeat_interval_ms=1000)
            await cons.start()
            try:
                got: list[bytes] = []
                deadline = time.monotonic() + 30
                while len(got) < 9 and time.monotonic() < deadline:
                    for _, msgs in (await cons.getmany(timeout_ms=500)).items():
                        got += [m.value for m in msgs]
                assert sorted(got) == sorted(f"m{i}".encode() for i in range(9))
                await cons.commit()
                for p in range(3):
                    assert await cons.committed(TopicPartition("ldp.reports.t", p)) == 3
            finally:
                await cons.stop()

        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        broker.stop()
    assert not _alive(pid)
    assert not _port_open(port)


def test_broker_probe_answers_and_reuses_its_answer(kafka_broker):
    """/healthz's broker check: a real answer from the broker, one probe per max_age_s (a dead
    address raises the same error again without a second connection attempt)."""
    from aiokafka.errors import KafkaConnectionError

    from ldpstream.kafka_admin import BrokerProbe

    async def scenario() -> None:
        probe = BrokerProbe(kafka_broker.bootstrap, KafkaSecurity(), timeout_s=2.0, max_age_s=60.0)
        ok, detail = await probe.check()
        assert ok and "answered metadata" in detail
        assert await probe.check() == (ok, detail)
        dead = BrokerProbe(f"127.0.0.1:{free_port()}", KafkaSecurity(), timeout_s=1.0,
                           max_age_s=60.0)
        with pytest.raises(KafkaConnectionError) as first:
            await dead.check()
        t0 = time.monotonic()
        with pytest.raises(KafkaConnectionError) as again:
            await dead.check()
        assert again.value is first.value and time.monotonic() - t0 < 0.5
        fresh = BrokerProbe(f"127.0.0.1:{free_port()}", KafkaSecurity(), timeout_s=1.0,
                            max_age_s=0.0)
        with pytest.raises(KafkaConnectionError) as one:
            await fresh.check()
        with pytest.raises(KafkaConnectionError) as two:
            await fresh.check()
        assert one.value is not two.value  # max_age_s = 0: every check probes

    asyncio.run(scenario())
