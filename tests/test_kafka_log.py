"""The log-incarnation rule (agents/ingest/log_identity.py) and the compacted ``ldp.config`` against Apache
Kafka's own log management: a report topic deleted and recreated is counted again from its start
("recreated"); retention deleting segments the worker had not read yet shows as "retention_gap"
(the consumer runs with ``auto_offset_reset="none"``) and what is left is counted once; the log
cleaner really compacts a config topic, the latest signed state per key survives and is adopted."""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from conftest import wait_for_n, write_config
from store_helpers import read_collection

pytestmark = [pytest.mark.pipeline, pytest.mark.kafka]


@pytest.fixture
def kafka_env(apache_kafka, service_env) -> dict:
    return dict(service_env, KAFKA_BOOTSTRAP_SERVERS=apache_kafka.bootstrap)


def _resets(worker) -> list[dict]:
    return json.loads(worker.get("/healthz", any_status=True))["checks"]["log"]["resets"]


async def _send(bootstrap: str, coll, seed: int, total: int = 2000) -> dict:
    from ldpstream.producers.fleet import run_fleet

    stats = await run_fleet(bootstrap, coll, rate=0, total=total, batch=200, seed=seed,
                            keep_counts=True, mechanism=coll.mechanism())
    return stats.counts


def _assert_counts(got: dict, *parts: dict) -> None:
    for key in parts[0]:
        np.testing.assert_array_equal(got[key], sum(p[key] for p in parts), err_msg=key)


def test_topic_deleted_and_recreated_is_counted_from_its_start(
        tmp_path, apache_kafka, kafka_env, fresh_redis, spawn_worker, unique_name):
    from aiokafka.admin import AIOKafkaAdminClient

    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.kafka_admin import create_topics

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, partitions=1)
    coll = load_config(path).collections[cid]
    worker = spawn_worker(path, dict(kafka_env, REDIS_URL=fresh_redis.url))
    worker.wait_ready(60)

    async def run():
        store = make_store(fresh_redis.url)
        first = await _send(apache_kafka.bootstrap, coll, 1)
        assert await wait_for_n(store, cid, 2000) == 2000, worker.log_tail()
        admin = AIOKafkaAdminClient(bootstrap_servers=apache_kafka.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([coll.topic])
            deadline = time.monotonic() + 30
            while coll.topic in await admin.list_topics():
                assert time.monotonic() < deadline, "topic not deleted"
                await asyncio.sleep(0.2)
        finally:
            await admin.close()
        await create_topics(apache_kafka.bootstrap, {coll.topic: 1})
        second = await _send(apache_kafka.bootstrap, coll, 2, total=4000)
        assert await wait_for_n(store, cid, 6000, 90) >= 6000, worker.log_tail()
        await asyncio.sleep(1.0)
        assert await store.n(cid, 1) == 6000, worker.log_tail()
        _assert_counts(await read_collection(store, coll), first, second)
        await store.close()

    asyncio.run(run())
    assert {r["kind"] for r in _resets(worker)} == {"recreated"}, _resets(worker)


def test_retention_deleting_unread_segments_is_a_gap_not_a_silent_skip(
        tmp_path, apache_kafka, kafka_env, fresh_redis, spawn_worker, unique_name):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, partitions=1)
    coll = load_config(path).collections[cid]
    env = dict(kafka_env, REDIS_URL=fresh_redis.url)
    worker = spawn_worker(path, env)
    worker.wait_ready(60)
    tp = TopicPartition(coll.topic, 0)

    async def log_start() -> int:
        c = AIOKafkaConsumer(bootstrap_servers=apache_kafka.bootstrap, group_id=None)
        await c.start()
        try:
            return (await c.beginning_offsets([tp]))[tp]
        finally:
            await c.stop()

    async def run():
        store = make_store(fresh_redis.url)
        counted = await _send(apache_kafka.bootstrap, coll, 1)
        assert await wait_for_n(store, cid, 2000) == 2000, worker.log_tail()
        await store.close()
        return counted

    counted = asyncio.run(run())
    assert worker.stop() == 0
    # unread by anyone: 10 messages (offsets 10-19), then retention deletes every segment
    # whose records are older than 1 s (Kafka rolls the active segment to delete it too)
    apache_kafka.alter_topic(coll.topic, retention_ms=1000, segment_ms=500)
    asyncio.run(_send(apache_kafka.bootstrap, coll, 2))
    deadline = time.monotonic() + 60
    while asyncio.run(log_start()) < 20:
        assert time.monotonic() < deadline, "retention deleted nothing"
        time.sleep(0.5)
    apache_kafka.alter_topic(coll.topic, retention_ms=3_600_000, segment_ms=3_600_000)
    kept = asyncio.run(_send(apache_kafka.bootstrap, coll, 3, total=200))  # offset 20
    worker = spawn_worker(path, env)
    worker.wait_ready(60)

    async def after():
        store = make_store(fresh_redis.url)
        assert await wait_for_n(store, cid, 2200, 60) >= 2200, worker.log_tail()
        await asyncio.sleep(1.0)
        assert await store.n(cid, 1) == 2200, worker.log_tail()
        _assert_counts(await read_collection(store, coll), counted, kept)
        await store.close()

    asyncio.run(after())
    assert {r["kind"] for r in _resets(worker)} == {"retention_gap"}, _resets(worker)
    line = next(l for l in worker.get("/metrics").splitlines()
                if l.startswith("ldp_log_resets_total") and f'collection="{cid}"' in l
                and 'kind="retention_gap"' in l)
    assert float(line.rsplit(" ", 1)[1]) == 1


