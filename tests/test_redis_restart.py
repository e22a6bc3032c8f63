"""Redis restarted mid-stream (EmbeddedRedis.restart(), then a 3 s outage): the worker pauses,
retries the apply with backoff, resumes, and the final counts are exact (nothing lost or twice)."""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from conftest import wait_for_n, write_config
from store_helpers import read_collection

pytestmark = pytest.mark.pipeline

TOTAL = 150_000


def test_worker_waits_for_redis_and_loses_nothing(tmp_path, kafka_broker, service_env,
                                                  spawn_worker, unique_name):
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.producers.fleet import run_fleet

    redis = EmbeddedRedis(data_dir=str(tmp_path / "redis"))  # our dir: survives stop()
    redis.start()
    try:
        cid = unique_name
        path = write_config(tmp_path / "c.yaml", cid, partitions=2,
                            ingest={"batch_reports": 5000, "batch_seconds": 0.2})
        coll = load_config(path).collections[cid]
        worker = spawn_worker(path, env=dict(service_env, REDIS_URL=redis.url))
        worker.wait_ready(60)
        events: list[str] = []

        async def n_now() -> int:
            store = make_store(redis.url)
            try:
                return await store.n(cid, 16)
            finally:
                await store.close()

        async def wait_beyond(n: int, timeout: float = 30.0) -> int:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                got = await n_now()
                if got > n:
                    return got
                await asyncio.sleep(0.1)
            raise AssertionError(f"stuck at {n}:\n{worker.log_tail()}")

        async def chaos() -> None:
            n = await wait_beyond(10_000)
            redis.restart()
            events.append(f"restart at n={n}")
            n = await wait_beyond(n + 1)
            events.append(f"resumed, n={n}")
            redis.stop()
            await asyncio.sleep(1.0)
            blocked = json.loads(worker.get("/healthz", any_status=True))["checks"]["ingest"]["blocked"]
            await asyncio.sleep(2.0)
            redis.start()
            events.append(f"outage 3 s at n={n}, blocked={blocked}")
            assert blocked, worker.log_tail()

        async def run():
            chaos_task = asyncio.create_task(chaos())
            stats = await run_fleet(kafka_broker.bootstrap, coll, rate=15_000, total=TOTAL,
                                    batch=200, seed=9, keep_counts=True)
            await chaos_task
            store = make_store(redis.url)
            assert await wait_for_n(store, cid, TOTAL, timeout=60) == TOTAL, worker.log_tail()
            await asyncio.sleep(1.0)
            assert await store.n(cid, 16) == TOTAL
            got = await read_collection(store, coll)
            for key, want in stats.counts.items():
                np.testing.assert_array_equal(got[key], want, err_msg=key)
            await store.close()

        asyncio.run(run())
        assert worker.proc.poll() is None
        assert "Redis unavailable" in open(worker.log_path).read()
        assert json.loads(worker.get("/healthz"))["checks"]["ingest"]["blocked"] is False
        assert worker.stop() == 0
        print("; ".join(events))
    finally:
        redis.stop()
