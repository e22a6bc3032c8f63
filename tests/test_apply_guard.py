"""No single message breaks the exactly-once apply (docs/security.md): the values a message can
influence are clamped in Python (agents/store/apply_guard.py), the Lua script checks all its arguments
and keys before its first write, a failed apply leaves the partition to the poison-pill breaker,
a far-future record timestamp on a quota collection is dead-lettered with counts exact and the
worker alive, and quota windows follow the worker's clock (backdated record
timestamps do not buy a device more than its quota)."""
from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest
import redis.asyncio as aioredis
import yaml
from conftest import write_config
from kafka_helpers import read_dlq
from store_helpers import read_all

from ldpstream.agents.store import keys
from ldpstream.agents.store.apply_delta import PartitionDelta, SideCounter
from ldpstream.agents.store.apply_guard import (
    MAX_EXPIRE_MS,
    MAX_TIMESTAMP_MS,
    expire_ms,
    split_bad_timestamps,
    timestamp_ok,
)
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.layout import Layout
from ldpstream.agents.store.scripts import APPLY_LUA
from ldpstream.estimators.mechanism import TensorSpec
from ldpstream.redis_client import connect

pytestmark = pytest.mark.pipeline

SPEC = TensorSpec("m:a|b", ("a", "b"), (4, 5), (0, 1))
LAY = Layout.of(0, [SPEC])
INT64_MAX = 2**63 - 1


def test_timestamps_and_expiries_are_clamped():
    assert timestamp_ok(-1) and timestamp_ok(None) and timestamp_ok(0)
    assert timestamp_ok(MAX_TIMESTAMP_MS) and not timestamp_ok(MAX_TIMESTAMP_MS + 1)
    assert not timestamp_ok(INT64_MAX) and not timestamp_ok(-2)

    class R:
        def __init__(self, ts: int) -> None:
            self.timestamp = ts

    msgs = [R(1), R(INT64_MAX), R(2), R(-5)]
    good, bad = split_bad_timestamps(msgs)
    assert [m.timestamp for m in good] == [1, 2] and [m.timestamp for m in bad] == [INT64_MAX, -5]
    assert expire_ms(None) == "" and expire_ms(math.nan) == "" and expire_ms(math.inf) == ""
    assert expire_ms(1e300) == str(MAX_EXPIRE_MS) and expire_ms(-1e300) == "0"
    assert expire_ms(INT64_MAX / 1000 * 3) == str(MAX_EXPIRE_MS)
    assert expire_ms(1.0005) == "1001"


def _run(url: str, body):
    async def main():
        store = CountStore(connect(url))
        try:
            return await body(store)
        finally:
            await store.close()
    return asyncio.run(asyncio.wait_for(main(), 120))


def test_fuzzed_apply_inputs_keep_counts_exact(redis_server):
    """Seeded fuzz of everything a message can influence (side-counter expiries, sent_at): every
    apply succeeds and the counts, n and offset agree."""
    rng = np.random.default_rng(19)
    wild = [math.nan, math.inf, -math.inf, 1e300, -1e300, INT64_MAX / 1000 * 2, -1.0, 0.0,
            time.time(), 9.2e15, 1e-300]

    async def body(store: CountStore):
        cid = f"fuzz-{rng.integers(1 << 30)}"
        total = np.zeros(LAY.size, dtype=np.int64)
        for i in range(200):
            d = {SPEC.key: rng.integers(0, 5, size=(4, 5))}
            n = int(d[SPEC.key].sum())
            flat = LAY.pack(d, n)
            side = {f"quota:{int(rng.integers(-3, 3))}": SideCounter(
                {str(int(rng.integers(1, 1 << 62))): int(rng.integers(1, 9))},
                expire_at=float(rng.choice(wild)))}
            res = await store.apply_many(cid, [PartitionDelta(
                0, i, {(LAY, None): flat}, n, expected=i - 1,
                sent_at_max=float(rng.choice(wild)), side=side)])
            assert res[0].applied, res
            total += flat
        got = await read_all(store, cid, LAY, [0])
        np.testing.assert_array_equal(got[SPEC.key], LAY.unpack(total)[SPEC.key])
        assert await store.n(cid, [0]) == int(total[0])
        assert await store.offset(cid, 0) == 199
        await store.reset(cid)

    _run(redis_server.url, body)


