"""Three-broker Apache Kafka (KRaft, every node broker+controller, topics replicated 3 times,
``min.insync.replicas=2``, unclean leader election off): the partition leader of a report topic is
SIGKILLed mid-ingest (devices publish with acks=all) and the counts stay exact; a broker holding
``ldp.config`` is SIGKILLed and devices and workers keep the current signed state; an unclean
leader election (enabled for one topic) truncates a log below what was counted, and the worker
says so and counts what comes next."""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from conftest import running_kafka, wait_for_n, write_config
from kafka_counts import assert_counted
from store_helpers import read_collection

pytestmark = [pytest.mark.pipeline, pytest.mark.kafka]


@pytest.fixture(scope="module")
def kafka_cluster():
    """Three broker+controller JVMs for this module (the tests restart what they kill). A killed
    broker is fenced (and leaves the ISRs) after 3 s instead of 9 s."""
    yield from running_kafka(nodes=3, overrides={"broker.heartbeat.interval.ms": 500,
                                                 "broker.session.timeout.ms": 3000})


@pytest.fixture
def cluster_env(kafka_cluster, service_env) -> dict:
    return dict(service_env, KAFKA_BOOTSTRAP_SERVERS=kafka_cluster.bootstrap,
                LDP_TOPIC_REPLICATION="3")


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_partition_leader_killed_mid_ingest_counts_stay_exact(
        tmp_path, kafka_cluster, cluster_env, redis_server, spawn_worker, unique_name):
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.fleet import run_fleet

    cid = unique_name
    total = 60_000
    path = write_config(tmp_path / "c.yaml", cid, partitions=2,
                        ingest={"batch_reports": 5000, "batch_seconds": 0.2})
    coll = load_config(path).collections[cid]
    worker = spawn_worker(path, cluster_env)
    worker.wait_ready(90)
    store = make_store(redis_server.url)
    events: list[str] = []

    async def kill_leader() -> None:
        while await store.n(cid, 2) < total // 4:
            await asyncio.sleep(0.05)
        leader, isr = await asyncio.to_thread(kafka_cluster.leader_of, coll.topic, 0)
        assert len(isr) == 3, isr
        kafka_cluster.crash(leader)
        events.append(f"killed node {leader.node_id} (leader of {coll.topic}[0]) at "
                      f"n={await store.n(cid, 2)}")
        return leader

    async def run():
        killer = asyncio.create_task(kill_leader())
        stats = await run_fleet(kafka_cluster.bootstrap, coll, rate=8_000, total=total, batch=100,
                                seed=11, keep_counts=True, devices=2000)
        dead = await killer
        n = await wait_for_n(store, cid, total, timeout=90)
        await asyncio.sleep(1.5)  # anything counted twice would show up now
        assert await store.n(cid, 2) == total, (n, events, worker.log_tail())
        got = await read_collection(store, coll)
        for key, want in stats.counts.items():
            np.testing.assert_array_equal(got[key], want, err_msg=key)
        await store.close()
        return stats, dead

    try:
        stats, dead = asyncio.run(run())
    finally:
        for node in kafka_cluster.nodes:
            if not node.running:
                kafka_cluster.restart(node)
    assert stats.sent_reports == total
    assert stats.idempotent, "a retry after the failover could write a batch twice"
    new_leader, _ = kafka_cluster.leader_of(coll.topic, 0)
    assert new_leader is not dead or events, events
    assert worker.proc.poll() is None
    print("; ".join(events))


