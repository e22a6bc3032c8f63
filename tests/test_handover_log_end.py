"""A partition handed to another worker when its stored offset is the last record of a
multi-record producer batch is not judged "truncated": the embedded broker (Tansu) answers
ListOffsets(latest) with the base offset of its last batch + 1, below the stored offset. Before the
worker probed the record at the stored offset, it re-based the partition below what was counted
and counted the end of the log twice."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from conftest import wait_for_n, write_config
from store_helpers import read_collection

from ldpstream.agents.app import make_store
from ldpstream.config import load_config
from ldpstream.producers.fleet import run_fleet

pytestmark = pytest.mark.pipeline


def test_handover_at_the_end_of_a_batch_counts_once(tmp_path, kafka_broker, redis_server,
                                                    spawn_worker, unique_name):
    cid = unique_name
    total = 6_000
    path = write_config(tmp_path / "c.yaml", cid, partitions=1, refresh_interval_s=60.0)
    coll = load_config(path).collections[cid]
    a = spawn_worker(path)
    a.wait_ready(60)

    async def run():
        store = make_store(redis_server.url)
        # rate 0: the producer batches many 100-report messages into each record batch
        stats = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=total, batch=100,
                                seed=31, keep_counts=True, devices=100)
        assert await wait_for_n(store, cid, total, timeout=60) == total
        stored = await store.offset(cid, 0)
        probe = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=None)
        await probe.start()
        tp = TopicPartition(coll.topic, 0)
        end = (await probe.end_offsets([tp]))[tp]
        await probe.stop()
        await store.close()
        return stats, stored, end

    stats, stored, end = asyncio.run(run())
    assert stored == stats.sent_messages - 1
    assert end <= stored, f"the broker reported the true end ({end}): scenario not reproduced"
    assert a.stop() == 0
    b = spawn_worker(path)  # takes the partition over: checks its log at assignment
    b.wait_ready(60)

    async def after():
        store = make_store(redis_server.url)
        await asyncio.sleep(2.0)  # anything counted twice would show up now
        n = await store.n(cid, 1)
        got = await read_collection(store, coll)
        await store.close()
        return n, got

    n, got = asyncio.run(after())
    status = json.loads(b.get("/healthz", any_status=True))["checks"]["ingest"]
    assert n == total, (n, status, b.log_tail())
    assert status["log_resets"] == [], status["log_resets"]
    for key, want in stats.counts.items():
        assert (got[key] == want).all(), key
    assert b.stop() == 0