def test_script_refuses_bad_arguments_before_any_write(redis_server):
    """A bad expiry (the overflow of finding 1) or malformed increments: the script errors before
    its first write, so counts, n and offset stay as they were."""
    cid = "guard-raw"
    off = keys.offsets_key(cid, 0)
    chunk = keys.counts_key(cid, 0, LAY.id, LAY.version, keys.LEVEL_ALL, 0, 0)
    side = keys.side_key(cid, 0, "quota:1")

    async def main():
        r = aioredis.from_url(redis_server.url)
        try:
            await r.delete(off, chunk, side)
            script = r.register_script(APPLY_LUA)
            for exp, blob in ((str(INT64_MAX) + "0", "7 5"), ("-5", "7 5"),
                              ("1000", "7 5; x"), ("12.5", "7 5")):
                with pytest.raises(Exception, match="ldp-apply"):
                    await script(keys=[off, keys.sent_at_key(cid, 0), chunk, side],
                                 args=[1000, "", 0, 3, "", 1, 1, "", "#0 3 #1 3 ", exp, blob])
                assert await r.exists(off, chunk, side) == 0
        finally:
            await r.aclose()

    asyncio.run(main())


def test_corrupt_keys_fail_the_apply_before_any_write(redis_server):
    """Keys of the wrong type or with a non-integer field (only a bug or an operator can do
    that) fail the script in its checks, so the counts, n and offset stay as they were. Before,
    the BITFIELD increments ran and the error came after them."""
    cid = "guard-corrupt"
    off, sent = keys.offsets_key(cid, 0), keys.sent_at_key(cid, 0)
    chunk = keys.counts_key(cid, 0, LAY.id, LAY.version, keys.LEVEL_ALL, 0, 0)
    side = keys.side_key(cid, 0, "quota:1")
    flat = LAY.pack({SPEC.key: np.ones((4, 5), dtype=np.int64)}, 20)

    async def body(store: CountStore):
        r = store.redis
        await r.delete(off, sent, chunk, side)
        assert (await store.apply_many(cid, [PartitionDelta(0, 0, {(LAY, None): flat}, 20,
                                                            expected=-1)]))[0].applied
        for corrupt, undo in ((r.hset(sent, "x", 1), r.delete(sent)),
                              (r.hset(off, "n", "lots"), r.hset(off, "n", 20)),
                              (r.hset(side, "7", "x"), r.delete(side)),
                              (r.lpush(side, "x"), r.delete(side))):
            await corrupt
            with pytest.raises(Exception, match="ldp-apply"):
                await store.apply_many(cid, [PartitionDelta(
                    0, 1, {(LAY, None): flat}, 20, expected=0, sent_at_max=5.0,
                    side={"quota:1": SideCounter({"7": 1})})])
            await undo
            assert await store.offset(cid, 0) == 0 and await store.n(cid, [0]) == 20
            got = await read_all(store, cid, LAY, [0])
            np.testing.assert_array_equal(got[SPEC.key], np.ones((4, 5)))
        await store.reset(cid)

    _run(redis_server.url, body)


def _quota_worker(tmp_path, cid: str, reports: int, spawn_worker):
    """A one-partition collection with a quota of ``reports`` per device per day, and a worker
    for it, ready: (collection config, worker)."""
    from ldpstream.config import load_config

    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=1,
                        marginals=[("sex", "Salary")], estimators=("castell",))
    doc = yaml.safe_load(open(path))
    doc["collections"][0]["device_quota"] = {"reports": reports, "window_s": 86400}
    yaml.safe_dump(doc, open(path, "w"))
    worker = spawn_worker(path)
    worker.wait_ready(60)
    return load_config(path).collections[cid], worker


async def _produce(bootstrap: str, topic: str, items: list[tuple[bytes, int | None]]) -> None:
    from aiokafka import AIOKafkaProducer

    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await prod.start()
    try:
        for value, ts in items:
            await (await prod.send(topic, value, partition=0, timestamp_ms=ts))
    finally:
        await prod.stop()


def _produce_and_count(bootstrap: str, redis_url: str, coll, items) -> tuple[int, int, int]:
    """Produce ``items`` to partition 0 of ``coll``; once the worker stored the last offset (or
    after 60 s): (n, reports in the all-time tensor, stored offset or -1)."""
    from ldpstream.agents.app import make_store

    async def run() -> tuple[int, int, int]:
        store = make_store(redis_url)
        try:
            await _produce(bootstrap, coll.topic, items)
            deadline = time.monotonic() + 60
            while await store.offsets(coll.id, 1) != {0: len(items) - 1} and \
                    time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)
            got = await read_all(store, coll.id, Layout.of(coll.version, coll.tensors()), 1)
            return await store.n(coll.id, 1), int(next(iter(got.values())).sum()), \
                (await store.offsets(coll.id, 1)).get(0, -1)
        finally:
            await store.close()

    return asyncio.run(run())


