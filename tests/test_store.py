"""CountStore against a real redis-server (EmbeddedRedis): exactly-once apply, chunking, time
buckets at three levels with expiry, side counters, reads, estimates per window, reset. Prints the
apply time for ~10k nonzero cells."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from store_helpers import P, cells, read, read_all

from ldpstream.agents.store import keys
from ldpstream.agents.store.apply_delta import (
    PartitionDelta,
    SideCounter,
    SideLog,
    SidePatch,
    SideStaged,
    expand_levels,
)
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.layout import Layout
from ldpstream.dev.redis import EmbeddedRedis
from ldpstream.estimators.mechanism import TensorSpec
from ldpstream.redis_client import connect
from ldpstream.windows import COARSE_FACTOR, BucketPolicy, cover, parse_window

pytestmark = pytest.mark.pipeline


def run(coro_fn, url, **store_kw):
    async def main():
        client = connect(url)
        store = CountStore(client, **store_kw)
        try:
            return await coro_fn(store)
        finally:
            await store.close()
    return asyncio.run(asyncio.wait_for(main(), 120))


SPEC_A = TensorSpec("m:a|b", ("a", "b"), (4, 5), (0, 1))
SPEC_B = TensorSpec("m:c", ("c",), (7,), (2,))
LAY = Layout.of(0, [SPEC_A, SPEC_B])
POLICY = BucketPolicy(60.0, (parse_window("5m"), parse_window("1h"), parse_window("all")))


def test_apply_is_idempotent_on_replay(redis_url):
    async def body(store: CountStore):
        await store.reset("idem")
        d = {SPEC_A.key: np.arange(20).reshape(4, 5), SPEC_B.key: np.array([0, 0, 3, 0, 0, 0, 1])}
        assert await store.apply("idem", 0, 10, cells(LAY, d, 24), 24, sent_at_max=100.5) is True
        assert await store.apply("idem", 0, 10, cells(LAY, d, 24), 24) is False   # replay
        assert await store.apply("idem", 0, 9, cells(LAY, d, 24), 24) is False    # older offset
        got = await read_all(store, "idem", LAY)
        np.testing.assert_array_equal(got[SPEC_A.key], np.arange(20).reshape(4, 5))
        np.testing.assert_array_equal(got[SPEC_B.key], [0, 0, 3, 0, 0, 0, 1])
        assert got[SPEC_A.key].dtype == np.int64
        assert await store.n("idem", P) == 24
        assert await store.offsets("idem", P) == {0: 10}
        assert await store.offset("idem", 0) == 10 and await store.offset("idem", 1) is None
        assert await store.sent_at_max("idem", P) == 100.5
        assert await store.apply("idem", 0, 11, cells(LAY, d, 24), 24, sent_at_max=99.0) is True
        assert await store.n("idem", P) == 48
        assert await store.sent_at_max("idem", P) == 100.5             # max, not last
        np.testing.assert_array_equal(await read(store, "idem", LAY, SPEC_A),
                                      2 * np.arange(20).reshape(4, 5))
        # an empty delta still records the offset (a batch of rejected reports)
        assert await store.apply("idem", 3, 5, cells(LAY, {}, 0), 0) is True
        assert await store.offsets("idem", P) == {0: 11, 3: 5}
        assert await store.n("idem", P) == 48
    run(body, redis_url)


def test_missing_tensor_reads_zeros_and_unknown_collection_is_empty(redis_url):
    async def body(store: CountStore):
        z = await read(store, "nothing-here", LAY, SPEC_A)
        assert z.shape == (4, 5) and not z.any()
        assert await store.n("nothing-here", P) == 0
        assert await store.offsets("nothing-here", P) == {}
        assert await store.sent_at_max("nothing-here", P) is None
    run(body, redis_url)


def test_random_deltas_sum_exactly_across_chunks(redis_url):
    rng = np.random.default_rng(7)
    specs = [TensorSpec("m:x|y|z", ("x", "y", "z"), (9, 8, 7)),   # 504 cells
             TensorSpec("m:u", ("u",), (3,)),
             TensorSpec("rrba:v2:ab", ("a", "b"), (40, 25))]      # 1000 cells
    lay = Layout.of(0, specs)                                     # 1508 cells: 48 chunks of 32

    async def body(store: CountStore):
        await store.reset("sum")
        total = {s.key: np.zeros(s.shape, np.int64) for s in specs}
        n = 0
        for off in range(25):
            d = {}
            for s in specs:
                x = rng.integers(-3, 50, size=s.shape) * (rng.random(s.shape) < 0.3)
                d[s.key] = x
                total[s.key] += x
            k = int(rng.integers(0, 1000))
            n += k
            assert await store.apply("sum", off % 2, off, cells(lay, d, k), k) is True
            if off % 5 == 0:  # replays interleaved
                assert await store.apply("sum", off % 2, off, cells(lay, d, k), k) is False
        got = await read_all(store, "sum", lay)
        for s in specs:
            np.testing.assert_array_equal(got[s.key], total[s.key])
        assert await store.n("sum", P) == n
        found = [k async for k in store.redis.scan_iter(match="ldp:{sum#0}:c:*")]
        assert len(found) == 48  # chunked at 32 cells
        # large values and negative totals round-trip through BITFIELD i64
        big = {"m:u": np.array([2**40, -(2**35), 1])}
        await store.apply("sum", 9, 0, cells(lay, big, 0), 0)
        np.testing.assert_array_equal(await read(store, "sum", lay, specs[1]),
                                      total["m:u"] + big["m:u"])
        assert await store.reset("sum") >= 2 * 48 + 3
        assert not (await read(store, "sum", lay, specs[0])).any()
    run(body, redis_url, chunk_cells=32)


def test_more_than_1000_ops_in_one_chunk(redis_url):
    spec = TensorSpec("m:big", ("a", "b"), (100, 60))
    lay = Layout.of(0, [spec])

    async def body(store: CountStore):
        await store.reset("ops")
        d = np.arange(1, 6001).reshape(100, 60)  # 6000 nonzero cells -> 7 BITFIELD calls
        assert await store.apply("ops", 0, 0, cells(lay, {spec.key: d}, 1), 1)
        np.testing.assert_array_equal(await read(store, "ops", lay, spec), d)
    run(body, redis_url)


def test_concurrent_partitions_and_replays(redis_url):
    spec = TensorSpec("m:p", ("a", "b"), (16, 16))
    lay = Layout.of(0, [spec])
    rng = np.random.default_rng(3)
    batches = {p: [rng.integers(0, 5, size=(16, 16)) for _ in range(30)] for p in range(2)}

    async def body(store: CountStore):
        await store.reset("conc")
        store2 = CountStore(connect(redis_url), chunk_cells=64)  # a second worker

        async def partition(st: CountStore, p: int) -> int:
            applied = 0
            for off, d in enumerate(batches[p]):
                applied += await st.apply("conc", p, off, cells(lay, {spec.key: d}, 100), 100)
                # a second worker replays the same delta (rebalance): must be skipped
                applied += await store2.apply("conc", p, off, cells(lay, {spec.key: d}, 100), 100)
            return applied

        try:
            counts = await asyncio.gather(partition(store, 0), partition(store, 1))
        finally:
            await store2.close()
        assert counts == [30, 30]
        expect = sum(batches[0]) + sum(batches[1])
        np.testing.assert_array_equal(await read(store, "conc", lay, spec), expect)
        assert await store.offsets("conc", P) == {0: 29, 1: 29}
        assert await store.n("conc", P) == 6000
    run(body, redis_url, chunk_cells=64)


def test_buckets_at_three_levels_with_expiry(redis_url):
    """A delta in fine bucket b lands in f:b, h:b//60 and a:0; fine and coarse keys expire at the
    bucket's end + retention (deterministic); late deltas (bucket None) only in all-time; a window
    read through cover() equals the sum of its fine buckets."""
    rng = np.random.default_rng(5)
    now_b = int(time.time() // 60)
    buckets = [now_b - k for k in (0, 1, 2, 59, 60, 61, 100, 118)] + [None]  # kept 121 buckets
    deltas = {b: {SPEC_A.key: rng.integers(0, 9, (4, 5)), SPEC_B.key: rng.integers(0, 9, 7)}
              for b in buckets}

    async def body(store: CountStore):
        await store.reset("bk")
        items = {(LAY, b): LAY.pack(d, 10) for b, d in deltas.items()}
        (res,) = await store.apply_many("bk", [PartitionDelta(1, 0, items, 90, -1)], POLICY)
        assert res.applied
        fine = [b for b in buckets if b is not None]
        got = await store.read_cells("bk", LAY, [(1, keys.LEVEL_FINE, b) for b in fine])
        for b in fine:
            np.testing.assert_array_equal(got[(1, "f", b)], LAY.pack(deltas[b], 10))
        # coarse: the sum of the fine buckets inside it
        for c in sorted({b // COARSE_FACTOR for b in fine}):
            (cc,) = (await store.read_cells("bk", LAY, [(1, "h", c)])).values()
            want = sum(LAY.pack(deltas[b], 10) for b in fine if b // COARSE_FACTOR == c)
            np.testing.assert_array_equal(cc, want)
        allt = await read_all(store, "bk", LAY)
        for s in LAY.specs:
            np.testing.assert_array_equal(allt[s.key], sum(d[s.key] for d in deltas.values()))
        heads = await store.read_heads("bk", LAY, [(1, "f", now_b), (1, "a", 0), (0, "a", 0)])
        assert heads == {(1, "f", now_b): 10, (1, "a", 0): 90, (0, "a", 0): 0}
        # expiry: fine keys at (b+1)*60 + retention, coarse at (c+1)*3600 + retention, all never
        fkey = keys.counts_key("bk", 1, LAY.id, 0, "f", now_b, 0)
        ckey = keys.counts_key("bk", 1, LAY.id, 0, "h", now_b // 60, 0)
        akey = keys.counts_key("bk", 1, LAY.id, 0, "a", 0, 0)
        exp_f = await store.redis.pexpiretime(fkey)
        assert exp_f == int(np.ceil(POLICY.fine_expire_at(now_b) * 1000))
        assert await store.redis.pexpiretime(ckey) == int(
            np.ceil(POLICY.coarse_expire_at(now_b // 60) * 1000))
        assert await store.redis.pexpiretime(akey) == -1
        # a range read through cover() equals the sum of its fine buckets
        lo, hi = now_b - 110, now_b
        f, c = cover(lo, hi)
        parts = [(1, "f", b) for b in f] + [(1, "h", x) for x in c]
        total = sum((await store.read_cells("bk", LAY, parts)).values())
        want = sum(LAY.pack(deltas[b], 10) for b in fine if lo <= b <= hi)
        np.testing.assert_array_equal(total, want)
    run(body, redis_url)


def test_expired_buckets_are_gone(redis_url):
    """A bucket whose retention ended is deleted by Redis (PEXPIREAT in the past), the all-time
    tensor keeps the counts: memory stays bounded by the retention."""
    policy = BucketPolicy(1.0, (parse_window("2s"), parse_window("all")))
    old_b = int(time.time()) - 200  # retention is 2*2 + 1 = 5 s; coarse buckets are 60 s

    async def body(store: CountStore):
        await store.reset("exp")
        d = {SPEC_B.key: np.arange(7)}
        ok = await store.apply("exp", 0, 0, {(LAY, old_b): LAY.pack(d, 3)}, 3, policy=policy)
        assert ok
        names = sorted([k.decode() async for k in store.redis.scan_iter(match="ldp:{exp#0}:c:*")])
        assert names == [keys.counts_key("exp", 0, LAY.id, 0, "a", 0, 0)]
        np.testing.assert_array_equal((await read_all(store, "exp", LAY))[SPEC_B.key], np.arange(7))
    run(body, redis_url)


def test_expand_levels_rejects_bad_deltas():
    with pytest.raises(ValueError, match="cells"):
        expand_levels({(LAY, None): np.zeros(3, np.int64)}, None)
    with pytest.raises(ValueError, match="BucketPolicy"):
        expand_levels({(LAY, 5): np.zeros(LAY.size, np.int64)}, None)


def test_side_counters_apply_with_the_counts(redis_url):
    async def body(store: CountStore):
        await store.reset("side")
        exp = time.time() + 3600
        side = {"quota:7": SideCounter({"dev1": 3, "dev2": 5}, exp)}
        d = PartitionDelta(0, 0, cells(LAY, {}, 8), 8, -1, None, side)
        assert (await store.apply_many("side", [d]))[0].applied
        assert (await store.apply_many("side", [d]))[0].status.value == "replayed"  # not again
        key = keys.side_key("side", 0, "quota:7")
        assert await store.redis.hgetall(key) == {b"dev1": b"3", b"dev2": b"5"}
        assert await store.redis.pexpiretime(key) == int(np.ceil(exp * 1000))
    run(body, redis_url)


def test_side_logs_append_replace_and_refuse_torn_words(redis_url):
    """A side log (agents/store/device_memo.py) is appended to, or replaced, with the counts; bytes
    that are not whole int64 words are refused before anything is written."""
    async def body(store: CountStore):
        await store.reset("slog")
        key = keys.side_key("slog", 0, "memo:x:1")
        a, b = np.arange(3, dtype="<i8").tobytes(), np.arange(2, dtype="<i8").tobytes()

        def delta(offset: int, log: SideLog) -> PartitionDelta:
            return PartitionDelta(0, offset, cells(LAY, {}, 1), 1, offset - 1, None,
                                  {"memo:x:1": log})
        assert (await store.apply_many("slog", [delta(0, SideLog(a))]))[0].applied
        assert (await store.apply_many("slog", [delta(1, SideLog(b))]))[0].applied
        assert await store.read_side_bytes("slog", 0, "memo:x:1") == a + b
        exp = time.time() + 60
        assert (await store.apply_many("slog", [delta(2, SideLog(b, True, exp))]))[0].applied
        assert await store.redis.get(key) == b
        assert await store.redis.pexpiretime(key) == int(np.ceil(exp * 1000))
        with pytest.raises(Exception, match="malformed side log"):
            await store.apply_many("slog", [delta(3, SideLog(b"1234567"))])
        assert await store.redis.get(key) == b and await store.offsets("slog", P) == {0: 2}
    run(body, redis_url)


def test_device_segments_rewritten_in_place_staged_and_read_back(redis_url):
    """A device state segment (agents/store/memo_log.py): rows rewritten in place and bytes
    appended with the counts (``~``), a new segment staged beforehand and RENAMEd by the apply
    (a refused delta deletes its staging key), a finished segment trimmed of APPEND's spare room
    (``^``), rows read back by position; a rewrite beyond the segment is refused before anything
    is written."""
    from ldpstream.agents.store.memo_log import patch_blob

    async def body(store: CountStore):
        await store.reset("sseg")
        key = keys.side_key("sseg", 0, "memo:x:1")
        a = np.arange(4, dtype="<i4").tobytes() * 2

        def delta(offset: int, side: dict) -> PartitionDelta:
            return PartitionDelta(0, offset, cells(LAY, {}, 1), 1, offset - 1, None, side)

        def rows(*vals: int) -> np.ndarray:
            return np.array([vals], dtype="<i4").view(np.uint8)

        assert (await store.apply_many("sseg", [delta(0, {"memo:x:1": SideStaged(a, 2e9)})]))[
            0].applied
        assert await store.redis.get(key) == a and await store.redis.pexpiretime(key) == 2e12
        assert not await store.redis.keys("*stage*")
        patch = patch_blob(np.arange(2, dtype="<i4").tobytes(), 8, np.array([8], np.uint32),
                           rows(7, 9))
        assert (await store.apply_many("sseg", [delta(1, {"memo:x:1": SidePatch(patch)})]))[
            0].applied
        got = np.frombuffer(await store.redis.get(key), dtype="<i4").tolist()
        assert got == [0, 1, 7, 9, 0, 1, 2, 3, 0, 1]
        back = await store.read_side_rows("sseg", 0, "memo:x:1", 8,
                                          np.array([8, 36], dtype="<u4").tobytes())
        assert np.frombuffer(back, dtype="<i4").tolist() == [7, 9, 1, 0]   # past the end: zeros
        grown = np.arange(64 << 10, dtype="<i4").tobytes()   # APPENDed: room kept for growth
        assert (await store.apply_many("sseg", [delta(2, {"memo:x:1": SidePatch(
            patch_blob(grown, 8, np.empty(0, np.uint32), np.empty((0, 8), np.uint8)))})]))[
            0].applied
        before = await store.redis.memory_usage(key, samples=0)
        assert (await store.apply_many("sseg", [delta(3, {"memo:x:1": SidePatch(
            patch_blob(b"", 8, np.empty(0, np.uint32), np.empty((0, 8), np.uint8), True))})]))[
            0].applied
        assert await store.redis.get(key) == bytes(np.array(got, "<i4").tobytes()) + grown
        assert await store.redis.memory_usage(key, samples=0) < before - 100_000
        assert not await store.redis.keys("*trim*")
        await store.redis.set(key, np.array(got, "<i4").tobytes())
        res = await store.apply_many("sseg", [delta(5, {"memo:x:2": SideStaged(a)})])
        assert res[0].status.value == "conflict" and not await store.redis.keys("*stage*")
        with pytest.raises(Exception, match="side patch beyond"):
            await store.apply_many("sseg", [delta(4, {"memo:x:1": SidePatch(
                patch_blob(b"", 8, np.array([40], np.uint32), rows(1, 1)))})])
        assert await store.offsets("sseg", P) == {0: 3} and len(await store.redis.get(key)) == 40
    run(body, redis_url)


def test_staged_segment_and_apply_land_when_redis_forgot_the_script(redis_url):
    """The staged strings and the apply script go in one round trip on one server (one AOF
    fsync: redis_client.py ``run_script_after_sets``); a server that forgot the script (restart,
    promoted replica) answers NOSCRIPT after taking the staged string, and the apply runs by
    EVAL: the segment lands once, the staging key is consumed, the offset moves."""
    async def body(store: CountStore):
        await store.reset("snos")
        key = keys.side_key("snos", 0, "memo:x:1")
        data = np.arange(1 << 16, dtype="<i4").tobytes()
        for offset in (0, 1):
            if isinstance(store.redis, RedisCluster):
                await store.redis.execute_command("SCRIPT FLUSH",
                                                  target_nodes=RedisCluster.ALL_NODES)
            else:
                await store.redis.script_flush()
            res = await store.apply_many("snos", [PartitionDelta(
                0, offset, cells(LAY, {}, 1), 1, offset - 1, None,
                {"memo:x:1": SideStaged(memoryview(np.frombuffer(data, np.uint8)), 2e9)})])
            assert res[0].applied
            assert await store.redis.get(key) == data
            assert not await store.redis.keys("*stage*")
        assert await store.offsets("snos", P) == {0: 1} and await store.n("snos", P) == 2
    run(body, redis_url)


def test_estimates_per_window(redis_url):
    async def body(store: CountStore):
        await store.reset("est")
        assert await store.get_estimate("est", "5m", "truncated", ("a", "b")) is None
        now = time.time()
        await store.put_estimates("est", [
            {"window": "5m", "method": "truncated", "attrs": ["a", "b"],
             "cells": np.full((2, 2), 0.25), "n": 29, "updated_at": now, "bad": float("nan")},
            {"window": "all", "method": "ibu", "attrs": ["a", "b"], "n": 1}])
        latest = await store.get_estimate("est", "5m", "truncated", ["a", "b"])
        assert latest["n"] == 29 and latest["cells"] == [[0.25, 0.25], [0.25, 0.25]]
        assert latest["bad"] is None and latest["updated_at"] == now
        assert await store.get_estimate("est", "1h", "truncated", ("a", "b")) is None
        assert (await store.get_estimate("est", "all", "ibu", ("a", "b")))["updated_at"] >= now
        found = sorted([k.decode() async for k in store.redis.scan_iter(match="ldp:{est|*")])
        # one hash tag per (collection, window, method, marginal): no hot slot
        assert found == ["ldp:{est|5m|truncated|a|b}:est", "ldp:{est|all|ibu|a|b}:est"]
    run(body, redis_url)


def test_reset_keeps_offsets_on_request(redis_url):
    async def body(store: CountStore):
        await store.reset("rk")
        await store.apply("rk", 2, 7, cells(LAY, {SPEC_B.key: np.ones(7, int)}, 7), 7)
        await store.put_estimates("rk", [{"window": "all", "method": "castell", "attrs": ["c"],
                                          "n": 7}])
        assert await store.reset("rk", keep_offsets=True) >= 2
        assert await store.offsets("rk", P) == {2: 7}
        assert await store.n("rk", P) == 0
        assert not (await read(store, "rk", LAY, SPEC_B)).any()
        assert await store.get_estimate("rk", "all", "castell", ("c",)) is None
        await store.reset("rk")
        assert await store.offsets("rk", P) == {}
    run(body, redis_url)


def test_survives_redis_restart():
    spec = TensorSpec("m:r", ("a",), (4,))

    async def body(url: str, restart) -> None:
        store = CountStore(aioredis.from_url(url))
        lay = Layout.of(0, [spec])
        await store.apply("rs", 0, 1, cells(lay, {spec.key: np.array([1, 2, 3, 4])}, 10), 10)
        restart()
        # the script cache is empty after a restart: register_script reloads it (NOSCRIPT)
        for _ in range(50):
            try:
                ok = await store.apply("rs", 0, 2, cells(lay, {spec.key: np.array([1, 1, 1, 1])}, 4), 4)
                break
            except (ConnectionError, OSError, aioredis.ConnectionError):
                await asyncio.sleep(0.1)
        assert ok
        assert await store.apply("rs", 0, 1, cells(lay, {spec.key: np.array([1, 2, 3, 4])}, 10),
                                 10) is False
        np.testing.assert_array_equal(await read(store, "rs", lay, spec), [2, 3, 4, 5])
        assert await store.n("rs", P) == 14
        await store.close()

    with EmbeddedRedis() as r:
        asyncio.run(body(r.url, r.restart))


@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
def test_apply_time_10k_cells(appendfsync, capsys):
    """~10k nonzero cells per apply (one 100x100 tensor, dense delta), and a delta shaped like the
    Adult demo (4 marginals, 130 cells); prints client and server (INFO commandstats) timings.
    ``always`` (the embedded default) adds one AOF fsync per apply to the client-side time."""
    spec = TensorSpec("m:t", ("a", "b"), (100, 100))
    demo = [TensorSpec("m:sex|Salary", ("sex", "Salary"), (2, 2)),
            TensorSpec("m:race|sex", ("race", "sex"), (5, 2)),
            TensorSpec("m:education|Salary", ("education", "Salary"), (16, 2)),
            TensorSpec("m:relationship|marital-status|sex", ("r", "m", "s"), (6, 7, 2))]
    rng = np.random.default_rng(11)
    lay, lay_demo = Layout.of(0, [spec]), Layout.of(0, demo)

    async def evalsha_usec(store: CountStore) -> tuple[int, int]:
        st = (await store.redis.info("commandstats")).get("cmdstat_evalsha", {})
        return int(st.get("calls", 0)), int(st.get("usec", 0))

    async def body(store: CountStore):
        await store.reset("perf")
        d = rng.integers(1, 9, size=(100, 100))
        await store.apply("perf", 0, 0, cells(lay, {spec.key: d}, 10_000), 10_000)  # warm up (script load)
        times = []
        c0, u0 = await evalsha_usec(store)
        for off in range(1, 11):
            t = time.perf_counter()
            assert await store.apply("perf", 0, off, cells(lay, {spec.key: d}, 10_000), 10_000)
            times.append(time.perf_counter() - t)
        c1, u1 = await evalsha_usec(store)
        server = (u1 - u0) / max(1, c1 - c0) / 1e6
        t = time.perf_counter()
        assert not await store.apply("perf", 0, 5, cells(lay, {spec.key: d}, 10_000), 10_000)
        replay = time.perf_counter() - t
        np.testing.assert_array_equal(await read(store, "perf", lay, spec), 11 * d)
        t = time.perf_counter()
        for _ in range(10):
            await read(store, "perf", lay, spec, [0])
        read_s = (time.perf_counter() - t) / 10
        small = []
        c0, u0 = await evalsha_usec(store)
        for off in range(20):
            dd = {s.key: rng.multinomial(20_000 // 4, np.ones(s.size) / s.size).reshape(s.shape)
                  for s in demo}
            t = time.perf_counter()
            assert await store.apply("perf", 1, off, cells(lay_demo, dd, 20_000), 20_000)
            small.append(time.perf_counter() - t)
        c1, u1 = await evalsha_usec(store)
        small_server = (u1 - u0) / max(1, c1 - c0) / 1e6
        return (float(np.median(times)), server, replay, read_s, float(np.median(small)),
                small_server)

    with EmbeddedRedis(appendfsync=appendfsync) as server_:
        med, server, replay, read_s, small, small_server = run(body, server_.url)
    with capsys.disabled():
        print(f"\n[store appendfsync={appendfsync}] apply 10,000 nonzero cells: median {med * 1e3:.1f} ms client-side "
              f"({10_000 / med / 1e3:.0f}k cells/s), {server * 1e3:.1f} ms inside Redis; "
              f"skipped replay {replay * 1e3:.1f} ms; read 10,000 cells {read_s * 1e3:.2f} ms; "
              f"Adult-demo delta (130 cells, 20k reports) {small * 1e3:.2f} ms client-side, "
              f"{small_server * 1e3:.2f} ms inside Redis")
    assert med < 1.0  # generous: shared 2-core machine
