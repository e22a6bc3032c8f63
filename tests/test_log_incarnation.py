"""A broker that loses its log (in-memory broker restarted: every topic recreated empty) is
detected and handled by the stated rule (agents/ingest/log_identity.py): the new log is counted from its
start, nothing is skipped silently, and the reset shows in /healthz and ldp_log_resets_total."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import numpy as np
import pytest
from conftest import write_config
from store_helpers import read_collection

from ldpstream.agents.ingest.log_identity import LogMark, judge

pytestmark = pytest.mark.pipeline


def test_judge_verdicts():
    m = LogMark(0, 1000, 7)
    assert judge(None, None, 0, 5, None).kind is None
    assert judge(9, m, 0, 20, m).kind is None and judge(9, m, 0, 20, m).position == 9
    v = judge(9, m, 0, 20, LogMark(0, 2000, 8))          # refilled past the stored offset
    assert (v.kind, v.position) == ("recreated", None)
    v = judge(9, m, 0, 0, None)                            # empty new log
    assert (v.kind, v.position) == ("recreated", None)
    v = judge(9, m, 0, 4, m)                               # same log, tail lost
    assert (v.kind, v.position) == ("truncated", 3)
    v = judge(9, None, 0, 4, None)                         # no mark: never counted twice
    assert (v.kind, v.position) == ("truncated", 3)
    v = judge(9, m, 15, 30, None)                          # deleted before being counted
    assert (v.kind, v.position) == ("retention_gap", 14)
    assert judge(9, m, 5, 30, None).kind is None           # mark aged out, log consistent


@pytest.mark.parametrize("frozen", [False, True], ids=["awake", "frozen-across-restart"])
def test_broker_losing_its_log_is_detected_and_nothing_is_skipped(
        tmp_path, fresh_redis, spawn_worker, service_env, unique_name, frozen):
    """``frozen``: the worker is stopped (SIGSTOP) while the broker restarts and the new log
    fills past the stored offsets, so when it wakes its fetch from the stored position succeeds
    on the new log; the broken connection must make it check the log before taking anything
    (it counted those records twice, once as the old log's tail and again from the start)."""
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.kafka_admin import create_topics
    from ldpstream.producers.fleet import run_fleet

    broker = EmbeddedBroker()
    broker.start()
    try:
        cid = unique_name
        path = write_config(tmp_path / "c.yaml", cid, partitions=2)
        coll = load_config(path).collections[cid]
        env = dict(service_env, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, REDIS_URL=fresh_redis.url)
        worker = spawn_worker(path, env)
        worker.wait_ready(60)
        store = None

        async def send(seed: int) -> dict:
            stats = await run_fleet(broker.bootstrap, coll, rate=0, total=4000, batch=200,
                                    seed=seed, keep_counts=True, mechanism=coll.mechanism())
            return stats.counts

        async def wait_n(n: int, timeout: float = 60) -> int:
            deadline = time.monotonic() + timeout
            got = -1
            while time.monotonic() < deadline:
                got = await store.n(cid, 2)
                if got >= n:
                    break
                await asyncio.sleep(0.2)
            return got

        async def run():
            nonlocal store
            store = make_store(fresh_redis.url)
            first = await send(1)
            assert await wait_n(4000) == 4000, worker.log_tail()
            stored = await store.offsets(cid, 2)
            assert sum(stored.values()) + 2 == 20  # 20 messages over 2 partitions
            # the broker loses everything (in-memory storage); topics come back empty
            if frozen:
                os.kill(worker.proc.pid, signal.SIGSTOP)
            try:
                broker.stop()
                broker.start()
                await create_topics(broker.bootstrap,
                                    {coll.topic: 2, "ldp.dlq": 1, "ldp.config": 1},
                                    compacted={"ldp.config"})
                second = await send(2)
            finally:
                if frozen:
                    os.kill(worker.proc.pid, signal.SIGCONT)
            got = await wait_n(8000, 90)
            await asyncio.sleep(1.0)
            assert await store.n(cid, 2) == 8000, (got, worker.log_tail())
            counts = await read_collection(store, coll)
            for key, want in first.items():
                np.testing.assert_array_equal(counts[key], want + second[key], err_msg=key)
            await store.close()

        asyncio.run(run())
        health = json.loads(worker.get("/healthz", any_status=True))
        resets = health["checks"]["log"]["resets"]
        assert health["status"] == "degraded" and not health["checks"]["log"]["ok"]
        assert {(r["partition"], r["kind"]) for r in resets} <= {(0, "recreated"), (1, "recreated")}
        assert resets, health
        metrics = worker.get("/metrics")
        line = next(l for l in metrics.splitlines() if l.startswith("ldp_log_resets_total")
                    and f'collection="{cid}"' in l)
        assert 'kind="recreated"' in line and float(line.rsplit(" ", 1)[1]) >= 1
        # everything is counted: the lag gauge says 0 (it said 17-26 after a log reset)
        lag = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and lag != 0:
            lag = next(float(l.rsplit(" ", 1)[1]) for l in worker.get("/metrics").splitlines()
                       if l.startswith("ldp_consumer_lag_messages") and f'"{cid}"' in l)
            time.sleep(0.5)
        assert lag == 0, lag
    finally:
        broker.stop()


def test_every_new_broker_connection_marks_the_partitions_suspect():
    """The end of a broker restart that cannot be missed: records of a new log arrive only over a
    connection made after it. A connection dropped without breaking (idle) and made again calls
    the hook; the first one does too (its partitions are checked on assignment anyway)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.conn import CloseReason

    from ldpstream.agents.ingest.clients import watch_connections
    from ldpstream.dev.broker import EmbeddedBroker

    async def run(bootstrap: str) -> tuple[int, int, int]:
        calls = []
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                    enable_auto_commit=False)
        watch_connections(consumer, lambda: calls.append(1))
        await consumer.start()
        try:
            tp = TopicPartition("probe", 0)
            await consumer.end_offsets([tp])
            started = len(calls)
            await consumer.end_offsets([tp])        # same connections: no call
            kept = len(calls)
            client = consumer._client
            for conn in list(client._conns.values()):
                conn.close(reason=CloseReason.IDLE_DROP)   # not broken: the close says nothing
            await consumer.end_offsets([tp])        # a new connection: the hook is called
            return started, kept, len(calls)
        finally:
            await consumer.stop()

    with EmbeddedBroker() as broker:
        broker.create_topics({"probe": 1})
        started, kept, after = asyncio.run(run(broker.bootstrap))
    assert started >= 1 and kept == started and after > kept