def test_far_future_timestamp_on_a_quota_collection(tmp_path, kafka_broker, redis_server,
                                                    spawn_worker, unique_name):
    """Finding 1: one message stamped near int64 max between valid ones. Before: the quota key's
    expiry overflowed PEXPIREAT after the BITFIELD increments ran (counts grew, n and offset did
    not) and the worker exited 1 in a loop. Now it is dead-lettered as bad_timestamp, every other
    report is counted exactly once and the worker stays up."""
    from ldpstream.producers.codec import encode_batch

    cid = unique_name
    coll, worker = _quota_worker(tmp_path, cid, 1000, spawn_worker)
    mech = coll.mechanism()
    rng = np.random.default_rng(3)

    def batch(dev: int) -> bytes:
        rep = np.stack([rng.integers(0, 2, 10), rng.integers(0, 2, 10)], axis=1)
        return encode_batch(cid, mech.version, rep, device_ids=np.full(10, dev, dtype=np.uint64))

    now_ms = int(time.time() * 1000)
    items = [(batch(d), now_ms) for d in range(20)] + [(batch(99), INT64_MAX - 5)] + \
        [(batch(d), now_ms) for d in range(20, 40)]

    n, total, stored = _produce_and_count(kafka_broker.bootstrap, redis_server.url, coll, items)
    assert stored == len(items) - 1, worker.log_tail()
    assert n == 400 and total == 400, (n, total)
    assert worker.proc.poll() is None, worker.log_tail()
    reasons = [r["reason"] for r in read_dlq(kafka_broker.bootstrap, topic=coll.topic)]
    assert reasons == ["bad_timestamp"]


def test_backdated_timestamps_do_not_buy_more_quota(tmp_path, kafka_broker, redis_server,
                                                    spawn_worker, unique_name):
    """Finding 7: one device, quota 10 per day, 100 messages of 10 reports each stamped one day
    apart into the past. Before: each landed in its own quota window (1,000 counted); now the
    window is the worker's clock: exactly 10 counted, 990 dead-lettered as over_quota."""
    from ldpstream.producers.codec import encode_batch

    cid = unique_name
    coll, worker = _quota_worker(tmp_path, cid, 10, spawn_worker)
    mech = coll.mechanism()
    rep = np.zeros((10, 2), dtype=np.int64)
    value = encode_batch(cid, mech.version, rep, device_ids=np.full(10, 7, dtype=np.uint64))
    now_ms = int(time.time() * 1000)
    items = [(value, now_ms - k * 86_400_000) for k in range(100)]

    n, _, stored = _produce_and_count(kafka_broker.bootstrap, redis_server.url, coll, items)
    assert stored == 99, worker.log_tail()
    assert n == 10
    over = [r for r in read_dlq(kafka_broker.bootstrap, topic=coll.topic)
            if r["reason"] == "over_quota"]
    assert len(over) == 99



def test_a_failed_apply_leaves_the_partition_to_the_breaker(tmp_path, kafka_broker, redis_server,
                                                            spawn_worker, unique_name):
    """An apply that fails for a reason other than Redis being away stops the worker *without*
    releasing its partitions, so the next owner processes them carefully (the poison-pill
    breaker). Before, the worker released them on its way out (exit 1, breaker not engaged), and
    every restart failed the same way."""
    import redis as sync_redis

    from ldpstream.producers.codec import encode_batch

    cid = unique_name
    coll, worker = _quota_worker(tmp_path, cid, 1000, spawn_worker)
    r = sync_redis.Redis.from_url(redis_server.url)
    try:
        r.hset(keys.sent_at_key(cid, 0), "corrupt", 1)   # fails every apply of partition 0
        value = encode_batch(cid, coll.mechanism().version, np.zeros((3, 2), dtype=np.int64),
                             device_ids=np.full(3, 5, dtype=np.uint64))
        asyncio.run(_produce(kafka_broker.bootstrap, coll.topic,
                             [(value, int(time.time() * 1000))]))
        worker.proc.wait(60)
        assert worker.proc.returncode != 0, worker.log_tail()
        assert "ldp-apply: corrupt" in worker.log_tail(200)
        assert r.hget(keys.side_key(cid, 0, "breaker"), "live") == b"1"  # held: next is careful
        assert r.hget(keys.offsets_key(cid, 0), "offset") is None     # nothing half-applied
    finally:
        r.delete(keys.sent_at_key(cid, 0))
        r.close()
