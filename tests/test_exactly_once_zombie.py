"""Exactly-once with a frozen worker ("zombie") whose apply lands late.

Worker A sends an apply covering offsets (S, X]; the apply is held in flight (Redis
``CLIENT PAUSE WRITE`` holds every write, so it waits in Redis like a packet stuck on the
network), and A is SIGSTOPped past the consumer-group session timeout (3 s). Worker B starts,
takes both partitions over, reads the stored offsets S (reads are not paused), consumes and
sends its own first apply (S, S2], S2 > X. Then Redis is unpaused (A's stale apply lands first,
B's after it) and A is SIGCONTed. With the old "offset > stored" rule B's delta was applied too and
(S, X] was counted twice; with the compare-and-set B's delta is refused (conflict), B re-reads from
X + 1, and the final counts equal the counts of the reports produced, exactly. Runs on one Redis and
on a Redis Cluster (there the pause is sent to every master)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import numpy as np
import pytest
from conftest import over_both_brokers, wait_for_n, write_config
from store_helpers import on_masters, read_collection, read_fine_buckets

pytestmark = pytest.mark.pipeline
kafka_broker = over_both_brokers()

TOTAL = 100_000


@pytest.fixture(params=["redis", "redis-cluster"])
def fresh_target(request):
    """A Redis server or a Redis Cluster of the test's own (the test pauses it)."""
    return request.getfixturevalue("fresh_redis" if request.param == "redis"
                                   else "fresh_redis_cluster")


def test_frozen_worker_late_apply_counts_exactly_once(tmp_path, kafka_broker, fresh_target,
                                                      service_env, spawn_worker, unique_name):
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.fleet import run_fleet

    cid = unique_name
    # timed flushes only (every 1 s; batch_reports is never reached); no refresh during the test
    path = write_config(tmp_path / "c.yaml", cid, partitions=2, refresh_interval_s=120.0,
                        ingest={"batch_reports": 10_000_000, "batch_seconds": 1.0})
    coll = load_config(path).collections[cid]
    env = dict(service_env, REDIS_URL=fresh_target.url)
    a = spawn_worker(path, env=env)
    a.wait_ready(60)
    store = make_store(fresh_target.url)
    events: list[str] = []
    t0 = time.monotonic()

    def note(msg: str) -> None:
        events.append(f"{time.monotonic() - t0:5.1f}s {msg}")

    def ingest_status(w) -> dict:
        return json.loads(w.get("/healthz", any_status=True))["checks"]["ingest"]

    async def blocked_applies() -> int:
        return sum(1 for clients in await on_masters(store.redis, "CLIENT LIST") for c in clients
                   if c.get("cmd") in ("evalsha", "eval") and "b" in c.get("flags", ""))

    async def wait_blocked(k: int, who, timeout: float = 4.0) -> None:
        deadline = time.monotonic() + timeout
        while await blocked_applies() < k:
            assert time.monotonic() < deadline, f"no apply of {who} held:\n{who.log_tail()}"
            await asyncio.sleep(0.02)

    async def chaos():
        deadline = time.monotonic() + 40

        async def applying() -> bool:
            # A is applying, and has written the log mark that follows a partition's first
            # applied delta (a write that PAUSE WRITE would hold in place of A's next apply)
            marks = await store.log_states(cid, coll.partitions)
            return (await store.n(cid, 16) >= 5_000
                    and all(mark is not None for _, mark in marks.values()))

        while not await applying():
            assert time.monotonic() < deadline, a.log_tail()
            await asyncio.sleep(0.05)
        await on_masters(store.redis, "CLIENT", "PAUSE", 90_000, "WRITE")
        try:
            await wait_blocked(1, a)             # A's next timed apply is held in Redis
            await asyncio.sleep(0.3)
            held_a = await blocked_applies()
            os.killpg(a.proc.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            stored = await store.offsets(cid, 16)
            note(f"{held_a} apply call(s) of A held, SIGSTOP A: stored {stored}, n={await store.n(cid, 16)}")
            b = spawn_worker(path, env=env)
            await asyncio.to_thread(b.wait_ready, 60)  # B holds partitions: A's session expired
            st = ingest_status(b)
            note(f"B assigned {st['assigned']} after {time.monotonic() - frozen_at:.1f}s")
            await wait_blocked(held_a + 1, b)    # B's first apply (S, S2] is held behind A's
            assert await store.offsets(cid, 16) == stored
        finally:
            # unpause while A is still frozen: its apply runs now, whatever A's socket timeout
            # (A would drop the connection, and the held command with it, on waking first)
            await on_masters(store.redis, "CLIENT", "UNPAUSE")
        while await blocked_applies():
            await asyncio.sleep(0.01)
        note(f"unpaused: stored {await store.offsets(cid, 16)}")
        os.killpg(a.proc.pid, signal.SIGCONT)
        note(f"SIGCONT A after {time.monotonic() - frozen_at:.1f}s frozen")
        return b

    async def run():
        chaos_task = asyncio.create_task(chaos())
        stats = await run_fleet(kafka_broker.bootstrap, coll, rate=5_000, total=TOTAL, batch=100,
                                seed=11, keep_counts=True, devices=2000)
        b = await chaos_task
        n = await wait_for_n(store, cid, TOTAL, timeout=60)
        await asyncio.sleep(2.5)  # anything counted twice would show up now
        n = await store.n(cid, 16)
        sa, sb = ingest_status(a), ingest_status(b)
        for name, st in (("A", sa), ("B", sb)):
            note(f"{name}: applied {st['applied_batches']}, skipped {st['skipped_batches']}, "
                 f"conflicts {st.get('conflicts')}, assigned {st['assigned']}")
        print("\n" + "\n".join(events))
        assert n == TOTAL, (n, events, a.log_tail(), b.log_tail())
        got = await read_collection(store, coll)
        fine = await read_fine_buckets(store, coll, 3600)   # and per time bucket
        for key, want in stats.counts.items():
            np.testing.assert_array_equal(got[key], want, err_msg=key)
            np.testing.assert_array_equal(fine[key], want, err_msg=f"buckets {key}")
        await store.close()
        return stats, b, sb

    stats, b, sb = asyncio.run(run())
    assert stats.sent_reports == TOTAL
    # B's first delta was refused, so the scenario happened: a conflict, or (B takes over from a
    # holder that never released the partitions: its first chunk is one message, ending inside
    # A's range) a replay below the stored offset
    assert sb["conflicts"] + sb["skipped_batches"] >= 1, sb
    assert a.stop() == 0 and b.stop() == 0