def test_broker_holding_config_killed_devices_and_workers_keep_the_state(
        tmp_path, kafka_cluster, cluster_env, redis_server, spawn_worker, unique_name):
    from ldpstream.config import load_config
    from ldpstream.dev.kafka import TOPICS_TOOL
    from ldpstream.names import CONFIG_TOPIC
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.fleet import run_fleet
    from ldpstream.producers.signing import load_verify_key

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, partitions=1, epsilon=1.5, version=4)
    coll = load_config(path).collections[cid]
    want = coll.mechanism()
    worker = spawn_worker(path, cluster_env)
    worker.wait_ready(90)
    key = load_verify_key()

    async def current() -> tuple[float, int]:
        """What a device starting now adopts from ldp.config (signed by the worker)."""
        watcher = await ConfigWatcher(kafka_cluster.bootstrap, verify_key=key).start(60.0)
        try:
            state = await watcher.wait_for(cid, 60.0)
            assert state is not None, watcher.refusals
            mech = watcher.mechanisms[cid]
            return float(mech.epsilon), int(mech.version)
        finally:
            await watcher.stop()

    assert asyncio.run(current()) == (pytest.approx(want.epsilon), 4)
    # the worker runs no faust consumer group (nor its leader topic): a broker's loss cannot
    # crash the app through faust's rebalance callbacks (agents/app.py)
    topics = kafka_cluster.cli(TOPICS_TOOL, "--list").split()
    assert not [t for t in topics if t.startswith(cluster_env["LDP_APP_ID"])], topics
    leader, isr = kafka_cluster.leader_of(CONFIG_TOPIC, 0)
    assert len(isr) == 3, isr
    kafka_cluster.crash(leader)
    try:
        deadline = time.monotonic() + 60
        while kafka_cluster.leader_of(CONFIG_TOPIC, 0)[0] is leader:
            assert time.monotonic() < deadline, "no new leader for ldp.config"
            time.sleep(0.5)
        # a device starting now still reads the signed state the worker published
        assert asyncio.run(current()) == (pytest.approx(want.epsilon), 4)
        health = json.loads(worker.get("/healthz", any_status=True))
        assert worker.proc.poll() is None, worker.log_tail()
        assert _metric(worker.get("/metrics"), "ldp_config_records_refused_total") == 0
        assert health["checks"]["ingest"]["assigned"], health

        async def fleet_counted() -> None:
            """A fleet started now adopts the state from ldp.config; the worker counts it."""
            stats = await run_fleet(kafka_cluster.bootstrap, coll, rate=0, total=2000, batch=200,
                                    seed=5, keep_counts=True, config_timeout_s=60.0,
                                    verify_key=key)
            assert stats.version == 4, stats.version
            await assert_counted(redis_server.url, coll, stats.counts, 2000, worker.log_tail)

        asyncio.run(fleet_counted())
    finally:
        kafka_cluster.restart(leader)


def test_unclean_leader_election_truncation_is_detected_and_nothing_is_skipped(
        tmp_path, kafka_cluster, cluster_env, fresh_redis, spawn_worker, unique_name):
    """Replicas on nodes a (leader) and b; b dies, a alone takes (and the worker counts) more
    records; a dies, b comes back and is elected although out of sync (unclean election enabled
    for this topic only): the log now ends below the stored offset. The worker reports
    "truncated" and counts the records written after the election; what it had counted stays."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.dev.kafka import ELECTION_TOOL
    from ldpstream.producers.fleet import run_fleet

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, partitions=1)
    coll = load_config(path).collections[cid]
    a, b = kafka_cluster.nodes[0], kafka_cluster.nodes[1]

    async def create():
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(coll.topic, -1, -1, replica_assignments={
                0: [a.node_id, b.node_id]}, topic_configs={"min.insync.replicas": "1"})])
        finally:
            await admin.close()

    def wait_until(cond, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.5)

    asyncio.run(create())
    worker = spawn_worker(path, dict(cluster_env, REDIS_URL=fresh_redis.url))
    worker.wait_ready(90)

    async def send(seed: int, total: int, n_after: int) -> dict:
        stats = await run_fleet(kafka_cluster.bootstrap, coll, rate=0, total=total, batch=200,
                                seed=seed, keep_counts=True, mechanism=coll.mechanism())
        store = make_store(fresh_redis.url)
        try:
            assert await wait_for_n(store, cid, n_after, 90) >= n_after, worker.log_tail()
        finally:
            await store.close()
        return stats.counts

    def resets() -> list[dict]:
        return json.loads(worker.get("/healthz", any_status=True))["checks"]["log"]["resets"]

    try:
        first = asyncio.run(send(1, 2000, 2000))            # offsets 0-9 on a and b
        kafka_cluster.crash(b)
        wait_until(lambda: kafka_cluster.leader_of(coll.topic)[1] == [a.node_id], "b left ISR")
        second = asyncio.run(send(2, 2000, 4000))           # offsets 10-19 on a only
        kafka_cluster.crash(a)
        kafka_cluster.restart(b)
        kafka_cluster.alter_topic(coll.topic, unclean_leader_election_enable="true")
        try:
            kafka_cluster.cli(ELECTION_TOOL, "--election-type", "unclean", "--topic",
                              coll.topic, "--partition", "0")
        except Exception:  # noqa: BLE001 - the controller may have elected b by itself
            pass
        wait_until(lambda: kafka_cluster.leader_of(coll.topic)[0] is b, "b elected")
        wait_until(lambda: bool(resets()), "the worker saw the truncation")
        third = asyncio.run(send(3, 1000, 5000))            # offsets 10-14 on b: a new tail
        store = make_store(fresh_redis.url)

        async def final():
            await asyncio.sleep(1.0)
            assert await store.n(cid, 1) == 5000, worker.log_tail()
            got = await read_collection(store, coll)
            await store.close()
            return got

        got = asyncio.run(final())
        for key in first:
            np.testing.assert_array_equal(got[key], first[key] + second[key] + third[key],
                                          err_msg=key)
        assert [(r["partition"], r["kind"]) for r in resets()] == [(0, "truncated")], resets()
    finally:
        for node in (a, b):
            if not node.running:
                kafka_cluster.restart(node)
        kafka_cluster.alter_topic(coll.topic, unclean_leader_election_enable="false")
