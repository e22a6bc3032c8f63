"""Exactly-once under crashes: SIGKILL the worker at random points of a 240,000-report stream,
restart it, four times (once with two workers sharing the partitions, so a rebalance hands
partitions over); the final Redis counts equal the counts of the reports produced, exactly."""
from __future__ import annotations

import asyncio
import random
import time

import numpy as np
import pytest
from conftest import over_both_brokers, wait_for_n, write_config
from store_helpers import read_collection, read_fine_buckets

pytestmark = pytest.mark.pipeline
kafka_broker = over_both_brokers()

TOTAL = 240_000


def test_kill_9_restart_counts_exactly_once(tmp_path, kafka_broker, redis_server, spawn_worker,
                                            unique_name):
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.fleet import run_fleet

    cid = unique_name
    # small apply batches so that many deltas are applied (and many are in flight at a kill)
    path = write_config(tmp_path / "c.yaml", cid, partitions=3,
                        ingest={"batch_reports": 5000, "batch_seconds": 0.2})
    config = load_config(path)
    coll = config.collections[cid]
    rnd = random.Random(20240607)
    workers = [spawn_worker(path)]
    workers[0].wait_ready(60)
    store = make_store(redis_server.url)
    log: list[str] = []
    t0 = time.monotonic()

    async def wait_progress(after: int, timeout: float = 40.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = await store.n(cid, 16)
            if n > after or n >= TOTAL:
                return n
            await asyncio.sleep(0.05)
        raise AssertionError(f"no progress beyond {after} reports; log:\n{workers[-1].log_tail()}")

    async def killer() -> int:
        kills = 0
        n = 0
        while kills < 4:
            n = await wait_progress(n)  # the live worker(s) are applying deltas
            if n >= TOTAL:
                break
            await asyncio.sleep(rnd.uniform(0.0, 1.2))
            victim = workers[rnd.randrange(len(workers))] if kills == 3 else workers[-1]
            victim.kill()
            workers.remove(victim)
            kills += 1
            n = await store.n(cid, 16)
            log.append(f"kill {kills} at {time.monotonic() - t0:.1f}s, n={n}")
            workers.append(spawn_worker(path))
            if kills == 2:  # from now on two workers share (and hand over) the partitions
                workers.append(spawn_worker(path))
        return kills

    async def run():
        kill_task = asyncio.create_task(killer())
        stats = await run_fleet(kafka_broker.bootstrap, coll, rate=20_000, total=TOTAL, batch=100,
                                seed=7, keep_counts=True, devices=5000)
        kills = await kill_task
        assert kills >= 3, log
        n = await wait_for_n(store, cid, TOTAL, timeout=60)
        await asyncio.sleep(1.5)  # anything counted twice would show up now
        n = await store.n(cid, 16)
        assert n == TOTAL, (n, log, workers[-1].log_tail())
        got = await read_collection(store, coll)
        for key, want in stats.counts.items():
            np.testing.assert_array_equal(got[key], want, err_msg=key)
        assert sum(int(v.sum()) for v in got.values()) == TOTAL * len(got)
        # per time bucket too: the fine buckets of the last hour hold every report exactly once
        fine = await read_fine_buckets(store, coll, 3600)
        for key, want in stats.counts.items():
            np.testing.assert_array_equal(fine[key], want, err_msg=f"buckets {key}")
        await store.close()
        return stats

    stats = asyncio.run(run())
    assert stats.sent_reports == TOTAL
    for w in workers:
        w.wait_ready(60)  # one spawned at the last kill may still be starting (a SIGTERM during
        assert w.stop() == 0  # its imports is not the clean shutdown checked here)
    print("; ".join(log))