def test_log_cleaner_compacts_config_topic_latest_state_per_key_survives(
        apache_kafka, unique_name):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from ldpstream.config import load_config
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.signing import SigningKey

    topic = f"cfg-{unique_name}"
    coll = next(iter(load_config(None).collections.values()))
    key = SigningKey.generate()
    t0 = time.time()

    def signed(cid: str, version: int, at: float) -> bytes:
        mech = RRIndependent(coll.domain, epsilon=1.0, version=version)
        return key.sign_state(mech.state(), cid, issued_at=at)

    async def read_all() -> list[tuple[bytes, int]]:
        c = AIOKafkaConsumer(bootstrap_servers=apache_kafka.bootstrap, group_id=None,
                             auto_offset_reset="earliest")
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            end = (await c.end_offsets([tp]))[tp]
            out = []
            while await c.position(tp) < end:
                for msgs in (await c.getmany(timeout_ms=1000)).values():
                    out += [(m.key, m.offset) for m in msgs]
            return out
        finally:
            await c.stop()

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=apache_kafka.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 1, 1, topic_configs={
                "cleanup.policy": "compact", "segment.ms": "200",
                "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0"})])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=apache_kafka.bootstrap, acks="all")
        await producer.start()
        try:
            for i, (cid, version) in enumerate([("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]):
                await producer.send_and_wait(topic, signed(cid, version, t0 + i), key=cid.encode())
            await asyncio.sleep(0.5)
            # a record in a new segment: the five above are now in closed segments, cleanable
            await producer.send_and_wait(topic, signed("c", 1, t0 + 9), key=b"c")
        finally:
            await producer.stop()
        deadline = time.monotonic() + 90
        while True:
            records = await read_all()
            if len(records) <= 3:
                break
            assert time.monotonic() < deadline, f"not compacted: {records}"
            await asyncio.sleep(1.0)
        # the latest record of each key survives, at its original offset
        assert records == [(b"b", 3), (b"a", 4), (b"c", 5)], records
        watcher = await ConfigWatcher(apache_kafka.bootstrap, topic=topic,
                                      verify_key=key.verify_key, max_epsilon=10.0).start()
        try:
            assert (await watcher.wait_for("a", 20)).version == 3
            assert (await watcher.wait_for("b", 20)).version == 2
            assert not watcher.rejected, watcher.refusals
        finally:
            await watcher.stop()

    asyncio.run(run())
