"""The poison-pill breaker: a message that kills the worker (here: SIGABRT, by the fault
injection LDP_FAULT_ABORT_ON_HEX) twice goes to ldp.dlq unprocessed instead of a crash loop, and
every other report is counted exactly."""
from __future__ import annotations

import asyncio
import json
import signal
import time

import numpy as np
import pytest
from conftest import over_both_brokers, wait_for_n, write_config
from kafka_helpers import read_dlq
from store_helpers import read_collection

pytestmark = pytest.mark.pipeline
kafka_broker = over_both_brokers()

POISON = b"POISON-PILL:"


def _wait_exit(worker, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while worker.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert worker.proc.poll() is not None, f"worker still alive:\n{worker.log_tail()}"
    return worker.proc.returncode


def test_message_killing_the_worker_twice_is_dead_lettered(tmp_path, kafka_broker, redis_server,
                                                           service_env, spawn_worker, unique_name):
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.fleet import run_fleet
    from ldpstream.producers.publisher import Publisher

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, partitions=1)
    coll = load_config(path).collections[cid]
    env = dict(service_env, LDP_FAULT_ABORT_ON_HEX=POISON.hex())
    first = spawn_worker(path, env)
    first.wait_ready(60)

    async def send(seed: int) -> dict:
        stats = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=2000, batch=200,
                                seed=seed, keep_counts=True, mechanism=coll.mechanism())
        return stats.counts

    async def phase1() -> tuple[dict, dict]:
        store = make_store(redis_server.url)
        a = await send(1)
        assert await wait_for_n(store, cid, 2000, timeout=60) == 2000
        async with Publisher(kafka_broker.bootstrap) as pub:
            await pub.send_and_wait(coll.topic, POISON + b"\x00" * 64)  # offset 10
        b = await send(2)
        await store.close()
        return a, b

    a, b = asyncio.run(phase1())
    assert _wait_exit(first) == -signal.SIGABRT            # death 1 (processing a whole poll)
    second = spawn_worker(path, env)
    assert _wait_exit(second) == -signal.SIGABRT           # death 2 (the message alone)
    third = spawn_worker(path, env)
    third.wait_ready(60)

    async def phase2() -> dict:
        store = make_store(redis_server.url)
        got = await wait_for_n(store, cid, 4000, timeout=60)
        await asyncio.sleep(1.0)
        assert await store.n(cid, 1) == 4000, (got, third.log_tail())
        counts = await read_collection(store, coll)
        await store.close()
        return counts

    counts = asyncio.run(phase2())
    for key in a:
        np.testing.assert_array_equal(counts[key], a[key] + b[key], err_msg=key)
    assert third.proc.poll() is None
    pills = [r for r in read_dlq(kafka_broker.bootstrap, topic=coll.topic)
             if r["reason"] == "poison_pill"]
    assert [r["offset"] for r in pills] == [10], pills
    health = json.loads(third.get("/healthz"))
    assert health["checks"]["ingest"]["poison_pills"] == 1
